"""Token prices, so a model's usage can be charged to the run's cost budget.

Prices come from `genai-prices <https://pypi.org/project/genai-prices/>`_, a price
database maintained by the Pydantic team and shipped as data inside the package (no
network at run time: upgrade the package for new prices). It knows the providers' model
names, dated snapshots included, and tells providers apart by the API's base URL, so a
model served by Groq or OpenRouter is priced at that provider's rate.

``prices=`` on any adapter overrides it: a mapping of model names to :class:`Price`,
looked up first (an exact name, else the longest name the model extends with a ``-``
suffix). ``price_db=False`` prices only what ``prices`` names.

A reply whose model has no price is *not* free: the adapter reports ``"cost": None`` and
a run with a cost budget stops on it (``budget_exhausted/cost``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["DEFAULT_PRICES", "Price", "db_cost", "find_price"]


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


#: No hand-kept prices any more (they went stale): the database prices every model it
#: knows. Kept, empty, so that ``{**DEFAULT_PRICES, "my-model": Price(...)}`` still works.
DEFAULT_PRICES: Mapping[str, Price] = MappingProxyType({})


def find_price(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of ``model`` in ``prices``: an exact entry, else the longest entry it
    extends with a ``-`` suffix (a dated snapshot such as ``gpt-4o-mini-2024-07-18``),
    else ``None``."""
    if model in prices:
        return prices[model]
    best: str | None = None
    for name in prices:
        if model.startswith(name + "-") and (best is None or len(name) > len(best)):
            best = name
    return prices[best] if best is not None else None


@functools.lru_cache(maxsize=1024)
def _db_price(model: str, provider_url: str | None) -> Any:
    """The database's price table for ``model`` (looked up once per model and URL: the
    lookup scans every provider), or ``None``."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - the adapters' extras install it
        return None
    nothing = Usage(input_tokens=0, output_tokens=0)
    try:
        return calc_price(nothing, model, provider_api_url=provider_url).model_price
    except LookupError:
        if provider_url is None:
            return None
    try:  # a compatible server the database does not know by URL: by model name
        return calc_price(nothing, model).model_price
    except LookupError:
        return None


def db_cost(
    model: str,
    *,
    provider_url: str | None,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> float | None:
    """The database's price of one reply in USD, or ``None`` for a model it does not know
    (or when genai-prices is not installed)."""
    price = _db_price(model, provider_url)
    if price is None:
        return None
    from genai_prices import Usage

    usage = Usage(
        # genai-prices counts cache reads and writes inside input_tokens
        input_tokens=input_tokens + cached_tokens + cache_write_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cached_tokens,
        cache_write_tokens=cache_write_tokens,
    )
    return float(price.calc_price(usage)["total_price"])
