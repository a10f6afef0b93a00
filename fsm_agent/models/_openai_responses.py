"""The OpenAI Responses API: ``function_call`` / ``function_call_output`` items keyed by
``call_id``.

The whole history is sent every time (``store`` is off), so a run never depends on
state kept by the provider and a resumed run sends exactly what the trace shows.

Reasoning models return ``reasoning`` items. The server needs them back, each followed
by the item it produced (with that item's id); with ``store`` off it can only read them
from their ``encrypted_content``, which this adapter asks for (``include``) whenever
``options`` configure ``reasoning``. A reply holding reasoning keeps its ``output``
verbatim in the assistant message under ``responses_output``; the next request sends
those items back exactly, in their order, in place of the message and calls rebuilt from
``content`` and ``tool_calls``. (If the history's calls no longer match them, the items
are rebuilt without reasoning: a reasoning item cannot travel without its own items;
nor, with ``store`` off, without its encrypted content, so configure ``reasoning`` in
``options`` to keep it. The trace records it either way.)

Tool results that hold images or files (see :mod:`fsm_agent._core.content`) become a list
``output`` of ``input_text``, ``input_image`` and ``input_file`` parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

try:
    import openai
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the OpenAI adapters need the openai SDK: pip install 'fsm-agent[openai]'"
    ) from exc

from fsm_agent.models._adapter import AsyncCall, Message, ProviderCodec, SyncCall
from fsm_agent.models._common import (
    ModelResponseError,
    SdkErrors,
    check_fresh_ids,
    need,
    whole,
)
from fsm_agent.models._stream import Fold, ResponsesFold
from fsm_agent.models._validate import check_openai_responses

__all__ = ["AsyncOpenAIResponsesModel", "OpenAIResponsesModel"]

#: The assistant message key holding a reply's output items, verbatim.
OUTPUT_KEY = "responses_output"
_ENCRYPTED = "reasoning.encrypted_content"


def _output_part(part: Any) -> Any:
    """A Chat Completions content part as a Responses ``function_call_output`` part."""
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind == "text":
        return {"type": "input_text", "text": part.get("text")}
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, Mapping) else None
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    if kind == "file":
        inner = part.get("file")
        out: Message = {"type": "input_file"}
        if isinstance(inner, Mapping):
            out.update((k, inner[k]) for k in ("file_data", "filename", "file_id") if k in inner)
        return out
    return part


def _call_ids(items: list[Any]) -> list[Any]:
    return [
        i.get("call_id")
        for i in items
        if isinstance(i, Mapping) and i.get("type") == "function_call"
    ]


def _resendable(recorded: Any, calls: Any, store: bool) -> bool:
    """Whether a reply's recorded output items can go back as they are: its calls are
    the history's calls, and (with ``store`` off) every reasoning item carries its
    encrypted content, the only form the server can read back without storage."""
    if not isinstance(recorded, list):
        return False
    if _call_ids(recorded) != [c.get("id") for c in calls if isinstance(c, Mapping)]:
        return False
    return store or all(
        i.get("encrypted_content")
        for i in recorded
        if isinstance(i, Mapping) and i.get("type") == "reasoning"
    )


def _assistant_items(m: Mapping[str, Any], store: bool) -> list[Message]:
    calls = m.get("tool_calls") or ()
    recorded = m.get(OUTPUT_KEY)
    if isinstance(recorded, list) and _resendable(recorded, calls, store):
        return list(recorded)
    items: list[Message] = []
    content = m.get("content")
    if content:
        items.append({"role": "assistant", "content": content})
    for call in calls:
        fn = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments"),
            }
        )
    return items


def to_items(messages: list[Message], *, store: bool = False) -> list[Message]:
    """Chat Completions messages as Responses ``input`` items (``store`` as the request's)."""
    items: list[Message] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            output = [_output_part(p) for p in content] if isinstance(content, list) else content
            items.append(
                {"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": output}
            )
        elif role == "assistant":
            items.extend(_assistant_items(m, store))
        else:
            items.append({"role": role, "content": content})
    return items


def to_tools(tool_specs: list[Message]) -> list[Message]:
    # strict=False: our schemas are validated by us, and need not fit OpenAI's strict subset.
    return [
        {
            "type": "function",
            "name": s["function"]["name"],
            "description": s["function"].get("description") or "",
            "parameters": s["function"].get("parameters") or {"type": "object"},
            "strict": False,
        }
        for s in tool_specs
    ]


def _message_text(item: Mapping[str, Any], where: str, p: str) -> list[str]:
    texts = []
    for j, part in enumerate(need(item, "content", list, p, where)):
        ptype = part.get("type") if isinstance(part, Mapping) else None
        if ptype == "output_text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif ptype == "refusal":
            raise ModelResponseError(f"{p}: the model refused: {str(part.get('refusal'))[:300]}")
        else:
            raise ModelResponseError(f"{p}: {where}.content[{j}] has unknown type {ptype!r}")
    return texts


def _check_status(body: Message, p: str) -> Any:
    status = body.get("status")
    if status == "incomplete":
        details = body.get("incomplete_details")
        why = details.get("reason") if isinstance(details, Mapping) else None
        raise ModelResponseError(
            f"{p}: the response is incomplete ({why or 'no reason'}), "
            f"so its answer or arguments are cut short"
        )
    if status == "failed":
        raise ModelResponseError(f"{p}: the response failed: {body.get('error')}")
    if status != "completed":
        raise ModelResponseError(f"{p}: unknown response status {status!r} (expected 'completed')")
    return status


def _openai_rules(given: bool | None, model: Any) -> bool:
    """Whether OpenAI's own rules apply: as given, else when the client's base URL is
    OpenAI's or Azure OpenAI's (compatible servers such as DeepSeek's accept more)."""
    if given is not None:
        return given
    url = getattr(getattr(model, "client", None), "base_url", None)
    host = (urlsplit(str(url)).hostname or "") if url is not None else "api.openai.com"
    return host == "api.openai.com" or host.endswith((".openai.com", ".openai.azure.com"))


class _ResponsesCodec(ProviderCodec):
    provider = "openai-responses"
    errors = SdkErrors(openai.APIStatusError, openai.APIConnectionError)
    #: ``None``: OpenAI's reasoning-item rule applies only on OpenAI's own servers.
    reasoning_followers: bool | None = None

    def build_request(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        request: Message = {"store": False, **self.options, "model": self.model}
        store = request.get("store") is not False
        items = to_items(messages, store=store)
        if not store and "reasoning" in self.options and "include" not in self.options:
            request["include"] = [_ENCRYPTED]  # the only way reasoning survives store=false
        continuing = bool(request.get("previous_response_id") or request.get("conversation"))
        problems = check_openai_responses(
            items,
            store=store,
            continuing=continuing,
            reasoning_followers=_openai_rules(self.reasoning_followers, self),
        )
        request["input"] = self.checked(items, problems)
        if tool_specs:
            request["tools"] = to_tools(tool_specs)
        return request

    def fold(self) -> Fold:
        return ResponsesFold()

    def read_reply(
        self, body: Message, messages: list[Message], tool_specs: list[Message] | None = None
    ) -> Message:
        p = self.provider
        status = _check_status(body, p)
        texts: list[str] = []
        calls: list[Message] = []
        output = need(body, "output", list, p)
        for i, item in enumerate(output):
            where = f"output[{i}]"
            if not isinstance(item, Mapping):
                raise ModelResponseError(f"{p}: {where} is not an object")
            kind = item.get("type")
            if kind == "message":
                texts.extend(_message_text(item, where, p))
            elif kind == "function_call":
                # A missing call_id becomes "", which the machine stops on before anything
                # runs (protocol_error/missing_tool_call_id); arguments pass through as sent.
                calls.append(
                    {
                        "id": item.get("call_id") or "",
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                    }
                )
            elif kind != "reasoning":
                raise ModelResponseError(f"{p}: {where} has unknown type {kind!r}")
        check_fresh_ids(calls, messages, p)
        reply: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
        if calls:
            reply["tool_calls"] = calls
        elif not texts:
            reply["content"] = ""
        if any(isinstance(i, Mapping) and i.get("type") == "reasoning" for i in output):
            reply[OUTPUT_KEY] = output
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            details = usage.get("input_tokens_details")
            cached = whole(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
            total_in = whole(usage.get("input_tokens"))
            reply["usage"] = self.usage(
                self.reply_model(body),
                input_tokens=max(total_in - cached, 0),
                cached_tokens=min(cached, total_in),
                output_tokens=whole(usage.get("output_tokens")),
            )
        # No usage reported: the reply carries none (unknown, never zeros), so the
        # loop counts it as unmetered and a token or cost budget stops the run.
        reply["provider"] = {
            "api": p,
            "id": body.get("id"),
            "model": body.get("model"),
            "status": status,
        }
        return reply


def _reasoning_option(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(
            f"openai-responses: reasoning_followers must be True, False or None, got {value!r}"
        )
    return value


class OpenAIResponsesModel(SyncCall, _ResponsesCodec):
    """A Responses API model: ``OpenAIResponsesModel("gpt-4.1-mini")``; arguments as
    :class:`~fsm_agent.models.OpenAIChatModel`. For a reasoning model pass e.g.
    ``options={"reasoning": {"effort": "low"}}``: its reasoning then travels with the
    history (encrypted), round after round.

    ``reasoning_followers``: whether each reasoning item sent back must be followed by an
    item with an id, as OpenAI requires. ``None`` (default): on OpenAI's and Azure's
    servers only; compatible servers (DeepSeek's ``/responses``) reply with items
    without ids and accept them back."""

    def __init__(
        self,
        model: str,
        *,
        client: openai.OpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        reasoning_followers: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.reasoning_followers = _reasoning_option(reasoning_followers)
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        )

    def _send(self, request: Message, timeout: float) -> Any:
        return self.client.responses.with_raw_response.create(**request, timeout=timeout)

    def _open_stream(self, request: Message, timeout: float) -> Any:
        return self.client.responses.with_streaming_response.create(**request, timeout=timeout)


class AsyncOpenAIResponsesModel(AsyncCall, _ResponsesCodec):
    """The async twin of :class:`OpenAIResponsesModel`."""

    def __init__(
        self,
        model: str,
        *,
        client: openai.AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        reasoning_followers: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.reasoning_followers = _reasoning_option(reasoning_followers)
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        )

    async def _asend(self, request: Message, timeout: float) -> Any:
        return await self.client.responses.with_raw_response.create(**request, timeout=timeout)

    def _aopen_stream(self, request: Message, timeout: float) -> Any:
        return self.client.responses.with_streaming_response.create(**request, timeout=timeout)
