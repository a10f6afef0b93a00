"""Regenerate ``diagrams/`` (and the generated parts of ``docs/``):
``python -m fsm_agent._cli.regen TRACE_DIR OUT_DIR [DOCS_DIR]``.

Writes the machine from the table, ``run_machine.{dot,mmd,svg}`` (the overview) and
``run_machine_full.{dot,mmd,svg}`` (every guard), one ``replay_<scenario>.svg`` (the last
step) per ``<scenario>.jsonl`` in TRACE_DIR, and ``heatmap_demo.svg`` over them all. With
DOCS_DIR it also rewrites the rule-row tables of ``concepts/rules.md``
(:mod:`fsm_agent._render.docs`), draws ``assets/layers.{dot,svg}`` from the package's
imports (:mod:`fsm_agent._render.layers`), writes the events' JSON Schema,
``reference/events.schema.json`` (:func:`fsm_agent._core.events.json_schema`), and the
public surface, ``reference/surface.md`` (:mod:`fsm_agent._render.surface`).
``make diagrams`` runs the demo into a scratch folder and then this.

Committed pictures must not change with the machine that regenerates them, so they are
always laid out by the WebAssembly Graphviz (the exact version ``pyproject.toml``'s dev
extra pins), never by whatever ``dot`` is installed: two Graphviz versions lay the same
graph out differently. A test regenerates everything and compares bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fsm_agent._cli._output import write_output
from fsm_agent._core.events import json_schema_text
from fsm_agent._errors import TraceError, UsageError
from fsm_agent._render.docs import update_rule_rows
from fsm_agent._render.dot import machine_dot
from fsm_agent._render.engine import RenderError, render
from fsm_agent._render.layers import layer_dot
from fsm_agent._render.mermaid import machine_mermaid
from fsm_agent._render.replay import Replay, aggregate_overlay
from fsm_agent._render.surface import surface_page
from fsm_agent._render.svg import machine_svg

__all__ = [
    "COMMITTED_RENDERER",
    "EVENTS_SCHEMA",
    "RULES_PAGE",
    "SURFACE_PAGE",
    "main",
    "regenerate",
    "regenerate_docs",
]

#: The page whose rule-row tables are generated, relative to the docs folder.
RULES_PAGE = Path("concepts") / "rules.md"
#: The public surface, every namespace's ``__all__`` (:mod:`fsm_agent._render.surface`).
SURFACE_PAGE = Path("reference") / "surface.md"
#: The events' JSON Schema, relative to the docs folder.
EVENTS_SCHEMA = Path("reference") / "events.schema.json"

#: The one renderer that draws committed pictures (see the module docstring).
COMMITTED_RENDERER = "wasm"


def regenerate(trace_dir: Path, out_dir: Path) -> list[Path]:
    """Write every picture; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    traces = sorted(trace_dir.glob("*.jsonl"))
    inputs = [("TRACE", str(p)) for p in traces]

    def write(name: str, data: bytes) -> None:
        path = out_dir / name
        write_output("OUT_DIR", str(path), data, inputs)
        written.append(path)

    for detail, stem in (("overview", "run_machine"), ("full", "run_machine_full")):
        write(f"{stem}.dot", machine_dot(detail=detail).encode("utf-8"))
        write(f"{stem}.mmd", machine_mermaid(detail).encode("utf-8"))
        write(f"{stem}.svg", machine_svg(None, detail, COMMITTED_RENDERER))
    replays = [Replay(p) for p in traces]
    for replay in replays:
        name = Path(replay.path).stem
        write(f"replay_{name}.svg", machine_svg(replay.overlay(), "overview", COMMITTED_RENDERER))
    if replays:
        heat = aggregate_overlay(replays)
        write("heatmap_demo.svg", machine_svg(heat, "overview", COMMITTED_RENDERER))
    return written


def regenerate_docs(docs_dir: Path) -> list[Path]:
    """Rewrite the generated parts of the docs; return the paths written."""
    rules = docs_dir / RULES_PAGE
    page = update_rule_rows(rules.read_text(encoding="utf-8"))
    write_output("DOCS_DIR", str(rules), page.encode("utf-8"))
    assets = docs_dir / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    dot = layer_dot(Path(__file__).resolve().parents[1])  # the fsm_agent package folder
    write_output("DOCS_DIR", str(assets / "layers.dot"), dot.encode("utf-8"))
    write_output("DOCS_DIR", str(assets / "layers.svg"), render(dot, "svg", COMMITTED_RENDERER))
    schema = docs_dir / EVENTS_SCHEMA
    schema.parent.mkdir(parents=True, exist_ok=True)
    write_output("DOCS_DIR", str(schema), json_schema_text().encode("utf-8"))
    surface = docs_dir / SURFACE_PAGE
    write_output("DOCS_DIR", str(surface), surface_page().encode("utf-8"))
    return [rules, assets / "layers.dot", assets / "layers.svg", schema, surface]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m fsm_agent._cli.regen TRACE_DIR OUT_DIR [DOCS_DIR]", file=sys.stderr)
        return 2
    trace_dir = Path(args[0])
    if not trace_dir.is_dir():
        print(f"error: {trace_dir} is not a folder of traces", file=sys.stderr)
        return 2
    try:
        written = regenerate(trace_dir, Path(args[1]))
        if len(args) == 3:
            written += regenerate_docs(Path(args[2]))
    except (TraceError, RenderError, UsageError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} file(s) to {' and '.join(args[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
