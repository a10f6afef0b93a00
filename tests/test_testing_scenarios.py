"""The toolkit's graph view of the machine: paths, and runs that follow them.

(The per-edge suite itself is run by ``test_machine_transitions.py``.)
"""

from __future__ import annotations

from typing import Any

import pytest

from fsm_agent._core.select import select_recorded
from fsm_agent._core.table import INITIAL_STATE, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.testing import SUITE, is_path, paths, shortest_paths
from fsm_agent.testing._scenarios import record_transitions


def test_the_trace_alone_identifies_each_edge_taken() -> None:
    """Events matched to the table by the one selector give the same edges, in the same
    order, as the engine's listener saw. (A resumed run's trace holds its earlier events
    too, so each run counts by its last result.)"""
    for scenario in SUITE:
        outcome = scenario.run()
        last = {r.run_id: r for r in outcome.results}
        from_events = [
            _edge(e) for r in last.values() for e in r.events if e["type"] == "transition"
        ]
        died = scenario.die_at is not None or scenario.die_before_commit
        # A refused review (the fallback edge of ``review``) raises and stores nothing.
        taken = [t for t in outcome.taken if not (t.trigger == "review" and t.action is None)]
        if not died:  # a death loses the unsaved transition it happened in
            assert from_events == taken, scenario.name


def _edge(event: dict[str, Any]) -> Transition | None:
    return select_recorded(event["source"], event["trigger"], event["guards"])


def _segments(walk: tuple[Transition, ...]) -> list[tuple[Transition, ...]]:
    """A walk cut after each terminal state (a resumed run continues past one)."""
    out: list[tuple[Transition, ...]] = [()]
    for t in walk:
        out[-1] += (t,)
        if t.dest in TERMINAL_STATES:
            out.append(())
    return [s for s in out if s]


def test_recorded_runs_follow_enumerated_paths() -> None:
    """Every run a scenario makes is a walk ``paths()`` enumerates (a resumed run: such a
    walk, then walks from where each resume picked it up)."""
    for scenario in SUITE:
        with record_transitions() as taken:
            outcome = scenario.run()
        assert taken == outcome.taken
        for result in outcome.results:
            walk = tuple(
                e
                for e in (_edge(e) for e in result.events if e["type"] == "transition")
                if e is not None
            )
            first, *rest = _segments(walk)
            assert is_path(first), f"{scenario.name}: {result.path}"
            for segment in rest:
                assert is_path(segment, start=segment[0].source), scenario.name
            if len(first) <= 7:  # cross-check the checker against the enumeration
                assert first in {p.edges for p in paths(len(first)) if len(p) == len(first)}


def test_is_path_agrees_with_the_enumeration() -> None:
    found = list(paths(4))
    assert found and all(is_path(p.edges) for p in found)
    # (One not opening with ``begin``: that self-loop leaves it at the initial state.)
    a_path = next(p.edges for p in reversed(found) if p.edges[0].trigger != "begin")
    assert not is_path(a_path[:-1])  # stops short of a terminal state
    assert not is_path(a_path[1:])  # does not start at the initial state
    assert not is_path(a_path + a_path)  # goes on past a terminal state
    assert not is_path(())


def test_paths_start_at_the_initial_state_and_end_terminal() -> None:
    found = list(paths(6))
    assert found, "no path of up to 6 edges"
    for p in found:
        assert p.states[0] == INITIAL_STATE
        assert p.states[-1] in TERMINAL_STATES
        assert not any(s in TERMINAL_STATES for s in p.states[:-1])
        assert all(a.dest == b.source for a, b in zip(p.edges, p.edges[1:], strict=False))
        assert len(p) <= 6
    lengths = [len(p) for p in found]
    assert lengths == sorted(lengths)
    assert len({p.edges for p in found}) == len(found), "a path was enumerated twice"


def test_paths_reach_every_transition_and_every_terminal_state() -> None:
    through = shortest_paths()
    assert sorted(through) == list(range(len(TRANSITIONS)))
    for i, p in through.items():
        assert TRANSITIONS[i] in p.edges
    ends = {p.states[-1] for p in paths(5)}
    assert ends == set(TERMINAL_STATES)


def test_paths_rejects_a_bad_depth() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        list(paths(-1))
    assert list(paths(0)) == []
