"""The regression cases of the first seed article and the scenarios of the second."""

from __future__ import annotations

import json

import pytest
from conftest import (
    Approval,
    Backend,
    Budget,
    TransientToolError,
    assert_valid_run,
    call,
    calls,
    make_runtime,
    say,
)

from fsm_agent._cli.demo import SCENARIOS

# ── article 1: six regression cases ───────────────────────────────────────────────


def test_results_are_bound_to_their_call_ids_not_positions() -> None:
    b = Backend()
    batch = calls(call("b", "lookup", order_id="A18"), call("a", "lookup", order_id="A17"))
    result = make_runtime([batch, say("Both in transit.")], b).run("A17 and A18?")
    assert_valid_run(result)
    by_id = {
        m["tool_call_id"]: json.loads(m["content"]) for m in result.messages if m["role"] == "tool"
    }
    assert by_id["a"]["value"]["order_id"] == "A17"
    assert by_id["b"]["value"]["order_id"] == "A18"
    assert result.messages[1]["tool_calls"] == batch["tool_calls"]  # the call stays in context


@pytest.mark.parametrize(
    "arguments, needle",
    [
        ('{"order_id": "A17", "extra": 1}', "Additional properties"),
        ('{"order_id": 17}', "is not of type 'string'"),
        ('{"order_id": "A17"', "not valid JSON"),
        ('{"order_id": "A17", "order_id": "A18"}', "duplicate key 'order_id'"),
        ('{"order_id": ""}', "should be non-empty"),
        ('{"order_id": "' + "x" * 81 + '"}', "is too long"),
    ],
)
def test_invalid_arguments_and_permissions_are_observations(arguments: str, needle: str) -> None:
    b = Backend()
    script = [calls(call("c1", "lookup", arguments), call("c2", "admin")), say("Sorry.")]
    result = make_runtime(script, b).run("Where is A17?")
    assert_valid_run(result)
    assert (result.status, result.reason) == ("done", "final_answer")
    first, second = (json.loads(m["content"]) for m in result.messages[2:4])
    assert first["error"] == "invalid_arguments" and needle in first["detail"], first
    assert second == {
        "ok": False,
        "error": "permission_denied",
        "detail": "tool 'admin' is not in this run's allowed_tools",
    }
    assert b.lookups == [] and result.counters["tool_attempts"] == {}


def test_a_transient_read_failure_is_retried_exactly_once() -> None:
    b = Backend()
    b.fail_reads += [TransientToolError("busy"), TransientToolError("busy again")]
    result = make_runtime([calls(call("c1", "lookup", order_id="A17")), say("Try later.")], b).run(
        "A17?"
    )
    assert_valid_run(result)
    assert len(b.lookups) == 2 and result.counters["retries"] == 1
    assert json.loads(result.messages[2]["content"])["error"] == "tool_failed"


def test_a_write_with_unknown_outcome_pauses_and_is_never_redone() -> None:
    b = Backend()
    b.fail_writes.append((RuntimeError("socket closed"), True))
    script = [
        calls(
            call("w1", "write", request_id="R-1", title="t"),
            call("w2", "write", request_id="R-2", title="t"),
        )
    ]
    result = make_runtime(script, b, retry=__import__("fsm_agent").RetryPolicy(5)).run("go")
    assert_valid_run(result)
    assert (result.status, result.reason) == ("review_required", "outcome_unknown")
    assert [w["request_id"] for w in b.writes] == ["R-1"]
    answers = [json.loads(m["content"])["error"] for m in result.messages if m["role"] == "tool"]
    assert answers == ["outcome_unknown", "skipped_pending_review"]


def test_the_tool_round_budget_stops_before_a_third_round() -> None:
    b = Backend()
    script = [calls(call(f"c{i}", "lookup", order_id=f"A{i}")) for i in range(5)]
    result = make_runtime(script, b, budget=Budget(max_tool_rounds=2)).run("loop")
    assert_valid_run(result)
    assert (result.status, result.reason) == ("budget_exhausted", "tool_rounds")
    assert b.lookups == ["A0", "A1"] and result.counters["model_calls"] == 3


def test_a_duplicate_call_id_rejects_the_whole_batch() -> None:
    b = Backend()
    script = [calls(call("x", "lookup", order_id="A17"), call("x", "lookup", order_id="A18"))]
    result = make_runtime(script, b).run("two orders")
    assert_valid_run(result)
    assert (result.status, result.reason) == ("protocol_error", "duplicate_tool_call_id")
    assert b.lookups == [] and result.messages == [{"role": "user", "content": "two orders"}]


# ── article 2: the five scenarios and the lost write ──────────────────────────────


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_demo_scenario_behaves_as_the_article_says(name: str) -> None:
    outcome = SCENARIOS[name].run()
    assert outcome.ok, {k: v for k, v in outcome.checks.items() if v[0] != v[1]}
    for result in outcome.results:
        assert_valid_run(result)


def test_approved_true_in_arguments_grants_nothing() -> None:
    b = Backend()
    script = [
        calls(call("w1", "write", request_id="R-1", title="t", approved=True)),
        say("Could not."),
    ]
    result = make_runtime(script, b, approval=True).run("go")
    assert_valid_run(result)
    assert b.writes == []
    assert json.loads(result.messages[2]["content"])["error"] == "invalid_arguments"


def test_an_approval_binds_the_exact_arguments() -> None:
    b = Backend()
    approval = Approval("write", {"request_id": "R-1", "title": "t"})
    ok = make_runtime(
        [calls(call("w1", "write", request_id="R-1", title="t")), say("ok")],
        b,
        approval=True,
        approvals=[approval],
    ).run("go")
    assert ok.status == "done" and len(b.writes) == 1
    other = make_runtime(
        [calls(call("w1", "write", request_id="R-1", title="T"))],
        b,
        approval=True,
        approvals=[approval],
    ).run("go")
    assert (other.status, other.reason) == ("review_required", "approval_required")
    assert len(b.writes) == 1


def test_an_id_reused_in_a_later_round_is_answered_again_at_a_stop() -> None:
    # Some servers number calls per turn ("call_0" every round): ids are unique per batch.
    b = Backend()
    script = [
        calls(call("call_0", "lookup", order_id="A17")),
        calls(call("call_0", "write", request_id="R-1", title="t")),
    ]
    result = make_runtime(script, b, approval=True).run("go")
    assert_valid_run(result)
    assert (result.status, result.reason) == ("review_required", "approval_required")
    assert [m.get("tool_call_id") for m in result.messages[-1:]] == ["call_0"]
