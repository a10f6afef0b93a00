"""The ``fsm-agent`` command line.

Each subcommand lives in its own module, which exposes ``register(subparsers)`` and sets
``handler`` (a function of the parsed arguments returning the exit code). Modules are
imported only when the command line runs, so ``import fsm_agent`` stays fast.

Exit codes: 0 success, 1 the command ran and found a problem (a failed check, a demo
mismatch), 2 bad usage or unreadable input. When the reader of the output goes away
(``fsm-agent runs show --json | head``) the command stops quietly with 0: the reader got
what it asked for.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from fsm_agent._version import __version__

__all__ = ["main"]

#: Modules that add a subcommand, in the order they appear in ``--help``.
COMMAND_MODULES: tuple[str, ...] = (
    "fsm_agent._cli.demo",
    "fsm_agent._cli.diagram",
    "fsm_agent._cli.check",
    "fsm_agent._cli.runs",
    "fsm_agent._cli.worker",
    "fsm_agent._cli.serve",
    "fsm_agent._cli.keys",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsm-agent",
        description="Run LLM tool-calling loops as explicit finite-state machines.",
    )
    parser.add_argument("--version", action="version", version=f"fsm-agent {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fsm-agent ... | head`
        # Python flushes stdout again at exit and would report the same broken pipe
        # there; pointing stdout at /dev/null makes that last flush a no-op.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
