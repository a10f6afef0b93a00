"""Budgets and the retry policy: small frozen values with one check each."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fsm_agent.errors import ConfigError

__all__ = ["Budget", "RetryPolicy"]


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
    """Limits checked before every new external operation (SPEC §2 rule 9).

    ``None`` means "no limit" for the dimensions that allow it. Counts are whole numbers
    >= 1; the model may still answer after the last permitted tool round.
    """

    max_tool_rounds: int = 8
    max_calls_per_round: int = 8
    max_total_calls: int = 32
    max_model_calls: int = 16
    max_tokens: int | None = None
    max_cost: float | None = None
    max_wall_clock_s: float | None = None
    max_output_bytes: int | None = 1_000_000

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
        _positive_number("Budget", "max_cost", self.max_cost, allow_zero=True)
        _positive_number("Budget", "max_wall_clock_s", self.max_wall_clock_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for read tools (and writes that declare downstream dedup), SPEC rule 5.

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
        return asdict(self)
