"""The drawn edges: the table's transitions grouped into arrows, for two views.

``full`` (:data:`EDGES`): one arrow per (source, trigger, dest). Several transitions often
share all three (seven ways from ``validating`` to ``protocol_error``); they are merged
into one arrow whose label keeps every guard set, each numbered by its priority among the
transitions of that trigger in that source.

``overview`` (:data:`ARROWS`): one arrow per (source, dest), labelled with its triggers
and how many table rows each stands for; a trigger that leads from *every* working state
to the same state (``cancel`` → ``cancelled``) is one arrow from the working-state box.
The full guard detail of an overview arrow is its tooltip (:meth:`Arrow.detail`).

Everything here is derived from a machine's table (:func:`drawing`; the module-level
names draw :data:`fsm_agent._core.table.DEFAULT_MACHINE`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from fsm_agent._core.table import (
    DEFAULT_MACHINE,
    WORKING_STATES,
    Machine,
    Transition,
    transitions_from,
)

__all__ = [
    "ARROWS",
    "EDGES",
    "WORKING",
    "Arrow",
    "Drawing",
    "DrawnEdge",
    "arrow_of",
    "detail_line",
    "drawing",
    "edge_of",
    "priority",
]

#: The overview's name for "any working state" (the source of an everywhere-arrow).
WORKING = "working"


def priority(t: Transition) -> tuple[int, int]:
    """``(rank, size)``: ``t`` is tried ``rank``-th (1-based) of ``size`` edges of its trigger
    (in its machine; an edge built outside one is ranked in the default table)."""
    if t.rank != (0, 0):
        return t.rank
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
        return [detail_line(t) for t in self.transitions]

    def detail(self) -> str:
        """The tooltip: every line with the rule it encodes."""
        return _detail(self.transitions)


def detail_line(t: Transition) -> str:
    """``N. trigger [guards] → reason``: N is the priority among the trigger's edges in
    that state (left out when it has one), ``(else)`` marks the unguarded fallback."""
    rank, size = priority(t)
    text = f"{rank}. {t.label}" if size > 1 else t.label
    if size > 1 and not t.guards:
        text += " (else)"  # the fallback: taken when no earlier edge's guards hold
    if t.reason is not None:
        text += f" → {t.reason}"
    condition = rule_condition(t)
    if condition:  # an application's rule: its condition says when it decides
        text += f" when {condition if len(condition) <= 48 else condition[:45] + '...'}"
    return text


def rule_ids(t: Transition) -> list[str]:
    """The ids of the application's rules a row stands for (its ``rule:<id>`` guards)."""
    return [g[len(_RULE) :] for g in t.guards if g.startswith(_RULE)]


def rule_condition(t: Transition) -> str:
    """A rule row's condition (its ``rule`` column reads ``id: condition``)."""
    ids = rule_ids(t)
    prefix = f"{ids[0]}: " if ids else ""
    return t.rule[len(prefix) :] if ids and t.rule.startswith(prefix) else ""


_RULE = "rule:"


def _detail(transitions: tuple[Transition, ...]) -> str:
    """``source → dest: N. trigger [guards] → reason`` and the rule, per transition."""
    lines = []
    for t in transitions:
        lines.append(f"{t.source} → {t.dest}: {detail_line(t)}")
        if t.rule:
            lines.append(f"    {t.rule}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Arrow:
    """One arrow of the overview: every transition from ``source`` to ``dest``.

    ``source`` is :data:`WORKING` for a trigger that leads from every working state to
    ``dest``; such an arrow is drawn once, from the working-state box.
    """

    source: str
    dest: str
    transitions: tuple[Transition, ...]

    @property
    def id(self) -> str:
        """Stable id used in DOT/SVG (the HTML viewer finds arrows by it)."""
        if self.source == WORKING:
            return f"edge-{WORKING}-{self.transitions[0].trigger}-{self.dest}"
        return f"edge-{self.source}-{self.dest}"

    def triggers(self) -> dict[str, int]:
        """Each trigger of the arrow, in table order, with how many rows it stands for."""
        counts: dict[str, int] = {}
        for t in self.transitions:
            counts[t.trigger] = counts.get(t.trigger, 0) + 1
        return counts

    def lines(self) -> list[str]:
        """The short label: ``trigger`` or ``trigger (n)`` for n rows, one per trigger."""
        if self.source == WORKING:
            (trigger,) = self.triggers()
            return [trigger, "(from every working state)"]
        lines = [f"{k} ({n})" if n > 1 else k for k, n in self.triggers().items()]
        ids = list(dict.fromkeys(i for t in self.transitions for i in rule_ids(t)))
        # The application's rules on this arrow by id, a few per line (legible with ten).
        lines += ["rule " + ", ".join(ids[i : i + 3]) for i in range(0, len(ids), 3)]
        return lines

    def detail(self) -> str:
        """The tooltip: every row the arrow stands for, with its guards and rule."""
        return _detail(self.transitions)


def _group(table: Iterable[Transition]) -> tuple[DrawnEdge, ...]:
    keyed: dict[tuple[str, str, str], list[Transition]] = {}
    for t in table:
        keyed.setdefault((t.source, t.trigger, t.dest), []).append(t)
    return tuple(DrawnEdge(s, trig, d, tuple(ts)) for (s, trig, d), ts in keyed.items())


def _everywhere(table: tuple[Transition, ...]) -> set[tuple[str, str]]:
    """(trigger, dest) pairs that lead from every working state to the same state."""
    sources: dict[tuple[str, str], set[str]] = {}
    for t in table:
        sources.setdefault((t.trigger, t.dest), set()).add(t.source)
    return {key for key, found in sources.items() if set(WORKING_STATES) <= found}


def _arrows(table: tuple[Transition, ...]) -> tuple[Arrow, ...]:
    everywhere = _everywhere(table)
    keyed: dict[tuple[str, str], list[Transition]] = {}
    for t in table:
        if (t.trigger, t.dest) in everywhere and t.source in WORKING_STATES:
            keyed.setdefault((WORKING, f"{t.trigger}\0{t.dest}"), []).append(t)
        else:
            keyed.setdefault((t.source, t.dest), []).append(t)
    return tuple(
        Arrow(source, key.split("\0")[-1], tuple(ts)) for (source, key), ts in keyed.items()
    )


@dataclass(frozen=True, eq=False)
class Drawing:
    """A machine's arrows in both views (:func:`drawing` builds and caches one)."""

    machine: Machine
    #: Every drawn edge of the full view, in the order of the first transition each draws.
    edges: tuple[DrawnEdge, ...] = field(init=False)
    #: Every arrow of the overview, in the order of the first transition each draws.
    arrows: tuple[Arrow, ...] = field(init=False)
    _edge: dict[Transition, DrawnEdge] = field(init=False, repr=False)
    _arrow: dict[Transition, Arrow] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table = self.machine.transitions
        edges, arrows = _group(table), _arrows(table)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "arrows", arrows)
        object.__setattr__(self, "_edge", {t: e for e in edges for t in e.transitions})
        object.__setattr__(self, "_arrow", {t: a for a in arrows for t in a.transitions})

    def edge_of(self, t: Transition) -> DrawnEdge:
        """The full view's arrow that draws ``t``."""
        return self._edge[t]

    def arrow_of(self, t: Transition) -> Arrow:
        """The overview's arrow that draws ``t``."""
        return self._arrow[t]


@lru_cache(maxsize=32)
def drawing(machine: Machine = DEFAULT_MACHINE) -> Drawing:
    """The arrows of ``machine`` (one drawing per machine hash)."""
    return Drawing(machine)


_DEFAULT = drawing()

#: Every drawn edge of the default machine's full view.
EDGES: tuple[DrawnEdge, ...] = _DEFAULT.edges

#: Every arrow of the default machine's overview.
ARROWS: tuple[Arrow, ...] = _DEFAULT.arrows


def edge_of(t: Transition) -> DrawnEdge:
    """The full view's arrow that draws ``t`` (default machine)."""
    return _DEFAULT.edge_of(t)


def arrow_of(t: Transition) -> Arrow:
    """The overview's arrow that draws ``t`` (default machine)."""
    return _DEFAULT.arrow_of(t)
