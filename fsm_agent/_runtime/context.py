"""What a model adapter may ask about the run that is calling it.

The model protocol stays ``(messages, tool_specs) -> message``; adapters that retry
(rate limits, 5xx) read :func:`current_deadline` to keep their backoff inside the run's
wall-clock budget, and report what they know of a call (:func:`report_call`: the
model asked for, the server) to whoever collects it (``fsm_agent.otel``'s ``chat`` span).
A streaming adapter hands each delta of a reply to :func:`emit_delta`, which passes it
to the delta sink of the current context (``Runtime.stream`` sets one; without one a
delta costs a lookup).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "DEFAULT_CAPACITY",
    "DeltaSink",
    "collect_call_facts",
    "current_deadline",
    "driving_trace_context",
    "emit_delta",
    "report_call",
    "reset_trace_deltas",
    "set_delta_sink",
    "set_trace_deltas",
    "time_left",
    "tracing_deltas",
    "wait_room",
]

#: How many events a streamed run's queue holds before the driver waits (``Runtime.stream``).
DEFAULT_CAPACITY = 256

#: ``sink(type, fields)``: one delta of the reply being streamed, as it arrives.
DeltaSink = Callable[[str, dict[str, Any]], None]

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "fsm_agent_deadline", default=None
)


def current_deadline() -> float | None:
    """The run's wall-clock deadline on ``time.monotonic()``'s scale, or ``None``."""
    return _deadline.get()


def time_left() -> float | None:
    """Seconds left in the current run's wall-clock budget, or ``None`` if unlimited."""
    deadline = _deadline.get()
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


#: Set the current deadline (a token for :func:`reset_deadline`); the variable's own
#: methods, not wrappers: once per model call, each a call less.
set_deadline: Callable[[float | None], contextvars.Token[float | None]] = _deadline.set
reset_deadline: Callable[[contextvars.Token[float | None]], None] = _deadline.reset


_delta_sink: contextvars.ContextVar[DeltaSink | None] = contextvars.ContextVar(
    "fsm_agent_delta_sink", default=None
)


def emit_delta(kind: str, **fields: Any) -> None:
    """One delta (``text_delta``, ``reasoning_delta``, ``tool_args_delta``) to the
    current sink. The sink may block (back-pressure) or raise a ``BaseException`` to
    cancel the run; an adapter lets both through."""
    found = _call_facts.get()
    if found is not None:  # a collector follows this call: when its chunks came
        now = time.monotonic()
        found.setdefault("first_delta_at", now)
        found["last_delta_at"] = now
        found["deltas"] = found.get("deltas", 0) + 1
    sink = _delta_sink.get()
    if sink is not None:
        sink(kind, fields)


def set_delta_sink(sink: DeltaSink | None) -> contextvars.Token[DeltaSink | None]:
    return _delta_sink.set(sink)


def reset_delta_sink(token: contextvars.Token[DeltaSink | None]) -> None:
    _delta_sink.reset(token)


_trace_deltas: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "fsm_agent_trace_deltas", default=False
)


def tracing_deltas() -> bool:
    """Whether the reply being streamed keeps its raw deltas in the trace
    (``Runtime.stream(..., trace_deltas=True)``), not only each block's digest."""
    return _trace_deltas.get()


def set_trace_deltas(on: bool) -> contextvars.Token[bool]:
    return _trace_deltas.set(on)


def reset_trace_deltas(token: contextvars.Token[bool]) -> None:
    _trace_deltas.reset(token)


_room: contextvars.ContextVar[Callable[[], Awaitable[None]] | None] = contextvars.ContextVar(
    "fsm_agent_stream_room", default=None
)


async def wait_room() -> None:
    """Wait until the consumer of an async stream has room (an async adapter calls this
    between chunks, so a slow consumer slows the read instead of growing a queue)."""
    room = _room.get()
    if room is not None:
        await room()


def set_room(room: Callable[[], Awaitable[None]] | None) -> contextvars.Token[Any]:
    return _room.set(room)


_call_facts: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fsm_agent_call_facts", default=None
)


def report_call(**facts: Any) -> None:
    """An adapter's facts about the model call under way (``request_model``,
    ``server_address``, ``server_port``, ``stream``); nothing happens unless someone
    collects them. :func:`emit_delta` adds, for a streamed reply, ``first_delta_at``,
    ``last_delta_at`` (``time.monotonic()``) and ``deltas``."""
    found = _call_facts.get()
    if found is not None:
        found.update({k: v for k, v in facts.items() if v is not None})


def collect_call_facts(into: dict[str, Any]) -> contextvars.Token[dict[str, Any] | None]:
    """Collect what :func:`report_call` reports in this context into ``into``, until
    :func:`stop_collecting` with the token returned."""
    return _call_facts.set(into)


def stop_collecting(token: contextvars.Token[dict[str, Any] | None]) -> None:
    _call_facts.reset(token)


_trace_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "fsm_agent_trace_context", default=None
)


def driving_trace_context() -> dict[str, str] | None:
    """The run's W3C trace context carrier (``RunState.trace_context``) while a driver
    drives it, or ``None``: a tracer reads the stored context of a resumed run from it
    and writes its run span's into it, which the run's next checkpoint stores."""
    return _trace_context.get()


def set_trace_context(carrier: dict[str, str]) -> contextvars.Token[dict[str, str] | None]:
    return _trace_context.set(carrier)


def reset_trace_context(token: contextvars.Token[dict[str, str] | None]) -> None:
    _trace_context.reset(token)
