"""``fsm-agent demo``: the scenarios of both seed articles (being written)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="run the scripted demo scenarios")
    p.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    raise NotImplementedError
