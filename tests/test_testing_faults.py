"""Fault tools behave as scripted, and the runtime classifies each behaviour as the rules say
(docs/concepts/rules.md)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from fsm_agent import Budget, Runtime
from fsm_agent.testing import (
    BEHAVIOURS,
    FakeClock,
    FaultyTool,
    FaultyTools,
    answer,
    assert_history_valid,
    assert_path,
    assert_stopped,
    call,
    decide,
)

MakeRuntime = Callable[..., Runtime]


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(start=5.0)
    assert clock() == 5.0
    clock.sleep(0.25)
    clock.advance(1.0)
    assert clock() == 6.25
    assert clock.slept == [0.25]
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1)


def test_fault_tool_validates_its_script() -> None:
    with pytest.raises(ValueError, match="unknown behaviours \\['explode'\\]"):
        FaultyTool("t", faults=["explode"])
    with pytest.raises(ValueError, match="need a FakeClock"):
        FaultyTool("t", faults=["timeout"])
    assert set(BEHAVIOURS) >= {"ok", "transient", "rejected", "timeout", "oversized"}


def test_transient_read_is_retried_without_real_waiting(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime, fsm_clock: FakeClock
) -> None:
    lookup = fsm_tools.read("lookup", faults=["transient", "transient"])
    result = fsm_runtime([decide(call("lookup", {"key": "A"})), answer("ok")]).run("?")
    assert lookup.attempts == 2  # default RetryPolicy: 2 attempts in total
    assert fsm_clock.slept == [0.05]
    assert_stopped(result, "done", "final_answer")
    observation = json.loads(result.messages[2]["content"])
    assert observation["error"] == "tool_failed" and observation["attempts"] == 2


@pytest.mark.parametrize(
    ("behaviour", "reason", "effects"),
    [
        ("error", "outcome_unknown", 0),
        ("error_after_effect", "outcome_unknown", 1),
        ("timeout_after_effect", "outcome_unknown", 1),
        ("transient", "outcome_unknown", 0),
    ],
)
def test_write_failures_stop_for_review(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime, behaviour: str, reason: str, effects: int
) -> None:
    ticket = fsm_tools.write("ticket", faults=[behaviour])
    fsm_tools.read("lookup")
    script = [decide(call("ticket", {"key": "K"}), call("lookup", {"key": "A"}))]
    result = fsm_runtime(script).run("?")
    assert_stopped(result, "review_required", reason)
    assert ticket.attempts == 1 and len(ticket.effects) == effects
    assert fsm_tools["lookup"].attempts == 0
    assert_history_valid(result)
    errors = [json.loads(m["content"])["error"] for m in result.messages if m["role"] == "tool"]
    assert errors == ["outcome_unknown", "skipped_pending_review"]


def test_rejected_write_is_an_observation(fsm_tools: FaultyTools, fsm_runtime: MakeRuntime) -> None:
    ticket = fsm_tools.write("ticket", faults=["rejected"])
    result = fsm_runtime([decide(call("ticket", {"key": "K"})), answer("refused")]).run("?")
    assert_stopped(result, "done")
    assert ticket.effects == []
    assert json.loads(result.messages[2]["content"])["error"] == "rejected"


def test_timeout_spends_the_fake_clock(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime, fsm_clock: FakeClock
) -> None:
    fsm_tools.read("lookup", faults=["timeout"], timeout_s=3.0)
    result = fsm_runtime(
        [decide(call("lookup", {"key": "A"}))], budget=Budget(max_wall_clock_s=2.0)
    ).run("?")
    assert_stopped(result, "budget_exhausted", "wall_clock")
    assert_path(result, ["executing", "observing", "budget_exhausted"], exact=False)
    assert fsm_clock() == 1003.0


def test_oversized_and_hostile_output(fsm_tools: FaultyTools, fsm_runtime: MakeRuntime) -> None:
    fsm_tools.read("big", faults=["oversized"], oversized_bytes=5000)
    fsm_tools.read("evil", faults=["hostile"])
    result = fsm_runtime(
        [decide(call("evil", {"key": "A"})), answer("ok")], allowed_tools=["evil"]
    ).run("?")
    assert_stopped(result, "done")  # text in output grants nothing
    assert "SYSTEM OVERRIDE" in result.messages[2]["content"]
    result = fsm_runtime(
        [decide(call("big", {"key": "A"}))], budget=Budget(max_output_bytes=1000)
    ).run("?")
    assert_stopped(result, "budget_exhausted", "tool_output")


def test_fsm_model_fixture(fsm_model: Callable[..., object]) -> None:
    model = fsm_model([answer("hi")])
    assert model([], []) == answer("hi")  # type: ignore[operator]


def test_interrupts_end_the_run_in_a_defined_state(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime
) -> None:
    from fsm_agent.testing._scenarios import run_through_interrupts

    ticket = fsm_tools.write("ticket", faults=["interrupt_after_effect"])
    fsm_tools.read("lookup")
    runtime = fsm_runtime([decide(call("ticket", {"key": "K"}), call("lookup", {"key": "A"}))])
    with pytest.raises(KeyboardInterrupt):
        runtime.run("?")
    assert len(ticket.effects) == 1
    result, interrupted = run_through_interrupts(
        fsm_runtime([decide(call("lookup", {"key": "A"}))]), "?", run_id="r"
    )
    assert not interrupted and result.status == "protocol_error"  # the script ran out
    ticket.faults.append("interrupt")
    result, interrupted = run_through_interrupts(
        fsm_runtime([decide(call("ticket", {"key": "K"}))]), "?", run_id="r2"
    )
    assert interrupted
    assert_stopped(result, "review_required", "outcome_unknown")  # a write was in flight
    assert_history_valid(result)


def test_clock_interrupt_fires_once(fsm_clock: FakeClock) -> None:
    fsm_clock.interrupt_next_read()
    with pytest.raises(KeyboardInterrupt):
        fsm_clock()
    assert fsm_clock() == 1000.0


def test_a_call_with_other_argument_names_runs_instead_of_passing_silently(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime
) -> None:
    """Issue 13: a kit tool refused any argument but ``key``, so a script calling it with
    ``order_id`` was answered ``invalid_arguments``, the tool never ran, and the run still
    ended ``done``. A kit tool now takes any object and really runs."""
    lookup = fsm_tools.read("lookup")
    ticket = fsm_tools.write("create_ticket", idempotent=True)
    script = [
        decide(
            call("lookup", {"order_id": "A17"}),
            call("create_ticket", {"request_id": "R-1", "title": "late"}),
        ),
        decide(call("create_ticket", {"request_id": "R-1", "title": "late"}, id="again")),
        answer("A17 is late; ticket opened."),
    ]
    result = fsm_runtime(script).run("Where is A17?")
    assert_stopped(result, "done", "final_answer")
    assert lookup.calls == [{"order_id": "A17"}]
    # Keyed by all its arguments when it has no ``key``: the repeat is a replay.
    assert len(ticket.effects) == 1 and result.counters["replays"] == 1
    outputs = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"]
    assert not any(isinstance(o, dict) and o.get("error") for o in outputs), outputs


def test_with_key_schema_a_mismatched_call_is_refused_and_never_runs(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime
) -> None:
    from fsm_agent.testing._faults import KEY_SCHEMA

    lookup = fsm_tools.read("lookup", schema=KEY_SCHEMA)
    result = fsm_runtime(
        [decide(call("lookup", {"order_id": "A17"})), answer("Sorry.")], policy="strict"
    ).run("?")
    assert_stopped(result, "protocol_error", "invalid_arguments")
    assert lookup.attempts == 0
