"""Budgets and the retry policy: small frozen values with one check each."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from fsm_agent._errors import ConfigError

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_RECORD_BYTES",
    "Budget",
    "Metered",
    "RetryPolicy",
    "bounded_text",
    "metered",
]

#: The most bytes of JSON text one model reply or one tool result may keep in a run's
#: history and trace, whatever the budget says. A quarter of the line limit of
#: ``fsm-agent check`` (``trace/io.py``'s ``MAX_LINE``), so that every line the runtime
#: writes under any budget is one the checker reads: a line holds at most one reply or
#: result, plus its envelope, or a stop's detail quoting parts of them.
MAX_RECORD_BYTES = 16 * 1024 * 1024


#: The most characters of an error message (a tool's or a model's exception) a run
#: records: they are read by people, and one could otherwise fill a trace line.
MAX_ERROR_CHARS = 16_384


def bounded_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _positive_int(owner: str, name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{owner}.{name} must be a whole number >= 1, got {value!r}")


def _positive_number(owner: str, name: str, value: object, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    number = (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else float("nan")
    )
    # NaN fails both comparisons, so it is refused along with non-numbers.
    if not (number > 0 or (allow_zero and number == 0)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{owner}.{name} must be a number {bound}, got {value!r}")


@dataclass(frozen=True)
class Budget:
    """Limits checked before every new external operation (R9 of docs/concepts/rules.md).

    ``None`` means "no limit" for the dimensions that allow it. Counts are whole numbers
    >= 1; the model may still answer after the last permitted tool round.

    ``max_output_bytes`` counts every tool result the model is handed: its JSON text and
    the raw bytes of the images and files in it. ``max_media_bytes`` caps the media of one
    result: media past it are left out (their placeholder says so) and not counted.
    ``max_reply_bytes`` bounds one model reply (its JSON text): a larger one stops the run
    ``budget_exhausted/reply_size`` before anything in it is read or run. Both byte
    bounds on one record are at most :data:`MAX_RECORD_BYTES`, so every trace a run
    writes can be checked.
    """

    max_tool_rounds: int = 8
    max_calls_per_round: int = 8
    max_total_calls: int = 32
    max_model_calls: int = 16
    max_tokens: int | None = None
    max_cost: float | None = None
    max_wall_clock_s: float | None = None
    max_output_bytes: int | None = 1_000_000
    max_media_bytes: int = 10_000_000
    max_reply_bytes: int = 4_000_000

    def __post_init__(self) -> None:
        for name in (
            "max_tool_rounds",
            "max_calls_per_round",
            "max_total_calls",
            "max_model_calls",
        ):
            _positive_int("Budget", name, getattr(self, name), optional=False)
        for name in ("max_tokens", "max_output_bytes"):
            _positive_int("Budget", name, getattr(self, name), optional=True)
        for name in ("max_media_bytes", "max_reply_bytes"):
            value = getattr(self, name)
            _positive_int("Budget", name, value, optional=False)
            if value > MAX_RECORD_BYTES:
                raise ConfigError(
                    f"Budget.{name} must be at most {MAX_RECORD_BYTES} (16 MiB), got {value!r}: "
                    "larger records would make trace lines fsm-agent check cannot read"
                )
        _positive_number("Budget", "max_cost", self.max_cost, allow_zero=True)
        _positive_number("Budget", "max_wall_clock_s", self.max_wall_clock_s)

    def to_dict(self) -> dict[str, Any]:
        return _plain_fields(self)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for read tools (and writes that declare downstream dedup): R5 of
    docs/concepts/rules.md.

    ``max_attempts`` counts the first attempt. The n-th retry waits
    ``min(backoff_s * multiplier**(n-1), max_backoff_s)`` seconds, and only if that wait
    ends inside the wall-clock budget.
    """

    max_attempts: int = 2
    backoff_s: float = 0.05
    multiplier: float = 2.0
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        _positive_int("RetryPolicy", "max_attempts", self.max_attempts, optional=False)
        _positive_number("RetryPolicy", "backoff_s", self.backoff_s, allow_zero=True)
        _positive_number("RetryPolicy", "multiplier", self.multiplier)
        _positive_number("RetryPolicy", "max_backoff_s", self.max_backoff_s, allow_zero=True)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.backoff_s * self.multiplier ** (attempt - 1), self.max_backoff_s))

    def to_dict(self) -> dict[str, Any]:
        return _plain_fields(self)


def _plain_fields(settings: Budget | RetryPolicy) -> dict[str, Any]:
    """The fields of a settings object whose values are all numbers or ``None``: what
    ``dataclasses.asdict`` gives, without its deep copy (read twice per run, for the
    trace header and the stored one)."""
    names = _NAMES.get(type(settings))
    if names is None:
        names = _NAMES[type(settings)] = tuple(f.name for f in fields(settings))
    return {name: getattr(settings, name) for name in names}


_NAMES: dict[type, tuple[str, ...]] = {}


class Metered(NamedTuple):
    """What one reply's ``usage`` counts. ``tokens is None``: no usable token count;
    ``cost is None``: no usable cost. The budget guards count an unmetered reply as over
    a set limit, because it is never free (R9)."""

    input_tokens: int
    output_tokens: int
    tokens: int | None
    cost: float | None


def metered(usage: Any) -> Metered:
    """Read a reply's ``usage``: the loop counts with this, and the checker recomputes
    the counters with it (same order, same float sums). Counts must be whole numbers in
    ``[0, 10**15)`` and the cost a number in ``[0, 1e12)``; anything else is unusable."""
    if not isinstance(usage, dict):
        return Metered(0, 0, None, None)
    inp = _whole(usage, "input_tokens", "prompt_tokens")
    out = _whole(usage, "output_tokens", "completion_tokens")
    total = _whole(usage, "total_tokens")
    tokens = (
        None
        if inp is None and out is None and total is None
        else total
        if total is not None
        else (inp or 0) + (out or 0)
    )
    cost = usage.get("cost")
    if not (isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 <= cost < 1e12):
        cost = None
    return Metered(inp or 0, out or 0, tokens, None if cost is None else float(cost))


def _whole(usage: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**15:
            return value
    return None
