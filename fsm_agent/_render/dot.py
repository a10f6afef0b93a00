"""The run machine as Graphviz DOT, built from the table, in two views, with an overlay.

The layout is ours (not ``GraphMachine``'s); the initial state is marked by a start dot and
terminal states have a double border.

``overview`` (the default of ``fsm-agent diagram``): top to bottom, the working states in
one box, one arrow per source → destination labelled with its triggers and row counts
(:class:`~fsm_agent._render.edges.Arrow`), ``cancel`` drawn once from the box, and the
terminal states left where the layout puts them next to their sources, so arrowheads do
not pile up on one column. Readable at README width (a test checks the text is at least
9 px high when the SVG is shown 900 px wide).

``full``: left to right, terminal states together in one column, every arrow labelled
``trigger [guards]``, numbered by priority where a trigger has several edges in one state.

Both views carry the full guard detail of each arrow as its SVG ``<title>`` (a tooltip;
added after layout by :func:`fsm_agent._render.svg.machine_svg`, so ``dot`` and the
WebAssembly build give the same text).

An :class:`Overlay` paints a replay frame or a heat map on either view: the nodes and
arrows keep their ids (``state-NAME``, ``edge-SOURCE-DEST`` in the overview,
``edge-SOURCE-TRIGGER-DEST`` in the full view) so the HTML viewer can restyle them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import graphviz

from fsm_agent._core.table import (
    DEFAULT_MACHINE,
    INITIAL_STATE,
    TERMINAL_STATES,
    WORKING_STATES,
    Machine,
    Transition,
)
from fsm_agent._render.edges import WORKING, Arrow, DrawnEdge, drawing

__all__ = [
    "DETAILS",
    "STATE_HELP",
    "Overlay",
    "arrows",
    "machine_dot",
    "machine_graph",
    "overview_graph",
]

#: The two views: ``overview`` (one arrow per source → destination) and ``full``.
DETAILS = ("overview", "full")

#: What each state means (node tooltips; docs/concepts/machine.md).
STATE_HELP: dict[str, str] = {
    "deciding": "the model is asked for its next decision",
    "validating": "the decision and its whole batch are checked before anything runs",
    "executing": "one call of the accepted batch runs",
    "retry_wait": "a backoff before a read is tried again",
    "observing": "the call's result is classified and paired with its id",
    "done": "no new tool call and a non-empty answer",
    "budget_exhausted": "the next step would exceed a budget; nothing new was executed",
    "protocol_error": "the model's output breaks the protocol",
    "review_required": "a trusted party must act before anything else happens (resumable)",
    "cancelled": "the caller cancelled the run and no write was in flight",
}

_FONT = "Helvetica"
_WORKING_FILL = "#e8f0fe"
_TERMINAL_FILL = "#fdecea"
_DONE_FILL = "#e6f4ea"
_FADED = "#c8c8c8"
_TAKEN = "#1a73e8"
_LAST = "#d93025"
_CURRENT_FILL = "#fbbc04"
# Heat map: light to dark, picked by count relative to the busiest arrow.
_HEAT = ("#fee391", "#fec44f", "#fe9929", "#ec7014", "#cc4c02", "#8c2d04")


@dataclass
class Overlay:
    """What a frame shows on top of the machine.

    ``counts`` maps a transition's index in the drawn machine's table to how often it
    was taken.
    ``heat`` colours arrows by count (aggregate view) instead of marking a path.
    """

    counts: Mapping[int, int] = field(default_factory=dict)
    visited: frozenset[str] = frozenset()
    current: str | None = None
    last: int | None = None
    heat: bool = False
    caption: str = ""


def _state_id(state: str) -> str:
    return f"state-{state}"


def _edge_label(edge: DrawnEdge, overlay: Overlay | None) -> str:
    lines = edge.lines()
    if overlay is not None:
        index = {t: t.index for t in edge.transitions}
        lines = [
            f"{text}  ×{overlay.counts[index[t]]}" if overlay.counts.get(index[t]) else text
            for text, t in zip(lines, edge.transitions, strict=True)
        ]
    # "\l" ends a left-justified line in DOT, so priorities line up under each other.
    return "".join(line.replace("\\", "\\\\") + "\\l" for line in lines)


def _node_attrs(state: str, overlay: Overlay | None) -> dict[str, str]:
    terminal = state in TERMINAL_STATES
    fill = _DONE_FILL if state == "done" else _TERMINAL_FILL if terminal else _WORKING_FILL
    attrs = {"id": _state_id(state), "fillcolor": fill}
    if terminal:
        attrs["peripheries"] = "2"
    if overlay is None or overlay.heat:
        if overlay is not None and state not in overlay.visited:
            attrs.update(color=_FADED, fontcolor=_FADED, fillcolor="#f5f5f5")
        return attrs
    if state == overlay.current:
        attrs.update(fillcolor=_CURRENT_FILL, penwidth="3", fontname=f"{_FONT}-Bold")
    elif state not in overlay.visited:
        attrs.update(
            color=_FADED, fontcolor=_FADED, fillcolor="#f5f5f5", style="rounded,filled,dashed"
        )
    return attrs


def _edge_attrs(edge: DrawnEdge, overlay: Overlay | None, peak: int) -> dict[str, str]:
    attrs = {"id": edge.id, "label": _edge_label(edge, overlay)}
    return _paint(attrs, edge.transitions, overlay, peak)


def _paint(
    attrs: dict[str, str],
    transitions: tuple[Transition, ...],
    overlay: Overlay | None,
    peak: int,
) -> dict[str, str]:
    # (The last edge is matched by index: every transition of one arrow is of one machine.)
    """Colour and thicken an arrow by how often the overlay took its transitions."""
    if overlay is None:
        return attrs
    taken = _taken(transitions, overlay)
    if not taken:
        attrs.update(color=_FADED, fontcolor="#9e9e9e")
        return attrs
    width = 1.5 + 3.0 * math.log1p(taken) / math.log1p(max(peak, 1))
    attrs.update(penwidth=f"{width:.2f}", color=_TAKEN, fontcolor=_TAKEN)
    if overlay.heat:
        shade = _HEAT[min(len(_HEAT) - 1, int(len(_HEAT) * taken / (peak + 1)))]
        attrs.update(color=shade, fontcolor="#5f370e")
    elif overlay.last is not None and any(t.index == overlay.last for t in transitions):
        attrs.update(color=_LAST, fontcolor=_LAST, penwidth=f"{width + 1:.2f}")
    return attrs


def _caption(machine: Machine) -> str:
    # The default keeps its historical caption (the committed diagrams carry it).
    name = "run machine" if machine.name == "run machine" else f"machine {machine.name!r}"
    return f"fsm-agent {name}  {machine.hash}".replace("\\", "\\\\")


def machine_graph(
    overlay: Overlay | None = None, machine: Machine = DEFAULT_MACHINE
) -> graphviz.Digraph:
    """``machine`` as a :class:`graphviz.Digraph`, painted with ``overlay`` if given."""
    g = graphviz.Digraph("run_machine")
    caption = _caption(machine)
    if overlay is not None and overlay.caption:
        caption += "\\n" + overlay.caption.replace("\\", "\\\\")
    g.attr(
        "graph",
        rankdir="LR",
        fontname=_FONT,
        fontsize="12",
        labelloc="t",
        label=caption,
        nodesep="0.6",
        ranksep="0.7",
        newrank="true",
    )
    g.attr(
        "node",
        fontname=_FONT,
        fontsize="12",
        shape="box",
        style="rounded,filled",
        margin="0.2,0.08",
    )
    g.attr("edge", fontname=_FONT, fontsize="9", arrowsize="0.7")
    g.node(
        "__start",
        label="",
        shape="point",
        width="0.18",
        id="state-__start",
        style="filled",
        fillcolor="black",
    )
    g.edge("__start", INITIAL_STATE, id="edge-start", tooltip="initial state")
    for state in WORKING_STATES:
        g.node(state, **_node_attrs(state, overlay))
    with g.subgraph(name="cluster_terminal") as terminals:
        terminals.attr(
            label="terminal states",
            style="rounded,dashed",
            color="#9e9e9e",
            fontcolor="#616161",
            rank="same",
        )
        for state in TERMINAL_STATES:
            terminals.node(state, **_node_attrs(state, overlay))
    edges = drawing(machine).edges
    peak = _peak(edges, overlay)
    for edge in edges:
        g.edge(edge.source, edge.dest, **_edge_attrs(edge, overlay, peak))
    return g


def _taken(transitions: tuple[Transition, ...], overlay: Overlay) -> int:
    return sum(overlay.counts.get(t.index, 0) for t in transitions)


def _peak(drawn: tuple[DrawnEdge, ...] | tuple[Arrow, ...], overlay: Overlay | None) -> int:
    if overlay is None:
        return 0
    return max((_taken(e.transitions, overlay) for e in drawn), default=0)


def _arrow_label(arrow: Arrow, overlay: Overlay | None) -> str:
    if overlay is None:
        lines = arrow.lines()
    else:
        # In a frame, a trigger's count is how often it was taken, not its row count.
        lines = []
        for trigger in arrow.triggers():
            rows = tuple(t for t in arrow.transitions if t.trigger == trigger)
            taken = _taken(rows, overlay)
            lines.append(f"{trigger} ×{taken}" if taken else trigger)
        if arrow.source == WORKING:
            lines.append("(from every working state)")
    return "\\n".join(line.replace("\\", "\\\\") for line in lines)


def overview_graph(
    overlay: Overlay | None = None, machine: Machine = DEFAULT_MACHINE
) -> graphviz.Digraph:
    """The overview of ``machine`` (see the module docstring), painted with ``overlay``."""
    g = graphviz.Digraph("run_machine")
    caption = _caption(machine)
    if overlay is not None and overlay.caption:
        caption += "\\n" + overlay.caption.replace("\\", "\\\\")
    else:
        caption += "\\n(n): n rows of the table · hover an arrow for its guards"
    g.attr(
        "graph",
        rankdir="TB",
        fontname=_FONT,
        fontsize="14",
        labelloc="t",
        label=caption,
        nodesep="0.5",
        ranksep="0.55",
        newrank="true",
        compound="true",
    )
    g.attr(
        "node",
        fontname=_FONT,
        fontsize="15",
        shape="box",
        style="rounded,filled",
        margin="0.16,0.07",
    )
    g.attr("edge", fontname=_FONT, fontsize="13", arrowsize="0.8")
    g.node("__start", label="", shape="point", width="0.16", id="state-__start")
    g.edge("__start", INITIAL_STATE, id="edge-start")
    with g.subgraph(name="cluster_working") as box:
        box.attr(
            label="working states",
            style="rounded,dashed",
            color="#9e9e9e",
            fontcolor="#616161",
            id="cluster-working",
        )
        for state in WORKING_STATES:
            box.node(state, **_node_attrs(state, overlay))
    for state in TERMINAL_STATES:
        g.node(state, **_node_attrs(state, overlay))
    overview = drawing(machine).arrows
    peak = _peak(overview, overlay)
    for arrow in overview:
        attrs = {"id": arrow.id, "label": _arrow_label(arrow, overlay)}
        attrs = _paint(attrs, arrow.transitions, overlay, peak)
        if arrow.source == WORKING:
            # One arrow leaving the box: drawn from its last working state, clipped at
            # the box's border (compound=true), dashed because it is not a loop step.
            attrs.update(ltail="cluster_working", style="dashed")
            g.edge(WORKING_STATES[-1], arrow.dest, **attrs)
        else:
            g.edge(arrow.source, arrow.dest, **attrs)
    return g


def arrows(
    detail: str, machine: Machine = DEFAULT_MACHINE
) -> tuple[DrawnEdge, ...] | tuple[Arrow, ...]:
    """The arrows of a view of ``machine``: its overview arrows or its full edges."""
    drawn = drawing(machine)
    return drawn.arrows if detail == "overview" else drawn.edges


def machine_dot(
    overlay: Overlay | None = None, detail: str = "full", machine: Machine = DEFAULT_MACHINE
) -> str:
    """DOT source of ``machine`` in ``detail`` view (``"full"`` or ``"overview"``);
    deterministic: committed as ``diagrams/run_machine.dot`` and ``run_machine_full.dot``."""
    if detail not in DETAILS:
        raise ValueError(f"unknown detail {detail!r}; choose one of {', '.join(DETAILS)}")
    view = overview_graph if detail == "overview" else machine_graph
    return str(view(overlay, machine).source)
