"""Time to render one replay frame of a 10,000-event trace (``fsm-agent replay --step``).

Timed separately: reading the trace and walking it into steps, building the frame's
overlay and DOT, and laying it out to SVG with each renderer available here (Graphviz
``dot`` as a subprocess, the WebAssembly build in-process; its first call in a process
compiles the module, so cold and warm are both shown). Best of 5. Target (issue 3):
a frame in under 1 s; the picture's size depends on the machine, not the trace length.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from long_trace import write_long_trace
from timing import best

from fsm_agent._render.dot import machine_dot
from fsm_agent._render.engine import RenderError, render
from fsm_agent._render.replay import Replay

EVENTS = 10_000
TARGET_S = 1.0
REPEATS = 5


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.jsonl"
        n = write_long_trace(path, EVENTS)
        load = best(lambda: Replay(path), REPEATS)
        replay = Replay(path)
        middle = len(replay) // 2
        frame = best(lambda: machine_dot(replay.overlay(middle)), REPEATS)
        dot = machine_dot(replay.overlay(middle))
        commands = {}
        for route in (["dot"] if shutil.which("dot") else []) + ["wasm"]:
            argv = [
                sys.executable,
                "-m",
                "fsm_agent",
                "replay",
                str(path),
                "--step",
                str(middle),
                "-o",
                str(Path(folder) / "frame.svg"),
                "--renderer",
                route,
            ]
            commands[route] = best(partial(subprocess.run, argv, check=True), REPEATS)
    print(
        f"replay frame: {n} events; load+walk {load * 1000:.1f} ms, overlay+DOT "
        f"{frame * 1000:.1f} ms"
    )
    routes = (["dot"] if shutil.which("dot") else []) + ["wasm"]
    for route in routes:
        try:
            start = time.perf_counter()
            render(dot, "svg", route)
            cold = time.perf_counter() - start
        except RenderError as exc:
            print(f"replay frame: {route}: not available ({exc})")
            continue
        warm = best(partial(render, dot, "svg", route), REPEATS)
        total = load + frame + warm
        print(
            f"replay frame: {route}: layout {warm * 1000:.0f} ms warm ({cold * 1000:.0f} ms "
            f"first call); whole frame {total * 1000:.0f} ms = {total / TARGET_S:.2f}x the "
            f"{TARGET_S:.0f} s budget ({'ok' if total < TARGET_S else 'OVER BUDGET'})"
        )
    for route, seconds in commands.items():
        print(
            f"replay frame: `fsm-agent replay --step N -o frame.svg --renderer {route}` "
            f"end to end (new process, imports included): {seconds * 1000:.0f} ms = "
            f"{seconds / TARGET_S:.2f}x the budget"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
