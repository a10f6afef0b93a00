"""The machine as a graph: paths through it.

Everything here reads :data:`fsm_agent._core.table.TRANSITIONS`, so a transition added
to the table shows up in the enumeration and the coverage report at once. An edge is
identified by :attr:`Transition.index` (its position) or :attr:`Transition.key`; which
edge a recorded event took is decided by the one selector,
:func:`fsm_agent._core.select.select_recorded`, and whether a trace is legal by the one
checker, :mod:`fsm_agent._trace.checker`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fsm_agent._core.table import INITIAL_STATE, TERMINAL_STATES, TRANSITIONS, Transition

__all__ = ["Path", "is_path", "paths", "shortest_paths"]

_TERMINAL = frozenset(TERMINAL_STATES)
#: Terminal states a ``resume`` edge leaves (read from the table, so none until one does).
_RESUMABLE = frozenset(t.source for t in TRANSITIONS if t.trigger == "resume")


@dataclass(frozen=True)
class Path:
    """A walk through the table from the initial state: its edges, in order."""

    edges: tuple[Transition, ...]

    @property
    def states(self) -> list[str]:
        """The states visited, the initial one included (like ``RunResult.path``)."""
        first: str = self.edges[0].source if self.edges else INITIAL_STATE
        return [first] + [t.dest for t in self.edges]

    @property
    def indexes(self) -> tuple[int, ...]:
        return tuple(t.index for t in self.edges)

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
            grown: list[str] = []
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
        t.index: Path((*prefix[t.source], t, *suffix[t.dest]))
        for t in TRANSITIONS
        if t.source in prefix and t.dest in suffix
    }
