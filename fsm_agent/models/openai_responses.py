"""The OpenAI Responses API: ``function_call`` / ``function_call_output`` items keyed by
``call_id``.

The whole history is sent every time (``store`` is off), so a run never depends on
state kept by the provider and a resumed run sends exactly what the trace shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from fsm_agent.models.validate import check_openai_responses

__all__ = ["AsyncOpenAIResponsesModel", "OpenAIResponsesModel"]

#: Output items that carry nothing the loop acts on (reasoning summaries and the like).
_IGNORED_ITEMS = ("reasoning",)


def to_items(messages: list[Message]) -> list[Message]:
    """Chat Completions messages as Responses ``input`` items."""
    items: list[Message] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id"),
                    "output": content,
                }
            )
            continue
        if role != "assistant" or content:
            items.append({"role": role, "content": content})
        if role == "assistant":
            for call in m.get("tool_calls") or ():
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


class _ResponsesCodec(ProviderCodec):
    provider = "openai-responses"
    errors = SdkErrors(openai.APIStatusError, openai.APIConnectionError)

    def build_request(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        items = to_items(messages)
        request: Message = {
            "store": False,
            **self.options,
            "model": self.model,
            "input": self.checked(items, check_openai_responses(items)),
        }
        if tool_specs:
            request["tools"] = to_tools(tool_specs)
        return request

    def read_reply(self, body: Message, messages: list[Message]) -> Message:  # noqa: C901 - one branch per output item type
        p = self.provider
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
            raise ModelResponseError(
                f"{p}: unknown response status {status!r} (expected 'completed')"
            )
        texts: list[str] = []
        calls: list[Message] = []
        for i, item in enumerate(need(body, "output", list, p)):
            where = f"output[{i}]"
            if not isinstance(item, Mapping):
                raise ModelResponseError(f"{p}: {where} is not an object")
            kind = item.get("type")
            if kind == "message":
                for j, part in enumerate(need(item, "content", list, p, where)):
                    ptype = part.get("type") if isinstance(part, Mapping) else None
                    if ptype == "output_text" and isinstance(part.get("text"), str):
                        texts.append(part["text"])
                    elif ptype == "refusal":
                        raise ModelResponseError(
                            f"{p}: the model refused: {str(part.get('refusal'))[:300]}"
                        )
                    else:
                        raise ModelResponseError(
                            f"{p}: {where}.content[{j}] has unknown type {ptype!r}"
                        )
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
            elif kind not in _IGNORED_ITEMS:
                raise ModelResponseError(f"{p}: {where} has unknown type {kind!r}")
        check_fresh_ids(calls, messages, p)
        reply: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
        if calls:
            reply["tool_calls"] = calls
        elif not texts:
            reply["content"] = ""
        usage = body.get("usage")
        model = self.reply_model(body)
        if isinstance(usage, Mapping):
            details = usage.get("input_tokens_details")
            cached = whole(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
            total_in = whole(usage.get("input_tokens"))
            reply["usage"] = self.usage(
                model,
                input_tokens=max(total_in - cached, 0),
                cached_tokens=min(cached, total_in),
                output_tokens=whole(usage.get("output_tokens")),
            )
        else:
            reply["usage"] = {
                "input_tokens": 0,
                "output_tokens": 0,
                "total_tokens": 0,
                "cost": None,
            }
        reply["provider"] = {
            "api": p,
            "id": body.get("id"),
            "model": body.get("model"),
            "status": status,
        }
        return reply


class OpenAIResponsesModel(SyncCall, _ResponsesCodec):
    """A Responses API model: ``OpenAIResponsesModel("gpt-4.1-mini")``; arguments as
    :class:`~fsm_agent.models.OpenAIChatModel`."""

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
        return self.client.responses.with_raw_response.create(**request, timeout=timeout)


class AsyncOpenAIResponsesModel(AsyncCall, _ResponsesCodec):
    """The async twin of :class:`OpenAIResponsesModel`."""

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
        return await self.client.responses.with_raw_response.create(**request, timeout=timeout)
