"""Timing helper shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls, in seconds (the least disturbed by other work)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
