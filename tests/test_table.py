"""The transition table resolves completely and is checked at import."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, get_args

from fsm_agent._core.actions import ACTIONS
from fsm_agent._core.engine import RUN_MACHINE
from fsm_agent._core.guards import GUARDS
from fsm_agent._core.judging import RULE_ACTIONS, RULE_REASONS
from fsm_agent._core.table import (
    INITIAL_STATE,
    LEGACY_MACHINE_HASHES,
    MACHINE_HASH,
    STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Action,
    Reason,
    State,
    Transition,
    Trigger,
    check_table,
    definition,
    edge_by_key,
)


def test_the_table_is_consistent() -> None:
    assert check_table(TRANSITIONS, GUARDS) == []


def test_every_name_in_the_table_resolves() -> None:
    for t in TRANSITIONS:
        for g in t.guards:
            assert g.lstrip("!") in GUARDS, t
        assert t.action is None or t.action in ACTIONS
        assert t.rule, f"{t.label} does not say which rule it encodes"
    assert set(RUN_MACHINE.states) == set(STATES)
    assert set(RUN_MACHINE.events) == {t.trigger for t in TRANSITIONS}


def test_no_dead_guard_and_no_state_without_edges() -> None:
    used = {g.lstrip("!") for t in TRANSITIONS for g in t.guards}
    assert used == set(GUARDS), f"guards never used: {set(GUARDS) - used}"
    for state in STATES:
        touching = [t for t in TRANSITIONS if state in (t.source, t.dest)]
        assert touching, state
    for state in set(STATES) - set(TERMINAL_STATES):
        assert any(t.source == state for t in TRANSITIONS), f"{state} is a dead end"


def test_terminal_states_carry_a_reason_and_are_left_only_by_resume() -> None:
    for t in TRANSITIONS:
        if t.source in TERMINAL_STATES and t.dest == t.source:
            # A review: the run stays paused and keeps its stop reason.
            assert t.trigger == "review" and t.reason is None, t
            continue
        assert (t.dest in TERMINAL_STATES) == (t.reason is not None), t
        assert t.source not in TERMINAL_STATES or t.trigger == "resume", t


def test_a_self_loop_on_a_terminal_state_may_not_set_a_reason() -> None:
    bad = Transition("review", "review_required", "review_required", (), "cancelled")
    assert (
        "review (review_required->review_required): a self-loop on a terminal state keeps "
        "the stop reason" in check_table((bad,), GUARDS)
    )


def test_the_machine_is_shared_and_never_attached() -> None:
    assert RUN_MACHINE.models == []  # runs are fired through machine.events, not add_model
    assert INITIAL_STATE == "deciding"


def test_check_table_finds_each_kind_of_mistake() -> None:
    T: Any = Transition  # rows a well-typed table could not hold: that is the point here
    bad = (
        T("go", "deciding", "validating", ("no_such_guard",)),
        T("go", "deciding", "done", (), "final_answer"),
        T("stop", "deciding", "nowhere", (), None),
        T("halt", "deciding", "done", ()),
        T("shadow", "deciding", "validating", ()),
        T("shadow", "deciding", "done", ("has_answer",), "final_answer"),
        T("again", "done", "deciding", ()),
        T("boom", "deciding", "validating", ("has_answer",), None, "explode"),
    )
    problems = "\n".join(check_table(bad, GUARDS))
    assert "unknown guard 'no_such_guard'" in problems
    assert "unknown action 'explode'" in problems
    assert "unknown state 'nowhere'" in problems
    assert "halt (deciding->done): reason and terminal disagree" in problems
    assert "shadow in deciding: the last edge must be an unguarded fallback" in problems
    assert "shadow in deciding: an unguarded edge shadows later edges" in problems
    assert "only 'resume' may leave a terminal state" in problems
    assert "state 'executing' is unreachable" in problems


def test_edges_have_one_identity_an_index_and_a_stable_key() -> None:
    assert [t.index for t in TRANSITIONS] == list(range(len(TRANSITIONS)))
    assert len({t.key for t in TRANSITIONS}) == len(TRANSITIONS)
    assert all(edge_by_key(t.key) is t for t in TRANSITIONS)
    assert TRANSITIONS[7].key == "validate/validating->done[!has_tool_calls,has_answer]"


def test_the_literal_types_name_exactly_what_the_table_uses() -> None:
    assert set(get_args(State)) == set(STATES)
    assert set(get_args(Trigger)) == {t.trigger for t in TRANSITIONS}
    # The user's rules add rows with reasons and actions of their own (core/judging.py).
    reasons = {t.reason for t in TRANSITIONS if t.reason}
    assert set(get_args(Reason)) == reasons | RULE_REASONS and not reasons & RULE_REASONS
    actions = {t.action for t in TRANSITIONS if t.action}
    assert set(get_args(Action)) == actions | RULE_ACTIONS == set(ACTIONS)
    assert not actions & RULE_ACTIONS


def test_the_hash_covers_every_column_the_runtime_uses() -> None:
    row = definition()["transitions"][0]
    t = TRANSITIONS[0]
    assert row == [t.trigger, t.source, t.dest, list(t.guards), t.reason, t.action]
    assert MACHINE_HASH not in LEGACY_MACHINE_HASHES


def test_hash_is_stable_across_processes() -> None:
    code = "import fsm_agent._core.table as m; print(m.MACHINE_HASH)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == MACHINE_HASH
    assert MACHINE_HASH.startswith("sha256:")
    assert len(definition()["transitions"]) == len(TRANSITIONS)


def test_importing_the_package_stays_light() -> None:
    # `import fsm_agent` is on every agent's start-up path (target: <= 100 ms, measured in
    # benchmarks/overhead.py); asyncio, sqlite3 and the provider SDKs load only when used.
    code = (
        "import sys, fsm_agent; print(sorted(m for m in ('asyncio', 'sqlite3', 'openai', "
        "'anthropic', 'mcp', 'graphviz', 'pytest', 'genai_prices', 'rfc3987_syntax', 'lark') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_each_edge_knows_its_checkpoint_point() -> None:
    """``save_point`` is read off the edge's columns once: an end or a resume, a call's
    attempt or result, a batch's start, or none (the loop's ``_wants_save`` reads it)."""
    from fsm_agent._core.table import CALL_STEP, ENDS, STARTS_BATCH, Transition

    for t in TRANSITIONS:
        if t.dest in TERMINAL_STATES or t.trigger == "resume":
            want = ENDS
        elif t.action == "start_attempt" or t.trigger == "tool_returned":
            want = CALL_STEP
        elif t.action == "start_batch":
            want = STARTS_BATCH
        else:
            want = 0
        assert t.save_point == want, t.key
    outside = Transition("observe", "observing", "done", ("has_answer",), "final_answer", "finish")
    assert (
        outside.save_point == ENDS
        and Transition("observe", "observing", "deciding").save_point == 0
    )
