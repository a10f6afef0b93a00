"""Anthropic Messages: ``tool_use`` / ``tool_result`` blocks keyed by ``tool_use_id``.

Translation out: system messages become the ``system`` parameter; each assistant
message becomes text and ``tool_use`` blocks; consecutive ``tool`` messages become one
user turn of ``tool_result`` blocks (first), followed by any user text of that turn.
Translation in: text blocks join into ``content``, ``tool_use`` blocks become calls whose
``input`` object is the JSON ``arguments``. A block without an id becomes a call with
``id: ""``, which the machine stops on before anything runs.

Extended thinking: a reply holding ``thinking`` or ``redacted_thinking`` blocks keeps its
``content`` verbatim in the assistant message under ``anthropic_content`` (signatures
included), and that turn is sent back exactly so, in its order: Anthropic refuses a
tool-result turn whose assistant turn lost its thinking. (If the history's calls no
longer match those blocks, the turn is rebuilt with the thinking blocks first.) With
``options={"thinking": {"type": "enabled", ...}}`` the validator checks the thinking is
there before sending.

Tool results that hold images or files (see :mod:`fsm_agent._core.content`) become
``image`` and ``document`` blocks inside the ``tool_result`` (PDF and plain text
documents; another file type is described in text, which Anthropic cannot read natively).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Anthropic adapter needs the anthropic SDK: pip install 'fsm-agent[anthropic]'"
    ) from exc

from fsm_agent._core.content import split_data_url
from fsm_agent.models._adapter import AsyncCall, Message, ProviderCodec, SyncCall
from fsm_agent.models._common import (
    ModelResponseError,
    SdkErrors,
    need,
    parse_json_object,
    whole,
)
from fsm_agent.models._stream import AnthropicFold, Fold
from fsm_agent.models._validate import check_anthropic_messages

__all__ = ["AnthropicModel", "AsyncAnthropicModel"]

_FINISHED = ("end_turn", "tool_use", "stop_sequence")
_CUT = {
    "max_tokens": "the reply was cut at max_tokens, so its answer or tool input is incomplete",
    "model_context_window_exceeded": "the reply was cut at the context window limit",
    "refusal": "the model refused to answer",
    "pause_turn": "the provider paused a long turn (server tools are not supported here)",
}
_THINKING = ("thinking", "redacted_thinking")
#: The assistant message key holding a reply's content blocks, verbatim.
CONTENT_KEY = "anthropic_content"


def _text_blocks(content: Any) -> list[Message]:
    """Message content as Anthropic blocks: text as text, images and files (Chat
    Completions parts with ``data:`` URLs) as image and document blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return _part_blocks(content)
    return []


def _is_error(content: Any) -> bool:
    """Our tool results are JSON with ``ok``; tell Anthropic which ones failed."""
    if isinstance(content, list):  # text part first, then media
        first = content[0] if content else None
        content = first.get("text") if isinstance(first, Mapping) else None
    parsed = parse_json_object(content) if isinstance(content, str) else None
    return parsed is not None and parsed.get("ok") is False


def _media_block(media_type: str, data: str) -> Message:
    if media_type.startswith("image/"):
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    if media_type == "application/pdf":
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "document", "source": source}
    if media_type == "text/plain":
        try:
            text = base64.b64decode(data, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            text = None
        if text is not None:
            source = {"type": "text", "media_type": media_type, "data": text}
            return {"type": "document", "source": source}
    return {
        "type": "text",
        "text": f"(a {media_type} file Anthropic cannot read natively was left out)",
    }


def _part_blocks(parts: list[Any]) -> list[Any]:
    blocks: list[Any] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            blocks.append({"type": "text", "text": part.get("text")})
            continue
        inner = part.get(kind) if kind in ("image_url", "file") else None
        url = (inner.get("url") or inner.get("file_data")) if isinstance(inner, Mapping) else None
        split = split_data_url(url)
        blocks.append(_media_block(*split) if split else part)
    return blocks


def _result_content(content: Any) -> Any:
    """A tool message's content as ``tool_result`` content: text, or text and media blocks."""
    return _part_blocks(content) if isinstance(content, list) else content


def _assistant_blocks(m: Mapping[str, Any]) -> list[Any]:
    calls = [c for c in m.get("tool_calls") or () if isinstance(c, Mapping)]
    recorded = m.get(CONTENT_KEY)
    if isinstance(recorded, list):
        ids = [
            b.get("id") for b in recorded if isinstance(b, Mapping) and b.get("type") == "tool_use"
        ]
        if ids == [c.get("id") for c in calls]:
            return list(recorded)
    thinking = [b for b in recorded or () if isinstance(b, Mapping) and b.get("type") in _THINKING]
    blocks: list[Any] = [*thinking, *_text_blocks(m.get("content"))]
    for call in calls:
        fn = call.get("function") or {}
        # Calls refused as invalid_arguments may carry non-object JSON; the tool_use
        # must still be an object, and its result already says what was wrong.
        args = parse_json_object(fn.get("arguments"))
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": fn.get("name"),
                "input": args if args is not None else {},
            }
        )
    return blocks


def to_anthropic(messages: list[Message]) -> tuple[str, list[Message]]:
    """The ``system`` text and the ``messages`` list of an Anthropic request."""
    system: list[str] = []
    out: list[Message] = []

    def add(role: Any, blocks: list[Message]) -> None:
        if out and out[-1]["role"] == role:  # one turn per role, as the API wants
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role in ("system", "developer"):
            system.extend(b["text"] for b in _text_blocks(content) if "text" in b)
        elif role == "assistant":
            add("assistant", _assistant_blocks(m))
        elif role == "tool":
            block: Message = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id"),
                "content": _result_content(content),
            }
            if _is_error(content):
                block["is_error"] = True
            add("user", [block])
        else:
            add(role, _text_blocks(content))
    return "\n\n".join(system), out


def to_tools(tool_specs: list[Message]) -> list[Message]:
    return [
        {
            "name": s["function"]["name"],
            "description": s["function"].get("description") or "",
            "input_schema": s["function"].get("parameters") or {"type": "object"},
        }
        for s in tool_specs
    ]


class _AnthropicCodec(ProviderCodec):
    provider = "anthropic"
    errors = SdkErrors(anthropic.APIStatusError, anthropic.APIConnectionError)
    max_tokens: int

    @property
    def thinking(self) -> bool:
        """Whether requests enable extended thinking (then every tool-answering turn
        must send the thinking back)."""
        config = self.options.get("thinking")
        return isinstance(config, Mapping) and config.get("type") == "enabled"

    def build_request(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        system, out = to_anthropic(messages)
        request: Message = {
            "max_tokens": self.max_tokens,
            **self.options,
            "model": self.model,
            "messages": self.checked(out, check_anthropic_messages(out, thinking=self.thinking)),
        }
        if system:
            request["system"] = system
        if tool_specs:
            request["tools"] = to_tools(tool_specs)
        return request

    def fold(self) -> Fold:
        return AnthropicFold()

    def read_reply(
        self, body: Message, messages: list[Message], tool_specs: list[Message] | None = None
    ) -> Message:
        p = self.provider
        if body.get("type") != "message" or body.get("role") != "assistant":
            raise ModelResponseError(
                f"{p}: expected an assistant message, got type "
                f"{body.get('type')!r} role {body.get('role')!r}"
            )
        stop = body.get("stop_reason")
        if stop in _CUT:
            raise ModelResponseError(f"{p}: stop_reason {stop!r}: {_CUT[stop]}")
        if stop not in _FINISHED:
            raise ModelResponseError(
                f"{p}: unknown stop_reason {stop!r} (expected one of {', '.join(_FINISHED)})"
            )
        content = need(body, "content", list, p)
        texts, calls = _texts_and_calls(content, p)
        # No check_fresh_ids here: Anthropic pairs results turn by turn, and real requests
        # reusing an earlier turn's tool_use id were accepted (tests/data/providers).
        reply: Message = {
            "role": "assistant",
            "content": "".join(texts) if texts else (None if calls else ""),
        }
        if calls:
            reply["tool_calls"] = calls
        if any(isinstance(b, Mapping) and b.get("type") in _THINKING for b in content):
            reply[CONTENT_KEY] = content
        usage = body.get("usage")
        model = self.reply_model(body)
        if isinstance(usage, Mapping):
            reply["usage"] = self.usage(
                model,
                input_tokens=whole(usage.get("input_tokens")),
                output_tokens=whole(usage.get("output_tokens")),
                cached_tokens=whole(usage.get("cache_read_input_tokens")),
                cache_write_tokens=whole(usage.get("cache_creation_input_tokens")),
            )
        # No usage reported: the reply carries none (unknown, never zeros), so the
        # loop counts it as unmetered and a token or cost budget stops the run.
        reply["provider"] = {
            "api": p,
            "id": body.get("id"),
            "model": body.get("model"),
            "stop_reason": stop,
        }
        return reply


def _texts_and_calls(content: list[Any], p: str) -> tuple[list[str], list[Message]]:
    """The reply's text blocks and its tool_use blocks as Chat-shaped calls; thinking
    blocks are passed over here (the caller keeps the whole content), anything else is
    refused."""
    texts: list[str] = []
    calls: list[Message] = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input"), ensure_ascii=False)
            calls.append(
                {
                    "id": block.get("id") or "",
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        elif kind not in _THINKING:
            raise ModelResponseError(f"{p}: content[{i}] has unknown type {kind!r}")
    return texts, calls


def _max_tokens(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"anthropic: max_tokens must be a whole number >= 1, got {value!r}")
    return value


class AnthropicModel(SyncCall, _AnthropicCodec):
    """An Anthropic Messages model: ``AnthropicModel("claude-sonnet-4-5", max_tokens=1024)``.

    ``client`` is an ``anthropic.Anthropic`` (its own retries are switched off), or pass
    ``base_url``/``api_key``. Other arguments as :class:`~fsm_agent.models.OpenAIChatModel`.
    """

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.Anthropic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.max_tokens = _max_tokens(max_tokens)
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
        )

    def _send(self, request: Message, timeout: float) -> Any:
        return self.client.messages.with_raw_response.create(**request, timeout=timeout)

    def _open_stream(self, request: Message, timeout: float) -> Any:
        return self.client.messages.with_streaming_response.create(**request, timeout=timeout)


class AsyncAnthropicModel(AsyncCall, _AnthropicCodec):
    """The async twin of :class:`AnthropicModel`."""

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.max_tokens = _max_tokens(max_tokens)
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
        )

    async def _asend(self, request: Message, timeout: float) -> Any:
        return await self.client.messages.with_raw_response.create(**request, timeout=timeout)

    def _aopen_stream(self, request: Message, timeout: float) -> Any:
        return self.client.messages.with_streaming_response.create(**request, timeout=timeout)
