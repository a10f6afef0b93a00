"""Transition coverage: count the edges runs take, report them, draw them.

:class:`TransitionCoverage` is an interceptor: its ``on_event`` counts the entry of one
machine's table (the default one unless given another; runs whose header names another
machine are not counted) that every ``transition`` event took. Installed
(:meth:`~TransitionCoverage.install`, as the pytest plugin does), it watches every run
driven in this context, whatever runtime drives it
(:func:`~fsm_agent._runtime.interceptors.watch`). The
report lists every transition of the table; :func:`write_html` writes a DOT diagram whose edges
are coloured by hit count, an SVG of it when Graphviz ``dot`` is installed, and an HTML
page with the diagram (or the DOT source) and the table.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from pathlib import Path

from fsm_agent._core.events import Event, RunStarted, Transitioned
from fsm_agent._core.select import select_recorded
from fsm_agent._core.table import DEFAULT_MACHINE, INITIAL_STATE, Machine, Transition
from fsm_agent._render.dot import Overlay, machine_dot
from fsm_agent._render.engine import RenderError, render
from fsm_agent._runtime.interceptors import Interceptor, unwatch, watch

__all__ = ["TransitionCoverage", "edge_of", "to_dot", "write_html"]


def edge_of(event: Transitioned, machine: Machine = DEFAULT_MACHINE) -> Transition | None:
    """The entry of ``machine``'s table a ``transition`` event took: the one its recorded
    guard outcomes select (``None`` for an event that table cannot have produced)."""
    try:
        edge = select_recorded(event.source, event.trigger, event.guards, machine=machine)
    except LookupError:
        return None
    return edge if edge is not None and edge.dest == event.dest else None


_NEVER = "#d62728"  # red: an edge no test took
_UNREACHABLE = "#999999"  # grey: an edge the application cannot take
_SHADES = ("#9ecae1", "#4292c6", "#08519c")  # light to dark blue as hits grow


class TransitionCoverage(Interceptor):
    """Hit counts per transition of ``machine``'s table, from the events it sees.

    ``unreachable`` maps edge indexes to why the application cannot take them
    (:func:`fsm_agent.testing._reachability.unreachable_edges`): they are listed apart and
    left out of :attr:`percent`, unless a run takes one anyway (then the reason was wrong
    and the edge counts as reachable)."""

    def __init__(
        self, machine: Machine = DEFAULT_MACHINE, unreachable: Mapping[int, str] | None = None
    ) -> None:
        self.machine = machine
        self.unreachable = dict(unreachable or {})
        self.hits = [0] * len(machine.transitions)
        # run id -> machine hash, from the headers seen (a resumed run shows none).
        self._machines: dict[str, str] = {}

    def on_event(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._machines[event.run_id] = event.machine_hash
        elif isinstance(event, Transitioned):
            if self._machines.get(event.run_id, self.machine.hash) != self.machine.hash:
                return  # a run of another machine
            edge = edge_of(event, self.machine)
            if edge is not None:
                self.hits[edge.index] += 1

    def install(self) -> None:
        """Watch every run driven from now on in this context (until :meth:`uninstall`;
        installing twice watches once)."""
        watch(self)

    def uninstall(self) -> None:
        """Stop watching, whichever other coverages were installed or removed since."""
        unwatch(self)

    def reachable(self) -> list[int]:
        """The edges that count: not known unreachable, or taken anyway."""
        return [i for i, h in enumerate(self.hits) if h or i not in self.unreachable]

    def unreachable_now(self) -> list[int]:
        """The edges known unreachable (and indeed never taken)."""
        return [i for i, h in enumerate(self.hits) if not h and i in self.unreachable]

    @property
    def percent(self) -> float:
        counted = self.reachable()
        taken = sum(1 for i in counted if self.hits[i])
        return 100.0 * taken / len(counted) if counted else 100.0

    def never_taken(self) -> list[int]:
        """The reachable edges no run took."""
        return [i for i in self.reachable() if not self.hits[i]]

    def report_lines(self) -> list[str]:
        """The table with hit counts, then the transitions never taken."""
        rows = [
            (str(i), t.trigger, f"{t.source} -> {t.dest}", ", ".join(t.guards) or "-", str(h))
            for i, (t, h) in enumerate(zip(self.machine.transitions, self.hits, strict=False))
        ]
        head = ("#", "trigger", "source -> dest", "guards", "hits")
        widths = [max(len(r[c]) for r in [head, *rows]) for c in range(5)]

        def fmt(r: tuple[str, ...]) -> str:
            cells = [r[c].ljust(widths[c]) for c in range(4)] + [r[4].rjust(widths[4])]
            return "  ".join(cells).rstrip()

        lines = [fmt(head), *(fmt(r) for r in rows)]
        counted = self.reachable()
        taken = len(counted) - len(self.never_taken())
        unreachable = self.unreachable_now()
        apart = f" ({len(unreachable)} unreachable, not counted)" if unreachable else ""
        lines.append(f"transition coverage: {taken}/{len(counted)} = {self.percent:.1f}%{apart}")
        for i in self.never_taken():
            t = self.machine.transitions[i]
            meaning = f": {t.rule}" if t.rule else ""
            lines.append(f"never taken: #{i} {t.label} ({t.source} -> {t.dest}){meaning}")
        for i in unreachable:
            t = self.machine.transitions[i]
            lines.append(
                f"unreachable: #{i} {t.label} ({t.source} -> {t.dest}): {self.unreachable[i]}"
            )
        return lines


def _colour(hits: int, top: int) -> str:
    if hits == 0:
        return _NEVER
    share = hits / top if top else 1.0
    return _SHADES[0] if share < 0.1 else _SHADES[1] if share < 0.5 else _SHADES[2]


def to_dot(coverage: TransitionCoverage) -> str:
    """The machine diagram (the renderer's, from the same table) as a heat map of hits."""
    table = coverage.machine.transitions
    taken = [t for t, h in zip(table, coverage.hits, strict=True) if h]
    visited = frozenset({INITIAL_STATE, *(t.source for t in taken), *(t.dest for t in taken)})
    overlay = Overlay(
        counts=dict(enumerate(coverage.hits)),
        visited=visited,
        heat=True,
        caption=f"transition coverage {coverage.percent:.1f}% "
        f"({len(coverage.never_taken())} never taken, grey)",
    )
    return machine_dot(overlay, machine=coverage.machine)


def write_html(directory: Path, coverage: TransitionCoverage) -> list[Path]:
    """Write ``coverage.dot``, ``coverage.svg`` (when ``dot`` is installed) and
    ``index.html`` into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    dot_text = to_dot(coverage)
    dot_path = directory / "coverage.dot"
    dot_path.write_text(dot_text, encoding="utf-8")
    written = [dot_path]
    svg = _render_svg(dot_text)
    if svg is not None:
        svg_path = directory / "coverage.svg"
        svg_path.write_text(svg, encoding="utf-8")
        written.append(svg_path)
    top = max(coverage.hits, default=0)
    apart = set(coverage.unreachable_now())

    def row(i: int, t: Transition, h: int) -> str:
        colour = _UNREACHABLE if i in apart else _colour(h, top)
        meaning = f"unreachable: {coverage.unreachable[i]}" if i in apart else t.rule
        return (
            f"<tr><td>{i}</td><td>{html.escape(t.trigger)}</td>"
            f"<td>{html.escape(t.source)} → {html.escape(t.dest)}</td>"
            f"<td>{html.escape(', '.join(t.guards) or '-')}</td>"
            f'<td style="background:{colour};color:white;text-align:right">{h}</td>'
            f"<td>{html.escape(meaning)}</td></tr>"
        )

    rows = "\n".join(
        row(i, t, h)
        for i, (t, h) in enumerate(zip(coverage.machine.transitions, coverage.hits, strict=False))
    )
    picture = (
        _fit(svg[svg.find("<svg") :])
        if svg is not None
        else "<p>No Graphviz renderer is installed, so no picture was drawn; "
        "render <code>coverage.dot</code> with it:</p><pre>" + html.escape(dot_text) + "</pre>"
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>fsm-agent transition coverage</title>
<style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;border-bottom:1px solid #ddd}}
svg{{max-width:100%;max-height:90vh;height:auto;display:block}}
</style></head><body>
<h1>Transition coverage: {coverage.percent:.1f}%</h1>
<p>Machine: {html.escape(coverage.machine.name)} ({html.escape(coverage.machine.hash[:12])}).
{len(coverage.never_taken())} of {len(coverage.reachable())} reachable transitions never taken
(red rows, grey arrows); darker arrows were taken more often.
{len(apart)} transitions this application cannot take are not counted (grey rows).</p>
{picture}
<table><tr><th>#</th><th>trigger</th><th>source → dest</th><th>guards</th><th>hits</th>
<th>meaning</th></tr>
{rows}
</table></body></html>
"""
    page_path = directory / "index.html"
    page_path.write_text(page, encoding="utf-8")
    written.append(page_path)
    return written


def _fit(svg: str) -> str:
    """The SVG scaled to the window: Graphviz writes a fixed size in points, which
    overflows the page; without it (the ``viewBox`` stays) the page's CSS sizes it."""
    head_end = svg.find(">")
    head = re.sub(r'\s(width|height)="[^"]*"', "", svg[:head_end])
    return head + svg[head_end:]


def _render_svg(dot_text: str) -> str | None:
    try:
        return render(dot_text, "svg").decode("utf-8")
    except RenderError:
        return None  # no Graphviz here: the page shows the DOT source and the table
