"""Regenerate ``diagrams/``: ``python -m fsm_agent.cli.regen TRACE_DIR OUT_DIR``.

Writes ``run_machine.{dot,mmd,svg}`` from the table, one ``replay_<scenario>.svg`` (the
last step) per ``<scenario>.jsonl`` in TRACE_DIR, and ``heatmap_demo.svg`` over them all.
``make diagrams`` runs the demo into a scratch folder and then this.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fsm_agent.errors import TraceError
from fsm_agent.render.dot import machine_dot
from fsm_agent.render.engine import RenderError, render
from fsm_agent.render.mermaid import machine_mermaid
from fsm_agent.render.replay import Replay, aggregate_overlay

__all__ = ["main", "regenerate"]


def regenerate(trace_dir: Path, out_dir: Path) -> list[Path]:
    """Write every picture; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def write(name: str, data: bytes) -> None:
        path = out_dir / name
        path.write_bytes(data)
        written.append(path)

    dot = machine_dot()
    write("run_machine.dot", dot.encode("utf-8"))
    write("run_machine.mmd", machine_mermaid().encode("utf-8"))
    write("run_machine.svg", render(dot))
    replays = [Replay(p) for p in sorted(trace_dir.glob("*.jsonl"))]
    for replay in replays:
        name = Path(replay.path).stem
        write(f"replay_{name}.svg", render(machine_dot(replay.overlay())))
    if replays:
        write("heatmap_demo.svg", render(machine_dot(aggregate_overlay(replays))))
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m fsm_agent.cli.regen TRACE_DIR OUT_DIR", file=sys.stderr)
        return 2
    trace_dir = Path(args[0])
    if not trace_dir.is_dir():
        print(f"error: {trace_dir} is not a folder of traces", file=sys.stderr)
        return 2
    try:
        written = regenerate(trace_dir, Path(args[1]))
    except (TraceError, RenderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} file(s) to {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
