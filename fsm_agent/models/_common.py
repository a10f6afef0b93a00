"""What every provider adapter shares: its errors, the retry loop, and body decoding.

A model call has no side effect, so rate limits (429), server errors (5xx) and broken
connections are retried here, with backoff, but never past the run's wall clock
(:func:`fsm_agent.context.time_left`). Everything else raises a :class:`ModelError`
subclass whose text carries the provider's own detail; the runtime turns a raising model
into ``protocol_error/model_error`` with ``"ExceptionType: message"`` in the trace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fsm_agent._errors import (
    HistoryError,
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelUnavailableError,
)
from fsm_agent._runtime.context import time_left
from fsm_agent.models._validate import recognise_history_rejection, recognise_reasoning_rejection

__all__ = [
    "HistoryError",
    "ModelAuthError",
    "ModelError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelRetry",
    "ModelUnavailableError",
]

T = TypeVar("T")

#: How much of a provider's error body goes into a message: enough to act on.
_DETAIL_CHARS = 500


@dataclass(frozen=True)
class ModelRetry:
    """Retries of one model call. ``max_attempts`` counts the first attempt.

    The n-th retry waits ``min(backoff_s * multiplier**(n-1), max_backoff_s)`` seconds,
    or the provider's ``Retry-After`` if that is longer (capped at ``max_backoff_s``).
    ``request_timeout_s`` bounds one HTTP request; the run's time left bounds it too.
    """

    max_attempts: int = 4
    backoff_s: float = 0.5
    multiplier: float = 2.0
    max_backoff_s: float = 8.0
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or (self.max_attempts < 1)
        ):
            raise ValueError(
                f"ModelRetry.max_attempts must be a whole number >= 1, got {self.max_attempts!r}"
            )
        for name in ("backoff_s", "multiplier", "max_backoff_s", "request_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"ModelRetry.{name} must be a number >= 0, got {value!r}")

    def wait(self, attempt: int, retry_after: float | None) -> float:
        base = self.backoff_s * self.multiplier ** (attempt - 1)
        if retry_after is not None:
            base = max(base, retry_after)
        return float(min(base, self.max_backoff_s))


@dataclass(frozen=True)
class SdkErrors:
    """The exception classes of one SDK (``openai`` or ``anthropic``): both are generated
    from the same template, so one classifier serves both."""

    status: type[Exception]
    connection: type[Exception]


@dataclass(frozen=True)
class _Failure:
    retryable: bool
    error: ModelError
    retry_after: float | None = None


def _detail(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    message: Any = None
    if isinstance(body, Mapping):
        inner = body.get("error")
        message = inner.get("message") if isinstance(inner, Mapping) else body.get("message")
    text = message if isinstance(message, str) and message else str(exc)
    return text[:_DETAIL_CHARS]


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    raw = headers.get("retry-after")
    try:
        value = float(raw) if raw is not None else None
    except ValueError:  # an HTTP date: not worth parsing for a bounded backoff
        return None
    return value if value is not None and value >= 0 else None


def classify(exc: Exception, provider: str, errors: SdkErrors) -> _Failure:
    """Decide whether a failed call is worth retrying, and the error to raise if not."""
    if isinstance(exc, errors.status):
        status = int(getattr(exc, "status_code", 0))
        detail = _detail(exc)
        where = f"{provider} answered HTTP {status}: {detail}"
        if status in (401, 403):
            return _Failure(False, ModelAuthError(where))
        if status in (408, 409, 429) or status >= 500:  # the set the SDKs themselves retry
            return _Failure(True, ModelUnavailableError(where), _retry_after(exc))
        if recognise_history_rejection(detail):
            return _Failure(
                False,
                HistoryError(
                    f"{where} (the provider rejected the history: "
                    f"a pairing bug upstream of the adapter)"
                ),
            )
        if recognise_reasoning_rejection(detail):
            return _Failure(
                False,
                HistoryError(
                    f"{where} (the provider wants back reasoning the history does not carry: "
                    f"was it built without the adapter's reasoning keys?)"
                ),
            )
        return _Failure(False, ModelRequestError(where))
    if isinstance(exc, errors.connection):
        return _Failure(True, ModelUnavailableError(f"{provider}: {type(exc).__name__}: {exc}"))
    if isinstance(exc, ModelUnavailableError):  # a cut stream, an overload event in it
        return _Failure(True, exc)
    if isinstance(exc, ModelError):
        return _Failure(False, exc)
    raise exc


def _request_timeout(retry: ModelRetry, provider: str, attempt: int) -> float:
    left = time_left()
    if left is not None and left <= 0:
        raise ModelUnavailableError(f"{provider}: no wall-clock time left for attempt {attempt}")
    return retry.request_timeout_s if left is None else min(retry.request_timeout_s, left)


def _next_wait(failure: _Failure, retry: ModelRetry, attempt: int, exc: Exception) -> float:
    if not failure.retryable:
        if failure.error is exc:  # already ours (an unreadable body): no chain to itself
            raise exc
        raise failure.error from exc
    if attempt >= retry.max_attempts:
        raise ModelUnavailableError(f"gave up after {attempt} attempts: {failure.error}") from exc
    wait = retry.wait(attempt, failure.retry_after)
    left = time_left()
    if left is not None and wait >= left:
        raise ModelUnavailableError(
            f"{failure.error}; a retry in {wait:.2f}s would end past the wall-clock budget "
            f"({left:.2f}s left)"
        ) from exc
    return wait


def call_with_retries(
    send: Callable[[float], T],
    *,
    provider: str,
    errors: SdkErrors,
    retry: ModelRetry,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """``send(timeout_s)`` until it succeeds, retrying only what a model call may retry."""
    attempt = 0
    while True:
        attempt += 1
        timeout = _request_timeout(retry, provider, attempt)
        try:
            return send(timeout)
        except Exception as exc:
            failure = classify(exc, provider, errors)
            sleep(_next_wait(failure, retry, attempt, exc))


async def acall_with_retries(
    send: Callable[[float], Awaitable[T]],
    *,
    provider: str,
    errors: SdkErrors,
    retry: ModelRetry,
    sleep: Callable[[float], Awaitable[Any]] | None = None,
) -> T:
    """The async twin of :func:`call_with_retries`."""
    if sleep is None:
        import asyncio  # only async callers pay for it

        sleep = asyncio.sleep
    attempt = 0
    while True:
        attempt += 1
        timeout = _request_timeout(retry, provider, attempt)
        try:
            return await send(timeout)
        except Exception as exc:
            failure = classify(exc, provider, errors)
            await sleep(_next_wait(failure, retry, attempt, exc))


def body_text(raw: Any) -> Any:
    """A raw SDK response's text: a str, or an awaitable of one (anthropic's async
    response has ``async text()``, its sync one ``text()``, openai's a property)."""
    text = raw.text
    return text() if callable(text) else text


def decode_body(text: str, status: Any, provider: str) -> dict[str, Any]:
    """The JSON object of a response body; :class:`ModelResponseError` otherwise.

    The adapters read raw bodies rather than the SDKs' models because those accept
    almost anything silently; we want to say exactly what was wrong.
    """
    if not text or not text.strip():
        raise ModelResponseError(f"{provider}: the response body is empty (HTTP {status})")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ModelResponseError(
            f"{provider}: the response body is not JSON ({exc}): {text[:200]!r}"
        ) from None
    if not isinstance(body, dict):
        raise ModelResponseError(
            f"{provider}: the response body is a JSON {type(body).__name__}, not an object"
        )
    return body


def need(
    body: Mapping[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    provider: str,
    where: str = "response",
) -> Any:
    """``body[key]`` if it has the expected JSON type, else a precise ModelResponseError."""
    value = body.get(key)
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        got = "missing" if key not in body else f"a {type(value).__name__}"
        raise ModelResponseError(f"{provider}: {where}.{key} must be {names}, got {got}")
    return value


def whole(value: Any) -> int:
    """A token count from a usage object: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_json_object(raw: Any) -> dict[str, Any] | None:
    """The arguments of an earlier call as an object, or ``None`` if they were not one."""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def earlier_call_ids(messages: list[dict[str, Any]]) -> set[str]:
    """Ids of the tool calls already in a history (providers keying by id want them unique)."""
    ids: set[str] = set()
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                    ids.add(call["id"])
    return ids


def check_fresh_ids(
    calls: list[dict[str, Any]], messages: list[dict[str, Any]], provider: str
) -> None:
    """A call id that answers to an earlier call would bind a new result to an old call."""
    earlier = earlier_call_ids(messages)
    for call in calls:
        call_id = call.get("id")
        if call_id and call_id in earlier:
            raise ModelResponseError(
                f"{provider}: the reply reuses call id {call_id!r} from earlier in the "
                f"conversation; its result could not be told apart"
            )
