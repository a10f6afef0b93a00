"""The engine's trigger chooses exactly what stock ``transitions`` would.

``fsm_agent._core.engine`` fires each trigger through a ``transitions`` event whose edge is
chosen by the one selector (``core/select.py``), skipping the stock per-candidate logging
and empty callback lists. Under thousands of random guard outcomes, for every (state,
trigger), the engine and a stock machine must take the same edge, and both must refuse a
trigger that has no edge from the state.
"""

from __future__ import annotations

import random
from typing import Any, cast

import pytest
from transitions import Machine, MachineError

from fsm_agent._core.engine import build_machine
from fsm_agent._core.guards import GUARDS
from fsm_agent._core.select import choose, compile_choice
from fsm_agent._core.table import DEFAULT_MACHINE, INITIAL_STATE, STATES, TRANSITIONS, Transition


class Model:
    def __init__(self, state: str, values: dict[str, bool]) -> None:
        self.state = state
        self.values = values
        self.guard_log: dict[str, bool] = {}
        self.taken: Transition | None = None


def _guards() -> dict[str, Any]:
    return {name: (lambda model, name=name: model.values[name]) for name in GUARDS}


def _stock() -> Machine:
    machine = Machine(
        model=None,
        states=list(STATES),
        initial=INITIAL_STATE,
        auto_transitions=False,
        send_event=False,
    )
    guards = _guards()
    for t in TRANSITIONS:

        def took(model: Model, t: Transition = t) -> None:
            model.taken = t

        machine.add_transition(
            t.trigger,
            t.source,
            t.dest,
            conditions=[guards[g] for g in t.conditions],
            unless=[guards[g] for g in t.unless],
            after=[took],
        )
    return machine


def test_same_edge_under_random_guard_outcomes() -> None:
    lean, stock = build_machine(), _stock()
    rng = random.Random(7)
    groups = sorted({(t.source, t.trigger) for t in TRANSITIONS})
    for _ in range(3000):
        source, trigger = rng.choice(groups)
        values = {name: rng.random() < 0.3 for name in GUARDS}
        a, b = Model(source, values), Model(source, values)
        a.taken = cast(Transition, lean.events[trigger].trigger(a, values.__getitem__))
        assert stock.events[trigger].trigger(b, b) is True  # stock passes args to guards
        assert (a.state, a.taken) == (b.state, b.taken), (source, trigger, values)


@pytest.mark.parametrize("state", STATES)
def test_a_trigger_without_an_edge_from_the_state_is_refused_by_both(state: str) -> None:
    lean, stock = build_machine(), _stock()
    triggers = {t.trigger for t in TRANSITIONS}
    for trigger in sorted(triggers - {t.trigger for t in TRANSITIONS if t.source == state}):
        with pytest.raises(MachineError):
            lean.events[trigger].trigger(Model(state, {}), {}.__getitem__)
        with pytest.raises(MachineError):
            stock.events[trigger].trigger(Model(state, {}))


def test_the_compiled_walk_meets_the_same_guards_and_picks_the_same_edge() -> None:
    """``take`` (the engine's hot path) walks each group with code compiled from it:
    the same guards, in the same order, each logged, and the same edge as ``choose``."""
    lean = build_machine()
    rng = random.Random(11)
    groups = sorted({(t.source, t.trigger) for t in TRANSITIONS})
    for _ in range(3000):
        source, trigger = rng.choice(groups)
        values = {name: rng.random() < 0.3 for name in GUARDS}
        asked: list[str] = []

        def guard(name: str, asked: list[str] = asked, values: dict[str, bool] = values) -> bool:
            asked.append(name)
            return values[name]

        expected = choose(DEFAULT_MACHINE.edges_from(source, trigger), guard)
        model = Model(source, values)
        evaluated: list[str] = []

        def evaluate(m: Model, name: str, evaluated: list[str] = evaluated) -> bool:
            evaluated.append(name)
            return m.values[name]

        guards = {name: (lambda m, name=name: evaluate(m, name)) for name in GUARDS}
        event = cast(Any, lean.events[trigger])
        taken = event.choices[source](model, guards, model.guard_log)
        assert taken is expected, (source, trigger, values)
        # A guard met twice (``strict_policy`` after each refusal) is evaluated once.
        assert evaluated == list(dict.fromkeys(asked)), (source, trigger)
        # Every guard met is logged in order (one met twice is logged once, as before).
        assert list(model.guard_log) == list(dict.fromkeys(asked))
        assert model.guard_log == {name: values[name] for name in asked}


def test_take_moves_the_run_and_logs_its_guards() -> None:
    lean = build_machine()
    model = Model("validating", {name: name == "has_tool_calls" for name in GUARDS})
    event = cast(Any, lean.events["validate"])
    with pytest.MonkeyPatch.context() as m:
        import fsm_agent._core.engine as engine

        m.setattr(engine, "GUARDS", {n: (lambda s, n=n: s.values[n]) for n in GUARDS})
        edge = event.take(model)
    assert (edge.dest, model.state) == ("executing", "executing")
    assert list(model.guard_log)[:3] == ["decision_malformed", "has_tool_calls", "call_id_missing"]
    with pytest.raises(MachineError):
        event.take(Model("done", {}))


#: A trigger and two states for edges made up by a test (not the default table's).
EDGE: tuple[Any, Any, Any] = ("go", "s", "t")


def test_edges_sharing_a_first_check_are_walked_as_choose_walks_them() -> None:
    """Runs of edges that start with the same check (an application's rule rows all
    start ``strict_policy``) share one test of it in the compiled walk: on random groups
    made of such runs (with negated checks, repeated guards and edges that hold only
    the shared check), the same edge and the same guards, each evaluated once, in order."""
    rng = random.Random(19)
    pool = ["a", "b", "c", "d", "!a", "!b", "!c"]
    for _ in range(3000):
        edges: list[Transition] = []
        while len(edges) < rng.randint(1, 9):
            first = rng.choice(pool)
            for _ in range(rng.randint(1, 4)):  # a run sharing ``first``
                rest = tuple(rng.sample(pool, rng.randint(0, 2)))
                guards = (first, *(g for g in rest if g.lstrip("!") != first.lstrip("!")))
                edges.append(Transition(*EDGE, guards))
        edges.append(Transition(*EDGE, ()))  # every group ends unguarded
        group = tuple(edges)
        values = {name: rng.random() < 0.5 for name in "abcd"}
        asked: list[str] = []

        def guard(name: str, asked: list[str] = asked, values: dict[str, bool] = values) -> bool:
            asked.append(name)
            return values[name]

        expected = choose(group, guard)
        evaluated: list[str] = []

        def check(name: str, seen: list[str] = evaluated, values: dict[str, bool] = values) -> Any:
            def test(machine: Any) -> bool:
                seen.append(name)
                return values[name]

            return test

        table = {n: check(n) for n in "abcd"}
        log: dict[str, bool] = {}
        assert compile_choice(group)(None, table, log) is expected, (group, values)
        assert evaluated == list(dict.fromkeys(asked)), (group, values)
        assert log == {name: values[name] for name in asked}
