"""``fsm-agent check TRACE...``: verify recorded traces against the run machine."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fsm_agent.errors import TraceError
from fsm_agent.trace.checker import check_paths

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check",
        help="verify traces against the transition table and the invariants",
        description="Check that every event of each trace is a legal transition of the run "
        "machine and that the invariants hold. Exit 0: all valid; 1: violations "
        "found; 2: a trace could not be read.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="JSON Lines trace file(s)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    p.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    code = 0
    for path, outcome in check_paths(args.traces).items():
        if isinstance(outcome, TraceError):
            print(f"error: {outcome}", file=sys.stderr)
            code = 2
            continue
        for violation in outcome:
            print(violation.format(path))
        if outcome:
            code = max(code, 1)
            print(f"{path}: {len(outcome)} violation(s)", file=sys.stderr)
        elif not args.quiet:
            print(f"{path}: ok")
    return code
