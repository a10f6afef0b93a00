"""The machine as a graph: edge identity, paths through it, and traces checked against it.

Everything here reads :data:`fsm_agent.machine.TRANSITIONS`, so a transition added to
the table shows up in the enumeration, the coverage report and the trace checks at once.

An edge is identified by its position in the table (``index_of``). A trace event names
``trigger``, ``source`` and ``dest`` and the guard outcomes evaluated while choosing it
(``guards``); :func:`edge_of` finds the one table entry those describe.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsm_agent.core.table import INITIAL_STATE, TERMINAL_STATES, TRANSITIONS, Transition

__all__ = ["Path", "edge_of", "index_of", "is_path", "paths", "shortest_paths", "trace_problems"]

_INDEX: dict[int, int] = {id(t): i for i, t in enumerate(TRANSITIONS)}
_TERMINAL = frozenset(TERMINAL_STATES)
#: Terminal states a ``resume`` edge leaves (read from the table, so none until one does).
_RESUMABLE = frozenset(t.source for t in TRANSITIONS if t.trigger == "resume")


def index_of(transition: Transition) -> int:
    """The transition's position in the table (its identity)."""
    try:
        return _INDEX[id(transition)]
    except KeyError:
        return TRANSITIONS.index(transition)  # an equal copy (e.g. unpickled)


@dataclass(frozen=True)
class Path:
    """A walk through the table from the initial state: its edges, in order."""

    edges: tuple[Transition, ...]

    @property
    def states(self) -> list[str]:
        """The states visited, the initial one included (like ``RunResult.path``)."""
        return [self.edges[0].source if self.edges else INITIAL_STATE] + [
            t.dest for t in self.edges
        ]

    @property
    def indexes(self) -> tuple[int, ...]:
        return tuple(index_of(t) for t in self.edges)

    def __len__(self) -> int:
        return len(self.edges)

    def __str__(self) -> str:
        return " -> ".join(self.states)


def paths(max_depth: int, *, start: str = INITIAL_STATE) -> Iterator[Path]:
    """Every path of at most ``max_depth`` edges from ``start`` to a terminal state.

    Paths are graph walks: they follow the table's edges and ignore whether the guards
    along a walk can all hold together (that is what running a scenario finds out).
    Cycles are walked as often as ``max_depth`` allows; paths come shortest first.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be a whole number >= 0, got {max_depth!r}")
    by_source: dict[str, list[Transition]] = {}
    for t in TRANSITIONS:
        by_source.setdefault(t.source, []).append(t)
    frontier: list[tuple[Transition, ...]] = [()]
    for _ in range(max_depth):
        grown: list[tuple[Transition, ...]] = []
        for walk in frontier:
            here = walk[-1].dest if walk else start
            for t in by_source.get(here, ()):
                if t.dest in _TERMINAL:
                    yield Path((*walk, t))
                else:
                    grown.append((*walk, t))
        frontier = grown


def is_path(edges: Sequence[Transition], *, start: str = INITIAL_STATE) -> bool:
    """Whether ``edges`` is one of the walks :func:`paths` enumerates from ``start``:
    each edge leaves the state the previous one entered, and only the last enters a
    terminal state (checked without enumerating, so it works for any length)."""
    if not edges or edges[0].source != start:
        return False
    for before, after in itertools.pairwise(edges):
        if before.dest != after.source or before.dest in _TERMINAL:
            return False
    return edges[-1].dest in _TERMINAL


def shortest_paths() -> dict[int, Path]:
    """For each reachable edge (by index), a shortest walk from the initial state through
    it to a terminal state: the least a scenario must do to take that edge.

    An edge that leaves a terminal state (``resume``) lies on no path of :func:`paths`;
    its walk reaches that state first, then goes on through the edge.
    """
    by_source: dict[str, list[Transition]] = {}
    for t in TRANSITIONS:
        by_source.setdefault(t.source, []).append(t)
    # Shortest ways in: through working states first, and through a terminal state (by a
    # resume edge) only to reach what nothing else reaches.
    prefix: dict[str, tuple[Transition, ...]] = {INITIAL_STATE: ()}
    for through_terminal in (False, True):
        frontier = list(prefix)
        while frontier:
            grown = []
            for state in frontier:
                if state in _TERMINAL and not through_terminal:
                    continue
                for t in by_source.get(state, ()):
                    if t.dest not in prefix:
                        prefix[t.dest] = (*prefix[state], t)
                        grown.append(t.dest)
            frontier = grown
    # Shortest ways out to a terminal state, through working states only.
    suffix: dict[str, tuple[Transition, ...]] = {state: () for state in TERMINAL_STATES}
    changed = True
    while changed:
        changed = False
        for t in TRANSITIONS:
            if t.source in _TERMINAL or t.dest not in suffix:
                continue
            way = (t, *suffix[t.dest])
            if t.source not in suffix or len(way) < len(suffix[t.source]):
                suffix[t.source] = way
                changed = True
    return {
        i: Path((*prefix[t.source], t, *suffix[t.dest]))
        for i, t in enumerate(TRANSITIONS)
        if t.source in prefix and t.dest in suffix
    }


def edge_of(event: Mapping[str, Any]) -> Transition | None:
    """The table entry a ``transition`` event describes, or ``None`` if it is no edge.

    Several edges share trigger, source and destination (e.g. the budget stops): the one
    taken is the first, in priority order, whose guards all hold by the event's recorded
    guard outcomes.
    """
    trigger, source, dest = event.get("trigger"), event.get("source"), event.get("dest")
    guards = event.get("guards")
    outcomes: Mapping[str, Any] = guards if isinstance(guards, Mapping) else {}
    for t in TRANSITIONS:
        if (t.trigger, t.source, t.dest) != (trigger, source, dest):
            continue
        if all(outcomes.get(g.lstrip("!")) is (not g.startswith("!")) for g in t.guards):
            return t
    return None


def trace_problems(events: Sequence[Mapping[str, Any]]) -> list[str]:  # noqa: C901 - one check per trace rule
    """What is wrong with a run's events as a trace of the machine; empty when legal.

    Checks: a ``run_start`` header with ``seq`` 0, then contiguous ``seq``; every
    transition is an edge of the table leaving the state the previous one entered, with
    the guard outcomes that edge needs and no earlier-priority edge that also held; the
    first leaves the initial state; ``run_end`` follows the transition into a terminal
    state and nothing follows it, except that a run stopped in a state a ``resume`` edge
    leaves may go on with that edge (after review events).
    """
    problems: list[str] = []
    if not events:
        return ["no events"]
    if events[0].get("type") != "run_start" or events[0].get("seq") != 0:
        problems.append("event 0: expected the run_start header with seq 0")
    state = INITIAL_STATE
    ended_at: int | None = None
    held: list[str] = []  # events after a review_required run_end, until a resume
    for n, event in enumerate(events[1:], 1):
        kind = event.get("type")
        if event.get("seq") != n:
            problems.append(f"event {n}: seq {event.get('seq')!r}, expected {n}")
        if ended_at is not None:
            # A run stopped for review may be resumed by a trusted caller (SPEC §5): its
            # review events and the ``resume`` edge continue the same trace.
            if state in _RESUMABLE and kind == "transition" and event.get("trigger") == "resume":
                ended_at, held = None, []
            else:
                note = f"event {n} ({kind}): after run_end (event {ended_at})"
                if state in _RESUMABLE and kind != "transition":
                    held.append(note)
                else:
                    problems += [*held, note]
                    held = []
                continue
        if kind == "transition":
            where = f"event {n} ({event.get('trigger')} {event.get('source')}->{event.get('dest')})"
            if event.get("source") != state:
                problems.append(
                    f"{where}: leaves {event.get('source')!r} but the run was in {state!r}"
                )
            if state in _TERMINAL and event.get("trigger") != "resume":
                problems.append(f"{where}: the run had already stopped in {state!r}")
            edge = edge_of(event)
            if edge is None:
                problems.append(
                    f"{where}: no edge of the table matches (trigger, source, "
                    f"dest and guard outcomes {event.get('guards')})"
                )
            else:
                problems += _shadowed(edge, event, where)
            state = str(event.get("dest"))
        elif kind == "run_end":
            ended_at = n
            if state not in _TERMINAL:
                problems.append(f"event {n}: run_end while in working state {state!r}")
            elif event.get("status") != state:
                problems.append(
                    f"event {n}: run_end status {event.get('status')!r} but the run is in {state!r}"
                )
    problems += held
    if ended_at is None:
        problems.append(f"no run_end (the run is in {state!r})")
    return problems


def _shadowed(edge: Transition, event: Mapping[str, Any], where: str) -> list[str]:
    """An earlier edge of the same trigger and source whose guards all held should have won."""
    guards = event.get("guards")
    outcomes: Mapping[str, Any] = guards if isinstance(guards, Mapping) else {}
    for t in TRANSITIONS:
        if t is edge:
            return []
        if (t.trigger, t.source) != (edge.trigger, edge.source) or not t.guards:
            continue
        if all(outcomes.get(g.lstrip("!")) is (not g.startswith("!")) for g in t.guards):
            return [
                f"{where}: edge #{index_of(t)} ({t.label} -> {t.dest}) has higher "
                "priority and its guards held"
            ]
    return []
