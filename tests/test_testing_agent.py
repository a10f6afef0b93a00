"""Your agent under test: the application's own factory, faults per tool, the ledger."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Budget, Runtime, ToolRegistry
from fsm_agent.testing import (
    AgentUnderTest,
    KeyedScriptedModel,
    assert_history_valid,
    assert_no_duplicate_writes,
    assert_stopped,
    call,
    decide,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "examples" / "support_desk"))
from support_desk import Backend, make_runtime, register_tools

LOOKUP = decide(call("lookup_order", {"order_id": "A17"}, id="c1"))
REFUND = decide(call("issue_refund", {"order_id": "A17", "amount": 42.0}, id="c2"))
EMAIL = decide(call("send_email", {"to": "ann@example.com", "body": "Refunded."}, id="c3"))


def model(**script: Any) -> KeyedScriptedModel:
    keyed: dict[str | None, Any] = {None: LOOKUP}
    keyed.update(script)
    return KeyedScriptedModel(keyed)


def desk(**faults: list[str]) -> tuple[AgentUnderTest, Backend]:
    backend = Backend()
    return AgentUnderTest(make_runtime, faults=faults, backend=backend), backend


def test_a_transient_read_is_retried_and_runs_once() -> None:
    agent, _ = desk(lookup_order=["transient", "ok"])
    result = agent.run("Where is A17?", model=model(c1="It was delivered."))
    assert_stopped(result, "done")
    assert agent.faults.calls == [("lookup_order", "transient"), ("lookup_order", "ok")]
    assert [e.tool for e in agent.ledger.executed()] == ["lookup_order"]
    assert agent.time.slept  # the backoff moved the virtual clock; nothing waited


@pytest.mark.parametrize("fault", ["rejected", "raise"])
def test_a_failed_read_never_reaches_the_tool(fault: str) -> None:
    agent, _ = desk(lookup_order=[fault])
    result = agent.run("Where is A17?", model=model(c1="Sorry, the order service failed."))
    assert_stopped(result, "done")
    assert agent.ledger.executed() == []
    assert "injected" in result.messages[-2]["content"]


def test_a_write_that_times_out_stops_for_review_and_ran_never() -> None:
    agent, backend = desk(send_email=["timeout"])
    result = agent.run("Mail Ann", model=model(c1=EMAIL))
    assert_stopped(result, "review_required", "outcome_unknown")
    assert backend.emails == [] and agent.ledger.executed("send_email") == []


def test_a_lost_response_ran_the_write_once_and_stops_for_review() -> None:
    agent, backend = desk(send_email=["lost_response"])
    result = agent.run("Mail Ann", model=model(c1=EMAIL))
    assert_stopped(result, "review_required", "outcome_unknown")
    assert len(backend.emails) == 1 and len(agent.ledger.executed("send_email")) == 1
    assert_no_duplicate_writes(agent)
    assert_history_valid(result)


def test_a_slow_call_spends_the_wall_clock_budget() -> None:
    def factory(*, model: Any) -> Runtime:
        registry = ToolRegistry()
        register_tools(registry, Backend())
        budget = Budget(max_wall_clock_s=30)
        return Runtime(model=model, tools=registry, allowed_tools=registry.names(), budget=budget)

    agent = AgentUnderTest(factory, faults={"lookup_order": ["slow"]}, slow_s=45)
    result = agent.run("Where is A17?", model=model(c1="Delivered."))
    assert_stopped(result, "budget_exhausted", "wall_clock")
    assert len(agent.ledger.executed("lookup_order")) == 1


def test_the_approved_refund_runs_once_after_review() -> None:
    agent, backend = desk(issue_refund=["lost_response", "ok"])
    first = agent.run("Refund A17", model=model(c1=REFUND, c2="Refunded."))
    assert_stopped(first, "review_required", "approval_required")
    assert backend.refunds == []
    after = agent.approve(first.run_id, "c2", by="lead", resume=True)
    assert_stopped(after, "review_required", "outcome_unknown")
    assert backend.refunds == [{"order_id": "A17", "amount": 42.0}]
    assert_no_duplicate_writes(agent)


def test_the_ledger_catches_a_write_registered_as_a_read() -> None:
    def wrong(*, model: Any) -> Runtime:
        registry = ToolRegistry()
        emails: list[str] = []
        registry.register(
            lambda to, body: emails.append(to),
            name="send_email",
            schema={"type": "object", "properties": {"to": {}, "body": {}}},
            effect="read",  # the bug: a write declared as a read is retried
        )
        return Runtime(model=model, tools=registry, allowed_tools=["send_email"])

    agent = AgentUnderTest(wrong, faults={"send_email": ["lost_response"]}, writes=["send_email"])
    script = KeyedScriptedModel({None: EMAIL, "c3": "Sent."})
    assert_stopped(agent.run("Mail Ann", model=script), "done")
    with pytest.raises(AssertionError, match=r"write 'send_email' ran 2 times .* 'c3', 'c3'"):
        assert_no_duplicate_writes(agent)


def test_bad_harness_input_is_a_precise_error() -> None:
    with pytest.raises(ValueError, match=r"does not register: \['refund'\]; its tools are"):
        AgentUnderTest(make_runtime, faults={"refund": ["ok"]}).run("x", model=model())
    with pytest.raises(ValueError, match="unknown behaviours \\['lost'\\]"):
        AgentUnderTest(make_runtime, faults={"issue_refund": ["lost"]})
    with pytest.raises(ValueError, match="must be a list, got the string 'slow'"):
        AgentUnderTest(make_runtime, faults={"issue_refund": "slow"})

    def not_a_factory(*, model: Any) -> Any:
        return {}

    with pytest.raises(TypeError, match="returned dict, not a Runtime"):
        AgentUnderTest(not_a_factory).run("x", model=model())


def test_injected_faults_never_start_a_call_or_flood_the_output() -> None:
    agent, _ = desk(lookup_order=["not_started"])
    result = agent.run("Where is A17?", model=model(c1="The order service is busy."))
    assert_stopped(result, "done")
    assert agent.ledger.executed() == []
    assert '"not_executed"' in result.messages[-2]["content"]
    agent, _ = desk(lookup_order=["oversized"])
    result = agent.run("Where is A17?", model=model(c1="never asked"))
    assert_stopped(result, "budget_exhausted", "tool_output")
    assert len(agent.ledger.executed("lookup_order")) == 1  # it ran; its answer was too big


@pytest.mark.parametrize("state", ["validating", "executing", "observing", "deciding"])
def test_ctrl_c_on_entering_a_state_cancels_the_run_there(state: str) -> None:
    agent = AgentUnderTest(make_runtime, cancel_on_entering=state)
    result = agent.run("Where is A17?", model=model(c1="Delivered."))
    assert_stopped(result, "cancelled", "cancelled")
    assert agent.interrupted and not agent.crashed
    (cancel,) = [e for e in result.events if e.get("trigger") == "cancel"]
    assert cancel["source"] == state
    assert_history_valid(result)


def test_a_real_ctrl_c_is_never_swallowed() -> None:
    agent, _ = desk()
    with pytest.raises(KeyboardInterrupt):
        agent.run("Where is A17?", model=KeyedScriptedModel({None: KeyboardInterrupt()}))


def test_a_crash_after_the_refund_ran_resumes_from_its_stored_result() -> None:
    backend = Backend()
    agent = AgentUnderTest(make_runtime, crash_at="tool_returned", backend=backend)
    paused = agent.run("Refund A17", model=KeyedScriptedModel({None: REFUND, "c2": "Done."}))
    died = agent.approve(paused.run_id, "c2", resume=True)
    assert agent.crashed and died.status == "executing"  # what the store kept
    assert len(backend.refunds) == 1
    result = agent.resume(died.run_id)
    assert_stopped(result, "done")
    resumed = [e for e in result.events if e.get("trigger") == "resume"][-1]
    assert resumed["guards"] == {"write_outcome_lost": False, "write_result_stored": True}
    assert len(backend.refunds) == 1 and not agent.crashed
    assert_no_duplicate_writes(agent)


def test_a_crash_before_the_intent_is_claimed_runs_the_refund_once_after_resume() -> None:
    backend = Backend()
    agent = AgentUnderTest(make_runtime, crash_at="BeginIntent", backend=backend)
    paused = agent.run("Refund A17", model=KeyedScriptedModel({None: REFUND, "c2": "Done."}))
    died = agent.approve(paused.run_id, "c2", resume=True)
    assert agent.crashed and backend.refunds == []  # it died before the refund could start
    assert_stopped(agent.resume(died.run_id), "done")
    assert backend.refunds == [{"order_id": "A17", "amount": 42.0}]


def test_bad_mishaps_are_precise_errors() -> None:
    with pytest.raises(ValueError, match=r"cancel_on_entering='done' is not a working state"):
        AgentUnderTest(make_runtime, cancel_on_entering="done").run("x", model=model())
    with pytest.raises(ValueError, match=r"crash_at='explode' is neither a trigger .* BeginIntent"):
        AgentUnderTest(make_runtime, crash_at="explode").run("x", model=model())


def _desk_with_rule(*, model: Any, backend: Backend | None = None, store: Any = None) -> Runtime:
    """The support desk with one rule of its own: no mail to the competitor."""
    from fsm_agent import MemoryStore, Rule

    registry = ToolRegistry()
    register_tools(registry, backend if backend is not None else Backend())
    rule = Rule("no-mail-to-rival", on="before_tool", tools=["send_email"],
                when="args.to.endsWith('@rival.example')", then="deny")  # fmt: skip
    return Runtime(model=model, tools=registry, allowed_tools=registry.names(),
                   store=store if store is not None else MemoryStore(), rules=[rule])  # fmt: skip


def test_the_ledger_sees_a_rule_deny_and_the_denied_call_never_runs() -> None:
    backend = Backend()
    agent = AgentUnderTest(_desk_with_rule, backend=backend)
    rival = decide(call("send_email", {"to": "bob@rival.example", "body": "Hi."}, id="c1"))
    result = agent.run("Mail Bob", model=KeyedScriptedModel({None: rival, "c1": "Not sent."}))
    assert_stopped(result, "done")
    assert backend.emails == [] and agent.ledger.executed("send_email") == []
    assert agent.ledger.denied == [("c1", 1, "no-mail-to-rival")]
    assert agent.ledger.denied_but_ran() == []


def test_a_denied_call_that_ran_anyway_is_an_invariant_the_fuzzer_reports() -> None:
    # What an engine that ignored its own rule would leave in the ledger.
    from fsm_agent.sansio import CallTool, RuleJudged, ToolOutcome
    from fsm_agent.testing import Ledger

    ledger = Ledger()
    ledger.rounds = 1
    ledger.on_event(RuleJudged(seq=4, run_id="r", rule="no-mail-to-rival", phase="before_tool",
                               inputs_digest="sha256:0", verdict="deny", call_id="c1"))  # fmt: skip
    ran = CallTool("c1", "send_email", {"to": "bob@rival.example"}, None)
    ledger.intercept(ran, lambda request: ToolOutcome("ok", {}))
    assert ledger.denied_but_ran() == ["call 'c1' ran although rule 'no-mail-to-rival' denied it"]
