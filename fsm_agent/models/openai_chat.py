"""OpenAI Chat Completions, and every server that speaks it (vLLM, llama.cpp server,
Ollama, LiteLLM proxy, ...): pass ``base_url``.

Our internal shape *is* Chat Completions, so the translation is thin; what this adapter
adds is the checking: the history is validated before sending, the body is read
field by field, and an unknown or truncating ``finish_reason`` raises instead of
becoming a half answer. Tool calls are passed through as the provider wrote them, so
the machine's own rules judge them (a missing id → ``protocol_error/missing_tool_call_id``,
non-JSON arguments → an ``invalid_arguments`` observation, or a stop under ``strict``).
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
    need,
    whole,
)
from fsm_agent.models.validate import check_openai_chat

__all__ = ["AsyncOpenAIChatModel", "OpenAIChatModel"]

_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")
_FINISHED = ("stop", "tool_calls")
_TRUNCATED = {
    "length": "the reply was cut at the output token limit, so its answer or arguments "
    "are incomplete",
    "content_filter": "the provider's content filter withheld the reply",
}


class _ChatCodec(ProviderCodec):
    provider = "openai-chat"
    errors = SdkErrors(openai.APIStatusError, openai.APIConnectionError)

    def build_request(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        out = [
            {k: m[k] for k in _KEYS if k in m} if isinstance(m, Mapping) else m for m in messages
        ]
        request: Message = {
            **self.options,
            "model": self.model,
            "messages": self.checked(out, check_openai_chat(out)),
        }
        if tool_specs:  # the API refuses an empty tools list
            request["tools"] = tool_specs
        return request

    def read_reply(self, body: Message, messages: list[Message]) -> Message:
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
        reply: Message = {"role": "assistant", "content": message.get("content")}
        calls = message.get("tool_calls")
        if calls:
            # Chat Completions pairs results per assistant message, so an id reused from an
            # earlier round is legal here (some compatible servers number calls per round).
            reply["tool_calls"] = calls
        usage = body.get("usage")
        model = self.reply_model(body)
        if isinstance(usage, Mapping):
            details = usage.get("prompt_tokens_details")
            cached = whole(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
            prompt = whole(usage.get("prompt_tokens"))
            reply["usage"] = self.usage(
                model,
                input_tokens=max(prompt - cached, 0),
                cached_tokens=min(cached, prompt),
                output_tokens=whole(usage.get("completion_tokens")),
            )
        else:  # no usage reported: tokens unknown, and never priced as free
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
            "finish_reason": finish,
        }
        return reply


class OpenAIChatModel(SyncCall, _ChatCodec):
    """A Chat Completions model: ``OpenAIChatModel("gpt-4o-mini")``.

    ``client`` is an ``openai.OpenAI`` (its own retries are switched off: this adapter
    retries, inside the run's wall clock); or pass ``base_url``/``api_key`` to build one.
    ``options`` go into every request (``temperature``, ``parallel_tool_calls``, ...).
    ``prices`` overrides :data:`~fsm_agent.models.pricing.DEFAULT_PRICES`.
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
