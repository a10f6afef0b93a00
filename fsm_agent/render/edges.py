"""The drawn edges: the table's transitions grouped by (source, trigger, dest).

Several transitions often share a source, a trigger and a destination (seven ways from
``validating`` to ``protocol_error``); drawing each as its own arrow makes the picture
unreadable, so they are merged into one arrow whose label keeps every guard set, each
numbered by its priority among the transitions of that trigger in that source.
Everything here is derived from :data:`fsm_agent.machine.TRANSITIONS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsm_agent.core.table import TRANSITIONS, Transition, transitions_from

__all__ = ["EDGES", "DrawnEdge", "edge_of", "priority"]


def priority(t: Transition) -> tuple[int, int]:
    """``(rank, size)``: ``t`` is tried ``rank``-th (1-based) of ``size`` edges of its trigger."""
    group = transitions_from(t.source, t.trigger)
    return group.index(t) + 1, len(group)


@dataclass(frozen=True)
class DrawnEdge:
    """One arrow of the diagram: the transitions it stands for, in table order."""

    source: str
    trigger: str
    dest: str
    transitions: tuple[Transition, ...]

    @property
    def id(self) -> str:
        """Stable id used in DOT/SVG (the HTML viewer finds arrows by it)."""
        return f"edge-{self.source}-{self.trigger}-{self.dest}"

    def lines(self) -> list[str]:
        """One label line per transition: ``N. trigger [guards] → reason``."""
        out = []
        for t in self.transitions:
            rank, size = priority(t)
            text = f"{rank}. {t.label}" if size > 1 else t.label
            if size > 1 and not t.guards:
                text += " (else)"  # the fallback: taken when no earlier edge's guards hold
            if t.reason is not None:
                text += f" → {t.reason}"
            out.append(text)
        return out


def _group() -> tuple[DrawnEdge, ...]:
    keyed: dict[tuple[str, str, str], list[Transition]] = {}
    for t in TRANSITIONS:
        keyed.setdefault((t.source, t.trigger, t.dest), []).append(t)
    return tuple(DrawnEdge(s, trig, d, tuple(ts)) for (s, trig, d), ts in keyed.items())


#: Every drawn edge, in the order of the first transition each stands for.
EDGES: tuple[DrawnEdge, ...] = _group()
_BY_TRANSITION: dict[Transition, DrawnEdge] = {t: e for e in EDGES for t in e.transitions}


def edge_of(t: Transition) -> DrawnEdge:
    """The arrow that draws ``t``."""
    return _BY_TRANSITION[t]
