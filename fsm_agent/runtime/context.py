"""What a model adapter may ask about the run that is calling it.

The model protocol stays ``(messages, tool_specs) -> message``; adapters that retry
(rate limits, 5xx) read :func:`current_deadline` to keep their backoff inside the run's
wall-clock budget. A streaming adapter hands each delta of a reply to
:func:`emit_delta`, which passes it to the delta sink of the current context
(``Runtime.stream`` sets one; without one a delta costs a lookup).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "DeltaSink",
    "current_deadline",
    "emit_delta",
    "set_delta_sink",
    "time_left",
    "wait_room",
]

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


def set_deadline(deadline: float | None) -> contextvars.Token[float | None]:
    return _deadline.set(deadline)


def reset_deadline(token: contextvars.Token[float | None]) -> None:
    _deadline.reset(token)


_delta_sink: contextvars.ContextVar[DeltaSink | None] = contextvars.ContextVar(
    "fsm_agent_delta_sink", default=None
)


def emit_delta(kind: str, **fields: Any) -> None:
    """One delta (``text_delta``, ``reasoning_delta``, ``tool_args_delta``) to the
    current sink. The sink may block (back-pressure) or raise a ``BaseException`` to
    cancel the run; an adapter lets both through."""
    sink = _delta_sink.get()
    if sink is not None:
        sink(kind, fields)


def set_delta_sink(sink: DeltaSink | None) -> contextvars.Token[DeltaSink | None]:
    return _delta_sink.set(sink)


def reset_delta_sink(token: contextvars.Token[DeltaSink | None]) -> None:
    _delta_sink.reset(token)


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
