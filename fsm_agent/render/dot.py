"""The run machine as Graphviz DOT, built from the table, with an optional overlay.

The layout is ours (not ``GraphMachine``'s): the initial state is marked by a start dot,
working states keep their loop order from left to right, terminal states sit together in
one column on the right with a double border, and every arrow is labelled ``trigger [guards]``,
numbered by priority where a trigger has several edges in one state.

An :class:`Overlay` paints a replay frame or a heat map on the same picture: the nodes
and arrows keep their ids (``state-NAME``, ``edge-SOURCE-TRIGGER-DEST``) so the HTML
viewer can restyle them in the browser.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import graphviz

from fsm_agent.core.table import (
    INITIAL_STATE,
    MACHINE_HASH,
    TERMINAL_STATES,
    TRANSITIONS,
    WORKING_STATES,
)
from fsm_agent.render.edges import EDGES, DrawnEdge

__all__ = ["Overlay", "machine_dot", "machine_graph"]

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

    ``counts`` maps a transition's index in ``TRANSITIONS`` to how often it was taken.
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
        index = {t: TRANSITIONS.index(t) for t in edge.transitions}
        lines = [
            f"{text}  ×{overlay.counts[index[t]]}" if overlay.counts.get(index[t]) else text
            for text, t in zip(lines, edge.transitions, strict=True)
        ]
    # "\l" ends a left-justified line in DOT, so priorities line up under each other.
    return "".join(line.replace("\\", "\\\\") + "\\l" for line in lines)


def _node_attrs(state: str, overlay: Overlay | None) -> dict[str, str]:
    terminal = state in TERMINAL_STATES
    fill = _DONE_FILL if state == "done" else _TERMINAL_FILL if terminal else _WORKING_FILL
    attrs = {"id": _state_id(state), "fillcolor": fill, "tooltip": state}
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
    rules = " | ".join(dict.fromkeys(t.rule for t in edge.transitions if t.rule))
    attrs = {"id": edge.id, "label": _edge_label(edge, overlay), "tooltip": rules or edge.trigger}
    if overlay is None:
        return attrs
    taken = sum(overlay.counts.get(TRANSITIONS.index(t), 0) for t in edge.transitions)
    if not taken:
        attrs.update(color=_FADED, fontcolor="#9e9e9e")
        return attrs
    width = 1.5 + 3.0 * math.log1p(taken) / math.log1p(max(peak, 1))
    attrs.update(penwidth=f"{width:.2f}", color=_TAKEN, fontcolor=_TAKEN)
    if overlay.heat:
        shade = _HEAT[min(len(_HEAT) - 1, int(len(_HEAT) * taken / (peak + 1)))]
        attrs.update(color=shade, fontcolor="#5f370e")
    elif overlay.last is not None and TRANSITIONS[overlay.last] in edge.transitions:
        attrs.update(color=_LAST, fontcolor=_LAST, penwidth=f"{width + 1:.2f}")
    return attrs


def machine_graph(overlay: Overlay | None = None) -> graphviz.Digraph:
    """The machine as a :class:`graphviz.Digraph`, painted with ``overlay`` if given."""
    g = graphviz.Digraph("run_machine")
    caption = f"fsm-agent run machine  {MACHINE_HASH}"
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
    peak = 0
    if overlay is not None:
        peak = max(
            (
                sum(overlay.counts.get(TRANSITIONS.index(t), 0) for t in e.transitions)
                for e in EDGES
            ),
            default=0,
        )
    for edge in EDGES:
        g.edge(edge.source, edge.dest, **_edge_attrs(edge, overlay, peak))
    return g


def machine_dot(overlay: Overlay | None = None) -> str:
    """DOT source of the machine (deterministic: committed as ``diagrams/run_machine.dot``)."""
    return str(machine_graph(overlay).source)
