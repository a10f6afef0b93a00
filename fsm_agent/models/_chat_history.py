"""The run's history as Chat Completions messages (no SDK needed).

``RunResult.messages`` is the engine's internal form: Chat Completions messages, except
that a tool message whose result held images or files has a *list* ``content`` (its JSON
text, then ``image_url``/``file`` parts; see ``core/content.py``). Chat Completions tool
messages carry text only, so that list is not valid there. :func:`to_openai_chat` turns
the history into what the Chat adapter sends: tool messages as text (the placeholders
name the media), and with ``tool_media="user_message"`` the media follow the tool results
in one user message, the shape OpenAI accepts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from fsm_agent._core.content import part_media

__all__ = ["CHAT_KEYS", "REASONING_KEYS", "TOOL_MEDIA", "to_openai_chat"]

Message = dict[str, Any]

#: The keys of a message Chat Completions takes.
CHAT_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")
#: Where compatible servers put a reply's reasoning (sent back only when asked).
REASONING_KEYS = ("reasoning_content", "reasoning", "reasoning_details")
TOOL_MEDIA = ("text", "user_message")
_MEDIA_INTRO = "The images and files returned by the tool calls above, in order:"


def to_openai_chat(
    messages: Iterable[Mapping[str, Any]],
    *,
    tool_media: str = "text",
    send_reasoning: Collection[str] = (),
) -> list[Message]:
    """``messages`` (a run's history) as a Chat Completions ``messages`` list that
    :func:`~fsm_agent.models.check_openai_chat` accepts.

    ``tool_media``: ``"text"`` (default) sends tool results as their text only, media
    named by their placeholders; ``"user_message"`` also sends the media, in one user
    message after the tool results. ``send_reasoning`` names the reasoning keys of
    assistant messages to keep (``REASONING_KEYS``; DeepSeek wants
    ``reasoning_content`` back in a tool loop). Other keys are dropped."""
    if tool_media not in TOOL_MEDIA:
        raise ValueError(f"tool_media must be one of {', '.join(TOOL_MEDIA)}, got {tool_media!r}")
    unknown = sorted(set(send_reasoning) - set(REASONING_KEYS))
    if isinstance(send_reasoning, str) or unknown:
        raise ValueError(
            f"send_reasoning names keys among {', '.join(REASONING_KEYS)}, got {send_reasoning!r}"
        )
    out: list[Any] = []
    media: list[Any] = []
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(m)  # not a message: left for the validator to name
            continue
        role = m.get("role")
        if role != "tool" and media:
            out.append(_media_message(media, tool_media))
            media = []
        if role == "assistant":
            out.append(_assistant(m, send_reasoning))
        elif role == "tool":
            out.append(_tool(m, media))
        else:
            out.append({k: m[k] for k in CHAT_KEYS if k in m})
    if media:
        out.append(_media_message(media, tool_media))
    return [x for x in out if x is not None]


def _assistant(m: Mapping[str, Any], send_reasoning: Collection[str]) -> Message:
    out = {k: m[k] for k in CHAT_KEYS if k in m}
    out.update((k, m[k]) for k in send_reasoning if m.get(k) is not None)
    extra = m.get("tool_call_extra_content")
    if isinstance(extra, Mapping) and isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [
            {**c, "extra_content": extra[c.get("id")]}
            if isinstance(c, Mapping) and c.get("id") in extra
            else c
            for c in out["tool_calls"]
        ]
    return out


def _tool(m: Mapping[str, Any], media: list[Any]) -> Message:
    """A tool message as text; its media parts wait in ``media`` for the user message."""
    out = {k: m[k] for k in CHAT_KEYS if k in m}
    content = m.get("content")
    if isinstance(content, list):
        texts = [
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        ]
        out["content"] = "\n".join(texts)
        media.extend(p for p in content if part_media(p) is not None)
    return out


def _media_message(media: list[Any], tool_media: str) -> Message | None:
    if tool_media != "user_message":
        return None
    return {"role": "user", "content": [{"type": "text", "text": _MEDIA_INTRO}, *media]}
