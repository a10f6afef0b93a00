"""What a model adapter may ask about the run that is calling it.

The model protocol stays ``(messages, tool_specs) -> message``; adapters that retry
(rate limits, 5xx) read :func:`current_deadline` to keep their backoff inside the run's
wall-clock budget.
"""

from __future__ import annotations

import contextvars
import time

__all__ = ["current_deadline", "time_left"]

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
