"""Model-based tests: one generated scenario per transition of the table.

The parametrisation reads ``TRANSITIONS``, so a transition added to the table gets a
test here at once; without a recipe that reaches it, that test fails and names it.
"""

from __future__ import annotations

import pytest

from fsm_agent.core.table import INITIAL_STATE, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.testing import (
    assert_history_valid,
    assert_no_duplicate_writes,
    assert_trace_legal,
    edge_of,
    index_of,
    is_path,
    paths,
    scenario_for,
    scenarios,
    shortest_paths,
    unbuildable,
)
from fsm_agent.testing.scenarios import edge_key, record_transitions, stale_recipes


def _id(t: Transition) -> str:
    return f"{index_of(t)}-{t.trigger}-{t.source}-{t.dest}-{'+'.join(t.guards) or 'else'}"


@pytest.mark.parametrize("transition", TRANSITIONS, ids=_id)
def test_a_scenario_drives_a_run_through_each_transition(transition: Transition) -> None:
    scenario = scenario_for(transition)
    if scenario is None:
        why = dict((i, w) for i, _, w in unbuildable())[index_of(transition)]
        pytest.fail(
            f"no scenario takes #{index_of(transition)} {transition.label} "
            f"({transition.source} -> {transition.dest}): {why}"
        )
    outcome = scenario.run()
    assert transition in outcome.taken, (
        f"scenario {scenario.name!r} did not take {transition.label}; it took "
        f"{[index_of(t) for t in outcome.taken]}"
    )
    for result in outcome.results:
        assert_trace_legal(result)
        assert_history_valid(result.messages)
        assert_no_duplicate_writes(result)
        assert result.status in TERMINAL_STATES
    assert_no_duplicate_writes(outcome.kit)
    # The trace alone identifies the edge: events matched to the table give the same
    # edges, in the same order, as the runtime's listener saw. (A resumed run's trace
    # holds its earlier events too, so each run counts by its last result.)
    last = {r.run_id: r for r in outcome.results}
    from_events = [edge_of(e) for r in last.values() for e in r.events if e["type"] == "transition"]
    assert from_events == outcome.taken


def test_every_transition_of_the_table_has_a_scenario() -> None:
    missing = unbuildable()
    assert not missing, "transitions no scenario reaches:\n" + "\n".join(
        f"  #{i} {t.label} ({t.source} -> {t.dest}): {why}" for i, t, why in missing
    )


def test_every_recipe_targets_an_edge_of_the_table() -> None:
    stale = stale_recipes()
    assert not stale, "recipes aimed at edges the table no longer has: " + ", ".join(
        f"{s.name} -> {s.target}" for s in stale
    )


def test_scenarios_take_the_edge_they_aim_at_and_stop_where_it_leads() -> None:
    for scenario in scenarios():
        outcome = scenario.run()
        keys = [edge_key(t) for t in outcome.taken]
        assert scenario.target in keys, scenario.name
        if scenario.target[2] in TERMINAL_STATES:
            assert outcome.result.status == scenario.target[2], scenario.name


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
    for scenario in scenarios():
        with record_transitions() as taken:
            outcome = scenario.run()
        assert taken == outcome.taken
        for result in outcome.results:
            walk = tuple(
                e
                for e in (edge_of(e) for e in result.events if e["type"] == "transition")
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
    a_path = found[-1].edges
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
