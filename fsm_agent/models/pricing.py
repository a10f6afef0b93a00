"""Token prices, so a model's usage can be charged to the run's cost budget.

A reply whose model has no price here is *not* free: the adapter reports ``"cost": None``
and a run with a cost budget stops on it (``budget_exhausted/cost``). Prices change;
the defaults are list prices in USD per million tokens as published when this table was
written. Pass your own table (``prices=``) to any adapter to override them, e.g.
``{**DEFAULT_PRICES, "my-model": Price(0.2, 0.8)}``, or ``{}`` to price nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_PRICES", "Price", "find_price"]


@dataclass(frozen=True)
class Price:
    """USD per million tokens. Cache prices default to the input price (never cheaper
    than the provider would charge, so the budget errs on the safe side)."""

    input: float
    output: float
    cached_input: float | None = None  # OpenAI cached prompt tokens, Anthropic cache reads
    cache_write: float | None = None  # Anthropic cache creation

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input", "cache_write"):
            value = getattr(self, name)
            if value is None and name in ("cached_input", "cache_write"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Price.{name} must be a number >= 0, got {value!r}")

    def cost(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> float:
        """The charge for one reply; ``input_tokens`` excludes cached and cache-write ones."""
        cached = self.input if self.cached_input is None else self.cached_input
        write = self.input if self.cache_write is None else self.cache_write
        return (
            input_tokens * self.input
            + output_tokens * self.output
            + cached_tokens * cached
            + cache_write_tokens * write
        ) / 1_000_000


DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4o": Price(2.50, 10.00, cached_input=1.25),
    "gpt-4o-mini": Price(0.15, 0.60, cached_input=0.075),
    "gpt-4.1": Price(2.00, 8.00, cached_input=0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, cached_input=0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, cached_input=0.025),
    "claude-3-5-haiku": Price(0.80, 4.00, cached_input=0.08, cache_write=1.00),
    "claude-haiku-4-5": Price(1.00, 5.00, cached_input=0.10, cache_write=1.25),
    "claude-3-5-sonnet": Price(3.00, 15.00, cached_input=0.30, cache_write=3.75),
    "claude-3-7-sonnet": Price(3.00, 15.00, cached_input=0.30, cache_write=3.75),
    "claude-sonnet-4": Price(3.00, 15.00, cached_input=0.30, cache_write=3.75),
    "claude-sonnet-4-5": Price(3.00, 15.00, cached_input=0.30, cache_write=3.75),
    "claude-opus-4": Price(15.00, 75.00, cached_input=1.50, cache_write=18.75),
    "claude-opus-4-5": Price(5.00, 25.00, cached_input=0.50, cache_write=6.25),
}


def find_price(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of ``model``: an exact entry, else the longest entry it extends with a
    ``-`` suffix (a dated snapshot such as ``gpt-4o-mini-2024-07-18``), else ``None``."""
    if model in prices:
        return prices[model]
    best: str | None = None
    for name in prices:
        if model.startswith(name + "-") and (best is None or len(name) > len(best)):
            best = name
    return prices[best] if best is not None else None
