"""``fsm-agent check`` on a large trace: its time as a ratio to merely parsing the same
lines, and its peak memory.

A valid chained trace of ``--mb`` megabytes (default 1,000; 200 when the disk has less
than 3 GB free) is generated (benchmarks/long_trace.py: a real run's rounds repeated,
every guard and counter recomputable). In one process, best of ``--repeats``:

* parse: read every line and parse it with the checker's own parser
  (``fsm_agent._trace.checker.parse_line``, the stdlib's C scanner);
* check: ``check_trace`` — read, verify every chain link, parse, recompute and verify.

The ratio check/parse is the figure (target <= 1.5); absolute speeds vary with the load
of a shared machine, a ratio measured in one run much less. Peak RSS is measured in a
child process that only checks the file (target <= 200 MB for 1 GB). With orjson
installed, the same check with orjson as the line parser is timed too.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from long_trace import write_long_trace

from fsm_agent._trace import checker
from fsm_agent._trace.checker import check_trace, parse_line

TARGET_RATIO = 1.5
TARGET_RSS_MB = 200

_CHILD = """
import resource, sys
from fsm_agent._trace.checker import check_trace
report = check_trace(sys.argv[1])
assert report.ok, report.violations[:3]
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def parse_only(path: Path) -> int:
    n = 0
    gc.disable()
    try:
        with open(path, "rb") as handle:
            for line in handle:
                parse_line(line[:-1])
                n += 1
    finally:
        gc.enable()
    return n


def _parse_with(loads: object, path: Path) -> None:
    with open(path, "rb") as handle:
        for line in handle:
            loads(line[:-1])  # type: ignore[operator]


def best(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    free_gb = shutil.disk_usage(tempfile.gettempdir()).free / 1e9
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1000 if free_gb > 3 else 200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.jsonl"
        events = write_long_trace(path, bytes_wanted=args.mb * 1_000_000)
        size_mb = path.stat().st_size / 1e6
        report = check_trace(path)
        if not report.ok:
            print(f"the benchmark trace is not valid: {report.violations[0]}", file=sys.stderr)
            return 1
        # Alternate the two so a change of machine load hits both alike.
        parse_times, check_times = [], []
        for _ in range(args.repeats):
            parse_times.append(best(lambda: parse_only(path), 1))
            check_times.append(best(lambda: check_trace(path), 1))
        parse, check = min(parse_times), min(check_times)
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        rss_mb = int(child.stdout.strip()) / 1024
        print(
            f"check: {events:,} events ({size_mb:,.0f} MB): parse only {parse:.1f} s "
            f"({events / parse:,.0f} lines/s), check {check:.1f} s ({events / check:,.0f} "
            f"events/s): ratio {check / parse:.2f} (target <= {TARGET_RATIO}: "
            f"{'ok' if check / parse <= TARGET_RATIO else 'ABOVE TARGET'})"
        )
        print(
            f"check: peak RSS {rss_mb:.0f} MB for {size_mb:,.0f} MB "
            f"({rss_mb / size_mb * 1000:.1f} kB per MB of trace; target <= {TARGET_RSS_MB} MB: "
            f"{'ok' if rss_mb <= TARGET_RSS_MB else 'ABOVE TARGET'})"
        )
        try:
            import orjson
        except ImportError:
            print("check: orjson not installed; accelerator not measured")
            return 0
        plain, fields = checker.parse_line, checker._chain_fields
        fast_loads: Any = orjson.loads  # its stub's signature differs from parse_line's
        checker.parse_line = fast_loads
        # Every line parsed whole, by parse_line (the loop's shortcut for a line closed
        # as its run's lines are parses with the stdlib's scanner in the loop itself).
        checker._chain_fields = lambda run: None
        try:
            fast = best(lambda: check_trace(path), args.repeats)
            fast_parse = best(lambda: _parse_with(orjson.loads, path), 1)
        finally:
            checker.parse_line, checker._chain_fields = plain, fields
        print(
            f"check with orjson: {fast:.1f} s ({check / fast:.2f}x faster end to end; its "
            f"ratio to orjson parsing alone: {fast / fast_parse:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
