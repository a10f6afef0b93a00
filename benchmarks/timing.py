"""Timing and instruction-count helpers shared by the benchmarks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls, in seconds (the least disturbed by other work)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def instructions(code: str) -> int | None:
    """Instructions ``python -c code`` executes (run from this folder), counted by
    valgrind's callgrind: the same total on every run, whatever else the machine does;
    ``None`` without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, "-c", code],
            capture_output=True, text=True, check=True, cwd=Path(__file__).parent,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
    found = re.search(r"Collected : (\d+)", out.stderr)
    return int(found.group(1)) if found else None
