"""The frame of every provider adapter: validate, send with retries, read the reply.

A concrete adapter supplies four things: ``build_request`` (our history and tool specs
in the provider's shape, checked by the provider's validator), ``read_reply`` (the
provider's JSON body back into a Chat Completions assistant message with ``usage``),
and ``_send`` / ``_asend`` (one raw SDK request). The sync and async classes share all
of it; only ``__call__`` differs, so ``Runtime.run`` sees a plain callable and
``Runtime.arun`` an async one.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, ClassVar

from fsm_agent._runtime.context import report_call, wait_room
from fsm_agent.models._common import (
    HistoryError,
    ModelRetry,
    ModelUnavailableError,
    SdkErrors,
    acall_with_retries,
    body_text,
    call_with_retries,
    decode_body,
)
from fsm_agent.models._pricing import Price, db_cost, find_price
from fsm_agent.models._stream import Fold, SseParser, fold_bytes

__all__ = ["AsyncCall", "ProviderCodec", "SyncCall"]

Message = dict[str, Any]


class ProviderCodec:
    """Conversions and configuration shared by the sync and async adapter of a provider."""

    provider: ClassVar[str]
    errors: ClassVar[SdkErrors]

    def __init__(
        self,
        model: str,
        *,
        prices: Mapping[str, Price] | None = None,
        retry: ModelRetry | None = None,
        options: Mapping[str, Any] | None = None,
        price_db: bool = True,
        stream: bool = False,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"{self.provider}: model must be a non-empty model name")
        if retry is not None and not isinstance(retry, ModelRetry):
            raise ValueError(f"{self.provider}: retry must be a ModelRetry, got {retry!r}")
        if prices is not None and not (
            isinstance(prices, Mapping)
            and all(isinstance(k, str) and isinstance(v, Price) for k, v in prices.items())
        ):
            raise ValueError(
                f"{self.provider}: prices must map model names to Price, got {prices!r}"
            )
        self.model = model
        if not isinstance(price_db, bool):
            raise ValueError(f"{self.provider}: price_db must be True or False")
        self.prices: Mapping[str, Price] = {} if prices is None else prices
        self.price_db = price_db
        self.retry = retry or ModelRetry()
        self.options = dict(options or {})
        if not isinstance(stream, bool):
            raise ValueError(f"{self.provider}: stream must be True or False, got {stream!r}")
        self.stream = stream

    # ── supplied by each provider ────────────────────────────────────────────────

    def build_request(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        raise NotImplementedError

    def read_reply(
        self, body: Message, messages: list[Message], tool_specs: list[Message] | None = None
    ) -> Message:
        raise NotImplementedError

    def fold(self) -> Fold:
        """A fresh fold of this API's event stream into its unstreamed body."""
        raise NotImplementedError

    def stream_request(self, request: Message) -> Message:
        """``request`` as a streamed one (Chat also asks for the usage event)."""
        return {**request, "stream": True}

    # ── shared ───────────────────────────────────────────────────────────────────

    def checked(self, payload: list[Any], problems: list[str]) -> list[Any]:
        """``payload`` if its validator found nothing, else a HistoryError naming it all."""
        if problems:
            raise HistoryError(
                f"{self.provider}: refusing to send a history the provider "
                f"would reject: " + "; ".join(problems)
            )
        return payload

    def reply_model(self, body: Message) -> str:
        """The model the provider says answered (a dated snapshot, often), else ours."""
        model = body.get("model")
        return model if isinstance(model, str) and model else self.model

    def usage(
        self,
        model: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> Message:
        """Our usage shape; ``cost`` is ``None`` when the model has no price (``prices``
        first, for the model that answered, then the one asked for; then the database).
        The cache figures the shape sums into ``input_tokens`` go to a collector."""
        report_call(
            cached_tokens=cached_tokens or None, cache_write_tokens=cache_write_tokens or None
        )
        tokens = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cached_tokens": cached_tokens,
            "cache_write_tokens": cache_write_tokens,
        }
        cost: float | None = None
        price = find_price(model, self.prices) or find_price(self.model, self.prices)
        if price is not None:
            cost = price.cost(**tokens)
        elif self.price_db:
            url = getattr(getattr(self, "client", None), "base_url", None)
            where = str(url) if url is not None else None
            cost = db_cost(model, provider_url=where, **tokens)
            if cost is None and model != self.model:
                cost = db_cost(self.model, provider_url=where, **tokens)
        cost = None if cost is None else round(cost, 10)
        total_in = input_tokens + cached_tokens + cache_write_tokens
        return {
            "input_tokens": total_in,
            "output_tokens": output_tokens,
            "total_tokens": total_in + output_tokens,
            "cost": cost,
        }


def _report(codec: ProviderCodec) -> None:
    """What this call is, for a collector (``runtime/context.py``): the API, the model
    asked for and the server (host and port of the SDK client's base URL), known before
    the call (so a call that fails still names them)."""
    url = getattr(getattr(codec, "client", None), "base_url", None)
    host = getattr(url, "host", None)
    port = getattr(url, "port", None)
    if port is None and host:
        port = {"https": 443, "http": 80}.get(str(getattr(url, "scheme", "")))
    report_call(
        provider=codec.provider,
        request_model=codec.model,
        server_address=host or None,
        server_port=port,
        stream=bool(getattr(codec, "stream", False)),
    )


class SyncCall(ProviderCodec):
    """A blocking adapter: ``Runtime.run`` and ``Runtime.arun`` both accept it."""

    def __init__(
        self, model: str, *, sleep: Callable[[float], Any] = time.sleep, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.sleep = sleep

    def _send(self, request: Message, timeout: float) -> Any:
        raise NotImplementedError

    def _open_stream(self, request: Message, timeout: float) -> Any:
        """The SDK's streaming raw response (a context manager with ``iter_bytes``)."""
        raise NotImplementedError

    def _send_streamed(self, request: Message, timeout: float) -> Message:
        fold = self.fold()
        with self._open_stream(self.stream_request(request), timeout) as raw:
            return _with_blocks(fold_bytes(fold, _reading(raw.iter_bytes(), self.provider)), fold)

    def __call__(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        request = self.build_request(messages, tool_specs)
        _report(self)

        def send(timeout: float) -> Message:
            if self.stream:
                return self._send_streamed(request, timeout)
            raw = self._send(request, timeout)
            return decode_body(body_text(raw), raw.status_code, self.provider)

        body = call_with_retries(
            send, provider=self.provider, errors=self.errors, retry=self.retry, sleep=self.sleep
        )
        return _streamed(self.read_reply(body, messages, tool_specs), body)


class AsyncCall(ProviderCodec):
    """A coroutine adapter, for ``Runtime.arun`` (e.g. next to async MCP tools)."""

    def __init__(
        self, model: str, *, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.sleep = sleep

    async def _asend(self, request: Message, timeout: float) -> Any:
        raise NotImplementedError

    def _aopen_stream(self, request: Message, timeout: float) -> Any:
        """The SDK's streaming raw response (an async context manager)."""
        raise NotImplementedError

    async def _asend_streamed(self, request: Message, timeout: float) -> Message:
        fold = self.fold()
        parser = SseParser()
        async with self._aopen_stream(self.stream_request(request), timeout) as raw:
            chunks = raw.iter_bytes()
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    raise _broken(self.provider, exc) from exc
                for event, data in parser.feed(chunk):
                    fold.feed(event, data)
                await wait_room()  # back-pressure: a slow consumer slows the read
        for event, data in parser.close():
            fold.feed(event, data)
        return _with_blocks(fold.body(), fold)

    async def __call__(self, messages: list[Message], tool_specs: list[Message]) -> Message:
        request = self.build_request(messages, tool_specs)
        _report(self)

        async def send(timeout: float) -> Message:
            if self.stream:
                return await self._asend_streamed(request, timeout)
            raw = await self._asend(request, timeout)
            text = body_text(raw)
            if inspect.isawaitable(text):
                text = await text
            return decode_body(text, raw.status_code, self.provider)

        body = await acall_with_retries(
            send, provider=self.provider, errors=self.errors, retry=self.retry, sleep=self.sleep
        )
        return _streamed(self.read_reply(body, messages, tool_specs), body)


#: Where a folded body carries its blocks' summaries to the reply (never sent anywhere).
_BLOCKS = "__fsm_streamed_blocks"


def _with_blocks(body: Message, fold: Fold) -> Message:
    return {**body, _BLOCKS: fold.blocks()}


def _streamed(reply: Message, body: Message) -> Message:
    """The reply with what the trace keeps of its stream: per block, the length, the
    number of deltas and a digest of their sequence (the deltas themselves are not kept)."""
    blocks = body.get(_BLOCKS)
    if blocks is not None:
        reply["streamed"] = blocks
    return reply


def _broken(provider: str, exc: Exception) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"{provider}: the stream broke ({type(exc).__name__}: {exc}); "
        "nothing of the partial message is used"
    )


def _reading(chunks: Iterator[bytes], provider: str) -> Iterator[bytes]:
    """``chunks``, with a failure of the connection itself (the HTTP client's error,
    whatever its module) as a retryable :class:`ModelUnavailableError`."""
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return
        except Exception as exc:
            raise _broken(provider, exc) from exc
        yield chunk
