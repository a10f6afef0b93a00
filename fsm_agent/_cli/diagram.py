"""``fsm-agent diagram`` and ``fsm-agent replay``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent._cli._output import Input, refuse_clobber, write_output
from fsm_agent._core.table import DEFAULT_MACHINE, Machine
from fsm_agent._errors import ConfigError, TraceError, UsageError
from fsm_agent._render.dot import DETAILS, Overlay, machine_dot
from fsm_agent._render.engine import RENDERERS, RenderError, render
from fsm_agent._render.mermaid import machine_mermaid
from fsm_agent._render.replay import MAX_TRACE_BYTES, Replay, StepError, aggregate_overlay
from fsm_agent._render.svg import add_titles, titles

__all__ = ["load_machine", "register"]

_FORMATS = ("svg", "png", "dot", "mermaid")
_SUFFIXES = {
    ".svg": "svg",
    ".png": "png",
    ".dot": "dot",
    ".gv": "dot",
    ".mmd": "mermaid",
    ".mermaid": "mermaid",
}


def register(subparsers: Any) -> None:
    d = subparsers.add_parser(
        "diagram",
        help="draw the run machine from its transition table",
        description="Draw the run machine: by default the overview (one arrow per "
        "source -> destination; hover an arrow in the SVG for its guards), or every guard "
        "with --detail full. SVG/PNG use Graphviz 'dot' when it is on PATH, else the "
        "pip-installed WebAssembly Graphviz (SVG only).",
    )
    d.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    _machine_flag(d, "draw the application's machine")
    d.add_argument(
        "--format", choices=_FORMATS, help="output format (default: from the -o suffix, else svg)"
    )
    _renderer_flags(d)
    d.set_defaults(handler=run_diagram)

    r = subparsers.add_parser(
        "replay",
        help="step through a trace over the machine, or draw a frame of it",
        description="Without -o/--html: step through the trace (keys in a terminal, text "
        "otherwise). -o writes the frame at --step (default: the last step); "
        "--html writes a self-contained viewer; --aggregate draws one heat map "
        "of edge counts over all the given traces.",
    )
    r.add_argument("traces", nargs="+", metavar="TRACE", help="JSON Lines trace file(s)")
    r.add_argument(
        "--step",
        type=int,
        metavar="N",
        help="step N (0 is the run_start header; default: the last step)",
    )
    r.add_argument("-o", "--output", metavar="FILE", help="write the frame here")
    r.add_argument(
        "--format",
        choices=("svg", "png", "dot"),
        help="frame format (default: from the -o suffix, else svg)",
    )
    r.add_argument("--html", metavar="FILE", help="write the step-through HTML viewer here")
    r.add_argument(
        "--max-trace-bytes",
        type=_byte_count,
        default=MAX_TRACE_BYTES,
        metavar="N",
        help=f"refuse a trace file larger than N bytes (default {MAX_TRACE_BYTES}: a "
        "replay holds the whole trace in memory, up to about 15 times its size)",
    )
    r.add_argument(
        "--aggregate",
        action="store_true",
        help="draw one heat map of edge counts over all TRACEs (needs -o)",
    )
    _machine_flag(r, "replay traces of the application's machine")
    _renderer_flags(r)
    r.set_defaults(handler=run_replay)


def _machine_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--machine",
        "--app",
        dest="machine",
        metavar="MODULE:NAME",
        help=f"{what} instead of the built-in one: NAME is a Machine "
        "(fsm_agent._core.engine.compile_machine builds one), a function returning one, or "
        "a function returning a Runtime (its runtime.machine, with the rows of its rules)",
    )


def _byte_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of bytes >= 1, got {text!r}")
    return int(text)


def _renderer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--detail",
        choices=DETAILS,
        default="overview",
        help="overview: one arrow per source -> destination with its triggers (default); "
        "full: one arrow per trigger with every guard, numbered by priority",
    )
    p.add_argument(
        "--renderer",
        choices=RENDERERS,
        default=None,
        help="force Graphviz 'dot' or the WebAssembly build (default: auto, or "
        "$FSM_AGENT_RENDERER)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="say which renderer ran")


def _format(args: argparse.Namespace, allowed: tuple[str, ...]) -> str:
    if args.format:
        return str(args.format)
    if args.output:
        suffix = Path(args.output).suffix.lower()
        fmt = _SUFFIXES.get(suffix)
        if fmt is None or fmt not in allowed:
            raise UsageError(
                f"cannot tell the format from {args.output!r}: use --format "
                f"{'|'.join(allowed)} or a suffix such as .svg"
            )
        return fmt
    return "svg"


def load_machine(spec: str | None) -> Machine:
    """The machine ``--machine MODULE:NAME`` names (the default one without it)."""
    if spec is None:
        return DEFAULT_MACHINE
    from fsm_agent._runtime.runtime import Runtime

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--machine must be MODULE:NAME, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # an application module next to where it runs
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load --machine {spec}: {exc}") from None
    except ConfigError as exc:  # compile_machine refused the module's table
        raise UsageError(f"--machine {spec}: {exc}") from None
    if callable(found) and not isinstance(found, Machine):
        try:
            found = found()
        except Exception as exc:  # the application's own error: one line, exit 2
            raise UsageError(f"--machine {spec} failed: {type(exc).__name__}: {exc}") from None
    if isinstance(found, Runtime):
        found = found.machine
    if not isinstance(found, Machine):
        raise UsageError(
            f"--machine {spec} is {type(found).__name__}, not a Machine (or a function "
            "returning a Machine or a Runtime)"
        )
    return found


def _emit(
    args: argparse.Namespace,
    overlay: Overlay | None,
    fmt: str,
    machine: Machine = DEFAULT_MACHINE,
    inputs: Sequence[Input] = (),
) -> None:
    """Write ``machine`` (with ``overlay``) as ``fmt`` to ``args.output`` (or stdout)."""
    dot_source = machine_dot(overlay, args.detail, machine)
    if fmt == "dot":
        data = dot_source.encode("utf-8")
    else:
        rendered = render(dot_source, fmt, args.renderer)
        if args.verbose:
            print(f"rendered with {rendered.renderer}", file=sys.stderr)
        data = bytes(rendered)
        if fmt == "svg":
            data = add_titles(data, titles(args.detail, machine))
    _write(args.output, data, binary=fmt == "png", inputs=inputs)


def _write(
    output: str | None,
    data: bytes,
    *,
    binary: bool = False,
    flag: str = "-o",
    inputs: Sequence[Input] = (),
) -> None:
    if output is None:
        if binary and sys.stdout.isatty():
            raise UsageError("PNG is binary: write it to a file with -o FILE")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    write_output(flag, output, data, inputs)


def _guard(run: Any) -> int:
    try:
        return int(run())
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (TraceError, StepError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run_diagram(args: argparse.Namespace) -> int:
    def go() -> int:
        fmt = _format(args, _FORMATS)
        machine = load_machine(args.machine)
        if fmt == "mermaid":
            _write(args.output, machine_mermaid(args.detail, machine).encode("utf-8"))
        else:
            _emit(args, None, fmt, machine)
        return 0

    return _guard(go)


def _replay_inputs(args: argparse.Namespace) -> list[Input]:
    """The traces, and each output for the other: ``-o X --html X`` would keep one."""
    inputs: list[Input] = [("TRACE", p) for p in args.traces]
    if args.output:
        refuse_clobber("-o", args.output, inputs)
    if args.html:
        refuse_clobber("--html", args.html, inputs)
        if args.output:
            refuse_clobber("--html", args.html, [("-o", args.output)])
    return inputs


def run_replay(args: argparse.Namespace) -> int:
    def go() -> int:
        # Refused before anything is read or drawn: nothing is written if one is bad.
        inputs = _replay_inputs(args)
        limit = args.max_trace_bytes
        if args.aggregate:
            if not args.output:
                raise UsageError("--aggregate draws a picture: give -o FILE")
            if args.step is not None or args.html:
                raise UsageError("--aggregate takes no --step or --html")
            machine = load_machine(args.machine)
            overlay = aggregate_overlay(
                Replay(p, machine=machine, max_bytes=limit) for p in args.traces
            )
            _emit(args, overlay, _format(args, ("svg", "png", "dot")), machine, inputs)
            return 0
        if len(args.traces) != 1:
            raise UsageError(
                f"replay takes one trace ({len(args.traces)} given); use "
                "--aggregate for a heat map over several"
            )
        replay = Replay(args.traces[0], machine=load_machine(args.machine), max_bytes=limit)
        step = replay.step(args.step).index if args.step is not None else None
        if args.output:
            frame: Overlay = replay.overlay(step)
            _emit(args, frame, _format(args, ("svg", "png", "dot")), replay.machine, inputs)
        if args.html:
            from fsm_agent._render.html import viewer_html

            page = viewer_html(replay, args.renderer, step or 0, detail=args.detail)
            _write(args.html, page.encode("utf-8"), flag="--html", inputs=inputs)
            if args.verbose:
                print(f"wrote {args.html} ({len(replay)} steps)", file=sys.stderr)
        if args.output or args.html:
            return 0
        from fsm_agent._render.stepper import print_steps, step_interactively

        if sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM") != "dumb":
            step_interactively(replay, step or 0)
        else:
            print_steps(replay, sys.stdout, step)
        return 0

    return _guard(go)
