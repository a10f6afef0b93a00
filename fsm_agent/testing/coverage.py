"""Transition coverage: count the edges runs take, report them, draw them.

:class:`TransitionCoverage` listens on ``fsm_agent.run.TRANSITION_LISTENERS`` (every
transition of every run in the process) and counts hits per table entry. The report
lists every transition of the table; :func:`write_html` writes a DOT diagram whose edges
are coloured by hit count, an SVG of it when Graphviz ``dot`` is installed, and an HTML
page with the diagram (or the DOT source) and the table.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path
from typing import Any

from fsm_agent.machine import INITIAL_STATE, STATES, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.run import TRANSITION_LISTENERS

__all__ = ["TransitionCoverage", "to_dot", "write_html"]

_NEVER = "#d62728"  # red: an edge no test took
_SHADES = ("#9ecae1", "#4292c6", "#08519c")  # light to dark blue as hits grow


class TransitionCoverage:
    """Hit counts per transition of the table, collected while installed."""

    def __init__(self) -> None:
        self.hits = [0] * len(TRANSITIONS)
        self._index = {id(t): i for i, t in enumerate(TRANSITIONS)}

    def __call__(self, run: Any, transition: Transition) -> None:
        self.hits[self._index[id(transition)]] += 1

    def install(self) -> None:
        if self not in TRANSITION_LISTENERS:
            TRANSITION_LISTENERS.append(self)

    def uninstall(self) -> None:
        if self in TRANSITION_LISTENERS:
            TRANSITION_LISTENERS.remove(self)

    @property
    def percent(self) -> float:
        taken = sum(1 for h in self.hits if h)
        return 100.0 * taken / len(self.hits) if self.hits else 100.0

    def never_taken(self) -> list[int]:
        return [i for i, h in enumerate(self.hits) if not h]

    def report_lines(self) -> list[str]:
        """The table with hit counts, then the transitions never taken."""
        rows = [(str(i), t.trigger, f"{t.source} -> {t.dest}", ", ".join(t.guards) or "-",
                 str(h)) for i, (t, h) in enumerate(zip(TRANSITIONS, self.hits, strict=False))]
        head = ("#", "trigger", "source -> dest", "guards", "hits")
        widths = [max(len(r[c]) for r in [head, *rows]) for c in range(5)]

        def fmt(r: tuple[str, ...]) -> str:
            cells = [r[c].ljust(widths[c]) for c in range(4)] + [r[4].rjust(widths[4])]
            return "  ".join(cells).rstrip()

        lines = [fmt(head), *(fmt(r) for r in rows)]
        taken = len(self.hits) - len(self.never_taken())
        lines.append(f"transition coverage: {taken}/{len(self.hits)} = {self.percent:.1f}%")
        for i in self.never_taken():
            t = TRANSITIONS[i]
            lines.append(f"never taken: #{i} {t.label} ({t.source} -> {t.dest})")
        return lines


def _colour(hits: int, top: int) -> str:
    if hits == 0:
        return _NEVER
    share = hits / top if top else 1.0
    return _SHADES[0] if share < 0.1 else _SHADES[1] if share < 0.5 else _SHADES[2]


def to_dot(hits: list[int]) -> str:
    """The machine as Graphviz DOT, each edge labelled ``#i trigger [guards] ×hits``."""
    top = max(hits, default=0)
    out = ["digraph run_machine {", "  rankdir=LR;",
           '  node [shape=box, style="rounded", fontname="Helvetica"];',
           '  edge [fontname="Helvetica", fontsize=9];',
           '  __start [shape=point, label=""];', f'  __start -> "{INITIAL_STATE}";']
    for state in STATES:
        shape = "doubleoctagon" if state in TERMINAL_STATES else "box"
        out.append(f'  "{state}" [shape={shape}];')
    for i, (t, h) in enumerate(zip(TRANSITIONS, hits, strict=False)):
        label = f"#{i} {t.label} ×{h}".replace('"', '\\"')
        width = 1 + 3 * (h / top) if top else 1
        out.append(f'  "{t.source}" -> "{t.dest}" [label="{label}", '
                   f'color="{_colour(h, top)}", fontcolor="{_colour(h, top)}", '
                   f'penwidth={width:.2f}];')
    out.append("}")
    return "\n".join(out) + "\n"


def write_html(directory: Path, coverage: TransitionCoverage) -> list[Path]:
    """Write ``coverage.dot``, ``coverage.svg`` (when ``dot`` is installed) and
    ``index.html`` into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    dot_text = to_dot(coverage.hits)
    dot_path = directory / "coverage.dot"
    dot_path.write_text(dot_text, encoding="utf-8")
    written = [dot_path]
    svg = _render_svg(dot_text)
    if svg is not None:
        svg_path = directory / "coverage.svg"
        svg_path.write_text(svg, encoding="utf-8")
        written.append(svg_path)
    top = max(coverage.hits, default=0)
    rows = "\n".join(
        f'<tr><td>{i}</td><td>{html.escape(t.trigger)}</td>'
        f'<td>{html.escape(t.source)} → {html.escape(t.dest)}</td>'
        f'<td>{html.escape(", ".join(t.guards) or "-")}</td>'
        f'<td style="background:{_colour(h, top)};color:white;text-align:right">{h}</td></tr>'
        for i, (t, h) in enumerate(zip(TRANSITIONS, coverage.hits, strict=False)))
    picture = (svg[svg.find("<svg"):] if svg is not None else
               "<p>Graphviz <code>dot</code> is not installed, so no picture was drawn; "
               "render <code>coverage.dot</code> with it:</p><pre>"
               + html.escape(dot_text) + "</pre>")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>fsm-agent transition coverage</title>
<style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;border-bottom:1px solid #ddd}}
</style></head><body>
<h1>Transition coverage: {coverage.percent:.1f}%</h1>
<p>{len(coverage.never_taken())} of {len(coverage.hits)} transitions never taken
(red); darker blue edges were taken more often.</p>
{picture}
<table><tr><th>#</th><th>trigger</th><th>source → dest</th><th>guards</th><th>hits</th></tr>
{rows}
</table></body></html>
"""
    page_path = directory / "index.html"
    page_path.write_text(page, encoding="utf-8")
    written.append(page_path)
    return written


def _render_svg(dot_text: str) -> str | None:
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        done = subprocess.run([dot, "-Tsvg"], input=dot_text, capture_output=True,
                              text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # a broken Graphviz install must not fail the test session
    return done.stdout
