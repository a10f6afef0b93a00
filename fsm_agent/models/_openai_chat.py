"""OpenAI Chat Completions, and every server that speaks it (vLLM, llama.cpp server,
Ollama, LiteLLM proxy, OpenRouter, DeepSeek, Gemini's compatible endpoint, ...): pass
``base_url``.

Our internal shape *is* Chat Completions, so the translation is thin; what this adapter
adds is the checking: the history is validated before sending, the body is read
field by field, and an unknown or truncating ``finish_reason`` raises instead of
becoming a half answer. Tool calls are passed through as the provider wrote them, so
the machine's own rules judge them (a missing id → ``protocol_error/missing_tool_call_id``,
non-JSON arguments → an ``invalid_arguments`` observation, or a stop under ``strict``).

What compatible servers do differently is handled explicitly, and recorded in the reply
(so in the history and the trace's ``decision`` event) under these keys:

``reasoning_content`` / ``reasoning`` / ``reasoning_details``
    the server's reasoning, kept verbatim. Those named in ``send_reasoning`` (default
    ``reasoning_content``, which DeepSeek's thinking mode requires back within a tool
    loop, and ``reasoning_details``, OpenRouter's) go back on the assistant message;
    ``reasoning`` stays out of requests by default (Groq refuses it as input).
``tool_call_extra_content``
    ``{call id: extra_content}``: per-call data such as Gemini's thought signatures,
    sent back on the same calls.
``normalised``
    what the adapter changed: a call without an ``arguments`` field read as ``{}``
    (only when the tool's schema accepts an empty object), ids minted by
    ``synthesize_missing_ids``.
``synthesized_ids``
    ``{minted id: id the server sent}``; requests carry the server's own ids again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

try:
    import openai
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the OpenAI adapters need the openai SDK: pip install 'fsm-agent[openai]'"
    ) from exc

from jsonschema import Draft202012Validator

from fsm_agent.models._adapter import AsyncCall, Message, ProviderCodec, SyncCall
from fsm_agent.models._chat_history import REASONING_KEYS, TOOL_MEDIA, to_openai_chat
from fsm_agent.models._common import (
    ModelResponseError,
    SdkErrors,
    need,
    whole,
)
from fsm_agent.models._stream import ChatFold, Fold
from fsm_agent.models._validate import check_openai_chat

__all__ = ["AsyncOpenAIChatModel", "OpenAIChatModel"]

_FINISHED = ("stop", "tool_calls")
_TRUNCATED = {
    "length": "the reply was cut at the output token limit, so its answer or arguments "
    "are incomplete",
    "content_filter": "the provider's content filter withheld the reply",
}
_REASONING_KEYS = REASONING_KEYS
_TOOL_MEDIA = TOOL_MEDIA
_MISSING_ID_HINT = (
    "the server sent no tool call id; if it never does (Gemini's OpenAI-compatible "
    "endpoint sends empty ids), pass OpenAIChatModel(synthesize_missing_ids=True), or "
    "--synthesize-missing-ids to fsm-agent"
)


def _accepts_empty(tool_specs: list[Message], name: Any) -> bool:
    """Whether the tool ``name`` accepts ``{}`` as its arguments (its schema says so)."""
    for spec in tool_specs:
        fn = spec.get("function") if isinstance(spec, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == name:
            schema = fn.get("parameters") or {"type": "object"}
            return bool(Draft202012Validator(schema).is_valid({}))
    return False


def _minted_id(round_no: int, index: int, call: Mapping[str, Any]) -> str:
    """A stable id for a call the server sent without one: the same reply at the same
    point of the same conversation always gets the same id (so a replay matches)."""
    fn = call.get("function")
    fn = fn if isinstance(fn, Mapping) else {}
    seed = json.dumps([round_no, index, fn.get("name"), fn.get("arguments")], default=str)
    return f"fsm_{round_no}_{index}_{hashlib.sha256(seed.encode()).hexdigest()[:12]}"


class _ChatCodec(ProviderCodec):
    provider = "openai-chat"
    errors = SdkErrors(openai.APIStatusError, openai.APIConnectionError)

    def __init__(
        self,
        model: str,
        *,
        synthesize_missing_ids: bool = False,
        send_reasoning: Collection[str] = ("reasoning_content", "reasoning_details"),
        tool_media: str = "text",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        if not isinstance(synthesize_missing_ids, bool):
            raise ValueError(f"{self.provider}: synthesize_missing_ids must be True or False")
        unknown = sorted(set(send_reasoning) - set(_REASONING_KEYS))
        if isinstance(send_reasoning, str) or unknown:
            raise ValueError(
                f"{self.provider}: send_reasoning names keys among "
                f"{', '.join(_REASONING_KEYS)}, got {send_reasoning!r}"
            )
        if tool_media not in _TOOL_MEDIA:
            raise ValueError(
                f"{self.provider}: tool_media must be one of {', '.join(_TOOL_MEDIA)}, "
                f"got {tool_media!r}"
            )
        self.synthesize_missing_ids = synthesize_missing_ids
        self.send_reasoning = tuple(send_reasoning)
        self.tool_media = tool_media

    # ── out ──────────────────────────────────────────────────────────────────────

    def to_messages(self, messages: list[Message]) -> list[Any]:
        return to_openai_chat(
            messages, tool_media=self.tool_media, send_reasoning=self.send_reasoning
        )

    def build_request(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        out = self.to_messages(messages)
        loop_has_reasoning = any(
            isinstance(m, Mapping) and isinstance(m.get("reasoning_content"), str)
            for m in out[_last_user(out) + 1 :]
        )
        problems = check_openai_chat(
            out,
            reasoning_content=loop_has_reasoning and "reasoning_content" in self.send_reasoning,
        )
        request: Message = {
            **self.options,
            "model": self.model,
            "messages": _restore_ids(self.checked(out, problems), messages),
        }
        if tool_specs:  # the API refuses an empty tools list
            request["tools"] = tool_specs
        return request

    def fold(self) -> Fold:
        return ChatFold()

    def stream_request(self, request: Message) -> Message:
        # Without include_usage a stream reports no usage at all (then unknown, not zero).
        return {"stream_options": {"include_usage": True}, **request, "stream": True}

    # ── in ───────────────────────────────────────────────────────────────────────

    def _choice(self, body: Message) -> tuple[Mapping[str, Any], Any]:
        p = self.provider
        choices = need(body, "choices", list, p)
        if not choices or not isinstance(choices[0], Mapping):
            raise ModelResponseError(f"{p}: response.choices has no choice object")
        choice = choices[0]
        message = need(choice, "message", dict, p, "choices[0]")
        finish = choice.get("finish_reason")
        if finish in _TRUNCATED:
            raise ModelResponseError(f"{p}: finish_reason {finish!r}: {_TRUNCATED[finish]}")
        if finish not in _FINISHED:
            raise ModelResponseError(
                f"{p}: unknown finish_reason {finish!r} (expected one of {', '.join(_FINISHED)})"
            )
        refusal = message.get("refusal")
        if refusal and not message.get("content"):
            raise ModelResponseError(f"{p}: the model refused: {str(refusal)[:300]}")
        return message, finish

    def _calls(
        self,
        raw_calls: list[Any],
        messages: list[Message],
        tool_specs: list[Message],
        reply: Message,
    ) -> list[Any]:
        """The calls as the machine should judge them; what was changed goes in ``reply``."""
        calls: list[Any] = []
        notes: list[Message] = []
        minted: dict[str, str] = {}
        extra: dict[str, Any] = {}
        round_no = sum(
            1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"
        )
        for i, call in enumerate(raw_calls):
            if not isinstance(call, Mapping):
                calls.append(call)
                continue
            call = dict(call)
            fn = call.get("function")
            if (
                isinstance(fn, Mapping)
                and fn.get("arguments") is None
                and _accepts_empty(tool_specs, fn.get("name"))
            ):
                call["function"] = {**fn, "arguments": "{}"}
                notes.append(
                    {"call": i, "arguments": "missing: read as {} (the tool's schema accepts it)"}
                )
            if not call.get("id") and self.synthesize_missing_ids:
                new_id = _minted_id(round_no, i, call)
                minted[new_id] = call.get("id") or ""
                notes.append({"call": i, "id": f"missing: minted {new_id}"})
                call["id"] = new_id
            if "extra_content" in call and call.get("id"):
                extra[call["id"]] = call["extra_content"]
            calls.append(call)
        if notes:
            reply["normalised"] = notes
        if minted:
            reply["synthesized_ids"] = minted
        if extra:
            reply["tool_call_extra_content"] = extra
        if any(isinstance(c, Mapping) and not c.get("id") for c in calls):
            reply["missing_id_hint"] = _MISSING_ID_HINT
        return calls

    def read_reply(
        self, body: Message, messages: list[Message], tool_specs: list[Message] | None = None
    ) -> Message:
        message, finish = self._choice(body)
        reply: Message = {"role": "assistant", "content": message.get("content")}
        calls = message.get("tool_calls")
        if calls:
            # Chat Completions pairs results per assistant message, so an id reused from an
            # earlier round is legal here (some compatible servers number calls per round).
            reply["tool_calls"] = (
                self._calls(calls, messages, tool_specs or [], reply)
                if isinstance(calls, list)
                else calls
            )
        for key in _REASONING_KEYS:
            if message.get(key) not in (None, "", []):
                reply[key] = message[key]
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            details = usage.get("prompt_tokens_details")
            cached = whole(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
            prompt = whole(usage.get("prompt_tokens"))
            reply["usage"] = self.usage(
                self.reply_model(body),
                input_tokens=max(prompt - cached, 0),
                cached_tokens=min(cached, prompt),
                output_tokens=whole(usage.get("completion_tokens")),
            )
        # No usage reported: the reply carries none (unknown, never zeros), so the
        # loop counts it as unmetered and a token or cost budget stops the run.
        reply["provider"] = {
            "api": self.provider,
            "id": body.get("id"),
            "model": body.get("model"),
            "finish_reason": finish,
        }
        return reply


def _last_user(messages: list[Any]) -> int:
    return max(
        (i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"),
        default=-1,
    )


def _restore_ids(out: list[Any], history: list[Message]) -> list[Any]:
    """The server's own (empty) ids in place of the ones ``synthesize_missing_ids``
    minted: it matches results to calls by position, and knows no other id."""
    minted: dict[str, str] = {}
    for m in history:
        ids = m.get("synthesized_ids") if isinstance(m, Mapping) else None
        if isinstance(ids, Mapping):
            minted.update(ids)
    if not minted:
        return out
    restored: list[Any] = []
    for m in out:
        if isinstance(m, Mapping) and m.get("role") == "tool" and m.get("tool_call_id") in minted:
            m = {**m, "tool_call_id": minted[m["tool_call_id"]]}
        elif isinstance(m, Mapping) and isinstance(m.get("tool_calls"), list):
            m = {
                **m,
                "tool_calls": [
                    {**c, "id": minted[c["id"]]}
                    if isinstance(c, Mapping) and c.get("id") in minted
                    else c
                    for c in m["tool_calls"]
                ],
            }
        restored.append(m)
    return restored


class OpenAIChatModel(SyncCall, _ChatCodec):
    """A Chat Completions model: ``OpenAIChatModel("gpt-4o-mini")``.

    ``client`` is an ``openai.OpenAI`` (its own retries are switched off: this adapter
    retries, inside the run's wall clock); or pass ``base_url``/``api_key`` to build one.
    ``options`` go into every request (``temperature``, ``parallel_tool_calls``, ...).
    ``prices`` override the price database (see :mod:`fsm_agent.models._pricing`).

    Compatible servers: ``synthesize_missing_ids=True`` mints stable ids for tool calls
    a server sends without one (and sends the server's own back); ``send_reasoning``
    names the reasoning keys returned to the server; ``tool_media`` says what happens to
    images and files in tool results, which Chat Completions tool messages cannot carry:
    ``"text"`` (default) sends the result's JSON text, where each is a placeholder
    naming its type and size; ``"user_message"`` also sends them natively in a user
    message right after the tool results.
    """

    def __init__(
        self,
        model: str,
        *,
        client: openai.OpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        )

    def _send(self, request: Message, timeout: float) -> Any:
        return self.client.chat.completions.with_raw_response.create(**request, timeout=timeout)

    def _open_stream(self, request: Message, timeout: float) -> Any:
        return self.client.chat.completions.with_streaming_response.create(
            **request, timeout=timeout
        )


class AsyncOpenAIChatModel(AsyncCall, _ChatCodec):
    """The async twin of :class:`OpenAIChatModel` (``client`` is an ``openai.AsyncOpenAI``)."""

    def __init__(
        self,
        model: str,
        *,
        client: openai.AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        )

    async def _asend(self, request: Message, timeout: float) -> Any:
        return await self.client.chat.completions.with_raw_response.create(
            **request, timeout=timeout
        )

    def _aopen_stream(self, request: Message, timeout: float) -> Any:
        return self.client.chat.completions.with_streaming_response.create(
            **request, timeout=timeout
        )
