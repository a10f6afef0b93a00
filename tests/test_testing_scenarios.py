"""Model-based tests: one generated scenario per transition of the table.

The parametrisation reads ``TRANSITIONS``, so a transition added to the table gets a
test here at once; without a recipe that reaches it, that test fails and names it.
"""

from __future__ import annotations

import pytest

from fsm_agent.machine import INITIAL_STATE, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.testing import (
    assert_history_valid,
    assert_no_duplicate_writes,
    assert_trace_legal,
    edge_of,
    index_of,
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
        pytest.fail(f"no scenario takes #{index_of(transition)} {transition.label} "
                    f"({transition.source} -> {transition.dest}): {why}")
    outcome = scenario.run()
    assert transition in outcome.taken, (
        f"scenario {scenario.name!r} did not take {transition.label}; it took "
        f"{[index_of(t) for t in outcome.taken]}")
    for result in outcome.results:
        assert_trace_legal(result)
        assert_history_valid(result.messages)
        assert_no_duplicate_writes(result)
        assert result.status in TERMINAL_STATES
    assert_no_duplicate_writes(outcome.kit)
    # The trace alone identifies the edge: events matched to the table give the same
    # edges, in the same order, as the runtime's listener saw.
    from_events = [edge_of(e) for r in outcome.results for e in r.events
                   if e["type"] == "transition"]
    assert from_events == outcome.taken


def test_every_transition_of_the_table_has_a_scenario() -> None:
    missing = unbuildable()
    assert not missing, "transitions no scenario reaches:\n" + "\n".join(
        f"  #{i} {t.label} ({t.source} -> {t.dest}): {why}" for i, t, why in missing)


def test_every_recipe_targets_an_edge_of_the_table() -> None:
    stale = stale_recipes()
    assert not stale, "recipes aimed at edges the table no longer has: " + ", ".join(
        f"{s.name} -> {s.target}" for s in stale)


def test_scenarios_take_the_edge_they_aim_at_and_stop_where_it_leads() -> None:
    for scenario in scenarios():
        outcome = scenario.run()
        keys = [edge_key(t) for t in outcome.taken]
        assert scenario.target in keys, scenario.name
        if scenario.target[2] in TERMINAL_STATES:
            assert outcome.result.status == scenario.target[2], scenario.name


def test_recorded_runs_follow_enumerated_paths() -> None:
    """Every run a scenario makes is one of the walks ``paths()`` enumerates."""
    for scenario in scenarios():
        with record_transitions() as taken:
            outcome = scenario.run()
        assert taken == outcome.taken
        for result in outcome.results:
            walk = tuple(edge_of(e) for e in result.events if e["type"] == "transition")
            enumerated = {p.edges for p in paths(len(walk)) if len(p) == len(walk)}
            assert walk in enumerated, f"{scenario.name}: {result.path}"


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
