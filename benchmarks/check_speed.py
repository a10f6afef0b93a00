"""``fsm-agent check`` throughput: events verified per second on a 200,000-event trace.

The trace is a real recorded run (batches of three reads, one transient failure retried)
repeated with fresh call ids (benchmarks/long_trace.py). Timed: reading the file and
verifying every event (``check_file``), best of 3 in one process, plus the parse alone so
the verification's own share is visible. Target (issue 3): >= 200,000 events/s.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from long_trace import write_long_trace
from timing import best

from fsm_agent.trace.checker import check_events, check_file, load_trace

EVENTS = 200_000
TARGET = 200_000
REPEATS = 3


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.jsonl"
        n = write_long_trace(path, EVENTS)
        size_mb = path.stat().st_size / 1e6
        violations = check_file(path)
        if violations:
            print(f"the benchmark trace is not valid: {violations[0]}", file=sys.stderr)
            return 1
        events = load_trace(path)
        total = best(lambda: check_file(path), REPEATS)
        parse = best(lambda: load_trace(path), REPEATS)
        verify = best(lambda: check_events(events), REPEATS)
    rate = n / total
    print(
        f"check: {n} events ({size_mb:.1f} MB) in {total * 1000:.0f} ms = "
        f"{rate:,.0f} events/s (read+parse {parse * 1000:.0f} ms, verify "
        f"{verify * 1000:.0f} ms = {n / verify:,.0f} events/s)"
    )
    print(
        f"check: {rate / TARGET:.2f}x the {TARGET:,} events/s target "
        f"({'ok' if rate >= TARGET else 'BELOW TARGET'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
