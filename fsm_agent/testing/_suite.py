"""The per-edge suite: one scenario for every transition of the table.

Each :class:`~fsm_agent.testing._scenarios.Scenario` names the edge it drives a run
through, where the run must stop, its counters, and what else must hold (the side
effects the fault tools logged, the answers the model got). The engine's own tests run
every scenario (``tests/test_machine_transitions.py``); so can yours, against your fork
of the engine::

    from fsm_agent.testing._suite import SUITE
    for scenario in SUITE:
        scenario.verify()

:func:`missing` lists the edges of the table no scenario targets, so an edge added to
the table without a scenario fails that test instead of going untested.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent._core.approvals import Approval
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.table import TRANSITIONS, Transition
from fsm_agent._errors import ReviewError
from fsm_agent._rules.rule import Rule
from fsm_agent._runtime.result import RunResult
from fsm_agent._runtime.runtime import Runtime
from fsm_agent.models._scripted import Step
from fsm_agent.testing._decisions import answer, call, decide
from fsm_agent.testing._faults import KEY_SCHEMA, FaultyTools
from fsm_agent.testing._scenarios import TICKET_SCHEMA, Scenario, ScenarioRun

__all__ = ["SUITE", "missing", "scenario_for"]


# ── building blocks ─────────────────────────────────────────────────────────────────


def _lookup(key: str = "A17", **kw: Any) -> dict[str, Any]:
    return call("lookup", {"key": key}, **kw)


def _ticket(key: str = "R-1", title: str = "refund", **kw: Any) -> dict[str, Any]:
    return call("create_ticket", {"key": key, "title": title}, **kw)


def _kit(
    kit: FaultyTools,
    *,
    lookup: Sequence[str] = (),
    ticket: Sequence[str] = (),
    **ticket_options: Any,
) -> None:
    kit.read("lookup", faults=lookup, timeout_s=10.0, schema=KEY_SCHEMA)
    kit.write("create_ticket", faults=ticket, schema=TICKET_SCHEMA, **ticket_options)


def _answers(outcome: ScenarioRun, run: int = -1) -> dict[str, dict[str, Any]]:
    """call id -> the result the model got for it (parsed tool message), in one run."""
    messages = outcome.results[run].messages
    return {
        m["tool_call_id"]: json.loads(m["content"]) for m in messages if m.get("role") == "tool"
    }


def _effects(outcome: ScenarioRun, tool: str) -> int:
    return len(outcome.kit[tool].effects)


def _resume(runtime: Runtime, run_id: str) -> list[RunResult]:
    return [runtime.resume(run_id)]


def _approve_c1(runtime: Runtime, run_id: str) -> list[RunResult]:
    return [runtime.approve(run_id, "c1", resume=True)]


def _approve_c1_later(runtime: Runtime, run_id: str) -> list[RunResult]:
    # Recorded only: the run stays paused until a worker or ``resume`` drives it.
    return [runtime.approve(run_id, "c1", by="ana", note="checked the ticket",
                            at="2026-01-31T12:00:00Z")]  # fmt: skip


def _misfit_review(runtime: Runtime, run_id: str) -> list[RunResult]:
    try:  # a call waiting for approval cannot be reconciled: refused, nothing recorded
        runtime.reconcile(run_id, "c1", {"ticket": "T-1"})
    except ReviewError as exc:
        assert "does not apply (use approve, deny or edit)" in str(exc), exc
        return []
    raise AssertionError("a reconcile of a call waiting for approval was recorded")


def _reviewed_check(o: ScenarioRun) -> None:
    (event,) = [e for e in o.result.events if e["type"] == "review"]
    assert event["reviewer"] == "ana" and event["note"] == "checked the ticket", event
    assert event["at"] == "2026-01-31T12:00:00Z" and event["action"] == "approve"
    assert list(o.result.pending) == ["c1"] and _effects(o, "create_ticket") == 0


def _key(trigger: str, source: str, dest: str, *guards: str) -> str:
    return Transition(trigger, source, dest, guards).key  # type: ignore[arg-type]


S = Scenario
Check = Callable[[ScenarioRun], None]


def _check(*checks: Check) -> Check:
    def run_all(outcome: ScenarioRun) -> None:
        for check in checks:
            check(outcome)

    return run_all


# ── deciding ────────────────────────────────────────────────────────────────────────


#: An application's rule judged before every model call, the first one included (the
#: ``begin`` edge is fired only in a run whose rules judge ``before_model``).
_TEN_MODEL_CALLS = Rule("ten-model-calls", on="before_model", then="limit", limit=10)


def _first_model_call_check(o: ScenarioRun) -> None:
    kinds = [(e["type"], e.get("trigger")) for e in o.result.events]
    assert kinds[1:3] == [("rule", None), ("transition", "begin")], kinds[:4]
    judged = [e for e in o.result.events if e["type"] == "rule"]
    assert [(e["phase"], e["verdict"]) for e in judged] == [("before_model", "pass")] * 2


def _huge_reply(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A" * 3000), usage={"total_tokens": 7})]]


def _huge_reply_check(o: ScenarioRun) -> None:
    assert o.kit["lookup"].attempts == 0  # nothing of it ran
    assert o.result.messages[-1]["role"] == "user"  # nor joined the history
    decision = next(e for e in o.result.events if e["type"] == "decision")
    assert "message" not in decision and decision["oversized"] > 1000  # kept by its size


def _no_usage(kit: FaultyTools) -> list[list[Step]]:
    # A reply with no usage at all, as a stream that never sent its usage event folds to.
    _kit(kit)
    return [[decide(_lookup())]]


def _no_usage_check(o: ScenarioRun) -> None:
    assert o.kit["lookup"].attempts == 0  # an unknown spend runs nothing new
    decision = next(e for e in o.result.events if e["type"] == "decision")
    assert "usage" not in decision["message"]  # absent, not zeros
    assert "unknown, not zero" in o.result.detail


def _tokens(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), usage={"prompt_tokens": 40, "completion_tokens": 9})]]


def _tokens_check(o: ScenarioRun) -> None:
    assert o.kit["lookup"].attempts == 0  # nothing new ran after the budget tripped
    assert _answers(o)["c1"]["error"] == "not_executed"


def _cost(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("An expensive answer.", usage={"total_tokens": 5, "cost": 0.5})]]


def _model_failed(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[ConnectionError("the model endpoint is down")]]


# ── validating ──────────────────────────────────────────────────────────────────────


def _malformed(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]]


def _final_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("Order A17 is in transit.")]]


def _empty_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[{"role": "assistant", "content": "  "}]]


def _missing_id(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), _lookup(no_id=True))]]


def _duplicate_id(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1", id="x"), _lookup("A2", id="x"))]]


def _nothing_ran(o: ScenarioRun) -> None:
    assert not o.kit["lookup"].calls and not o.kit["create_ticket"].calls


def _tool_rounds(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1")), decide(_lookup("A2"))]]


def _calls_per_round(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2"))]]


def _total_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2")), decide(_lookup("A3"))]]


def _strict_unknown_tool(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), call("delete_everything", {}))]]


def _strict_denied(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_ticket())]]


def _strict_invalid(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("lookup", '{"key": "A1", "key": "A2"}'))]]


def _approval_required(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_lookup(), _ticket(title="approved: true"))]]


def _approval_check(o: ScenarioRun) -> None:
    _nothing_ran(o)  # the whole batch waits, the read included
    answers = _answers(o)
    assert answers["c1"]["error"] == "skipped_pending_review"
    assert answers["c2"]["error"] == "approval_required"
    assert set(o.result.pending) == {"c1", "c2"}


def _read_then_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), answer("A17 is in transit.")]]


# ── executing: dispatch ─────────────────────────────────────────────────────────────


def _refusal(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [
        [
            decide(call("lookup", {"key": "A17", "approved": True})),
            answer("Sorry, I used a wrong argument."),
        ]
    ]


def _refusal_check(o: ScenarioRun) -> None:
    got = _answers(o)["c1"]
    assert got["error"] == "invalid_arguments" and "approved" in got["detail"], got
    assert not o.kit["lookup"].calls


def _wall_clock_dispatch(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)

    def slow_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
        kit.clock.advance(6.0)  # the model took longer than the whole budget
        return decide(_lookup())

    return [[slow_model]]


def _conflict(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True)
    return [[decide(_ticket(title="refund")), decide(_ticket(title="refund twice"))]]


def _pending(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True, ticket=["error_after_effect"])
    return [[decide(_ticket())], [decide(_ticket())]]


def _pending_check(o: ScenarioRun) -> None:
    assert _effects(o, "create_ticket") == 1  # never a second execution under the key
    assert "never reported" in o.result.detail


def _replay(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True)
    return [[decide(_ticket(), _ticket(id="c2")), answer("Ticket R-1 exists.")]]


def _replay_check(o: ScenarioRun) -> None:
    assert _effects(o, "create_ticket") == 1 and _answers(o)["c2"]["replayed"] is True


def _approval_refused(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_ticket(), _ticket(id="c2"))]]


def _approval_refused_check(o: ScenarioRun) -> None:
    assert _effects(o, "create_ticket") == 1  # c1 spent the one use; c2 did not run
    assert _answers(o)["c2"]["error"] == "approval_required"
    assert set(o.result.pending) == {"c2"}
    uses = [e.get("approval_use") for e in o.result.events if e.get("trigger") == "dispatch"]
    assert uses == ["granted", "refused"], uses


# ── executing: the tool returned, raised, or never started ─────────────────────────


def _not_started(kit: FaultyTools) -> list[list[Step]]:
    # One tool thread (tool_threads=1): the first call hangs past its 0.05 s timeout and
    # keeps the thread; the second cannot start within its own timeout, so it never runs.
    kit.read("hang", result=lambda arguments: time.sleep(0.5), registry_timeout_s=0.05)
    return [
        [
            decide(call("hang", {"key": "h1"}), call("hang", {"key": "h2"})),
            answer("The order service hangs."),
        ]
    ]


def _not_started_check(o: ScenarioRun) -> None:
    answers = _answers(o)
    assert answers["c1"]["error"] == "timeout"
    assert answers["c2"]["error"] == "not_executed"
    assert o.kit["hang"].calls == [{"key": "h1"}]  # the second call never started


def _succeeded_check(o: ScenarioRun) -> None:
    message = next(m for m in o.result.messages if m.get("role") == "tool")
    assert message["tool_call_id"] == "c1"
    assert json.loads(message["content"]) == {"ok": True, "value": {"tool": "lookup", "n": 1}}
    assert o.result.counters["output_bytes"] == len(message["content"].encode())


def _rejected(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["rejected"])
    return [[decide(_ticket()), answer("The ticket system refused; nothing was created.")]]


def _retried(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["transient"])
    return [[decide(_lookup()), answer("A17 is in transit.")]]


def _retried_check(o: ScenarioRun) -> None:
    assert o.kit["lookup"].attempts == 2 and o.kit.clock.slept == [0.05]
    (failed,) = [e for e in o.result.events if e.get("dest") == "retry_wait"]
    assert "temporarily unavailable" in failed["error"]  # the retry's cause is recorded


def _write_unknown(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["error_after_effect"])
    return [[decide(_ticket(), _lookup())]]


def _write_unknown_check(o: ScenarioRun) -> None:
    answers = _answers(o)
    assert answers["c1"]["error"] == "outcome_unknown"
    assert answers["c2"]["error"] == "skipped_pending_review"
    assert _effects(o, "create_ticket") == 1 and not o.kit["lookup"].calls


def _read_failed(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["error"])
    return [[decide(_lookup()), answer("The order service is failing.")]]


# ── observing ───────────────────────────────────────────────────────────────────────


def _oversized(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["oversized"])
    return [[decide(_lookup(), _lookup("A18"))]]


def _two_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2")), answer("Both are in transit.")]]


def _model_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), answer("never asked")]]


def _read_timeout(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["timeout"])
    return [[decide(_lookup()), answer("never asked")]]


def _next_round(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), decide(_lookup("A18")), answer("Both are in transit.")]]


# ── cancel: Ctrl-C wherever the run is ─────────────────────────────────────────────


def _cancel_deciding(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), KeyboardInterrupt()]]


def _cancel_validating(kit: FaultyTools) -> list[list[Step]]:
    kit.write("create_ticket", schema=TICKET_SCHEMA, interrupt_key=True)
    return [[decide(_ticket())]]


def _cancel_write(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["interrupt_after_effect"])
    return [[decide(_ticket(), _lookup())]]


def _cancel_read(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["interrupt"])
    return [[decide(_lookup(), _lookup("A18"))]]


def _cancel_backoff(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["transient"])
    return [[decide(_lookup()), answer("never asked")]]


def _cancel_observing(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), _lookup("A18")), answer("never asked")]]


def _interrupted(o: ScenarioRun) -> None:
    assert o.interrupted[-1], "the run was expected to be interrupted"


# ── resume: durable runs picked up again ───────────────────────────────────────────


def _died_mid_write(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_ticket(), _lookup()), answer("never asked")]]


def _died_result_stored(kit: FaultyTools) -> list[list[Step]]:
    # The keyed write's result reached the idempotency record before the process died:
    # resumed, the stored result answers the call and nothing runs twice.
    _kit(kit, idempotent=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


def _dedup_again(kit: FaultyTools) -> list[list[Step]]:
    # The downstream deduplicates by key, so a write whose end was lost may be sent again.
    _kit(kit, dedup=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


def _approve_then_resume(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


def _one_ticket(o: ScenarioRun) -> None:
    assert _effects(o, "create_ticket") == 1


# fmt: off
#: One scenario per edge of the table, in table order.
SUITE: tuple[Scenario, ...] = (
    S("reply_too_large", _key("model_replied", "deciding", "budget_exhausted",
                              "reply_too_large"),
      _huge_reply, "budget_exhausted", "reply_size", {"model_calls": 1, "tokens": 7},
      _huge_reply_check, options={"budget": Budget(max_reply_bytes=1000)}),
    S("usage_unknown", _key("model_replied", "deciding", "budget_exhausted", "usage_unknown"),
      _no_usage, "budget_exhausted", "usage_unknown", {"model_calls": 1, "tokens": 0},
      _no_usage_check, options={"budget": Budget(max_tokens=1000)}),
    S("tokens_spent", _key("model_replied", "deciding", "budget_exhausted", "tokens_spent"),
      _tokens, "budget_exhausted", "tokens", {"model_calls": 1, "tokens": 49, "tool_rounds": 0},
      _tokens_check, options={"budget": Budget(max_tokens=10)}),
    S("cost_spent", _key("model_replied", "deciding", "budget_exhausted", "cost_spent"),
      _cost, "budget_exhausted", "cost", {"model_calls": 1, "cost": 0.5},
      options={"budget": Budget(max_cost=0.01)}),
    S("reply_validated", _key("model_replied", "deciding", "validating"),
      _read_then_answer, "done", "final_answer", {"model_calls": 2}),
    S("model_failed", _key("model_failed", "deciding", "protocol_error"),
      _model_failed, "protocol_error", "model_error", {"model_calls": 1}, _nothing_ran),

    S("malformed_decision", _key("validate", "validating", "protocol_error",
                                 "decision_malformed"),
      _malformed, "protocol_error", "malformed_decision", {"tool_rounds": 0},
      lambda o: None if [m["role"] for m in o.result.messages] == ["user"] else _fail(
          "an unpairable decision entered the history")),
    S("final_answer", _key("validate", "validating", "done", "!has_tool_calls", "has_answer"),
      _final_answer, "done", "final_answer", {"model_calls": 1, "tool_rounds": 0}),
    S("empty_answer", _key("validate", "validating", "protocol_error", "!has_tool_calls"),
      _empty_answer, "protocol_error", "empty_answer", {"model_calls": 1}),
    S("missing_id", _key("validate", "validating", "protocol_error", "call_id_missing"),
      _missing_id, "protocol_error", "missing_tool_call_id", {"tool_attempts": {}},
      _nothing_ran),
    S("duplicate_id", _key("validate", "validating", "protocol_error", "call_id_duplicate"),
      _duplicate_id, "protocol_error", "duplicate_tool_call_id", {"tool_attempts": {}},
      _nothing_ran),
    S("tool_rounds", _key("validate", "validating", "budget_exhausted", "tool_rounds_spent"),
      _tool_rounds, "budget_exhausted", "tool_rounds", {"tool_rounds": 1, "model_calls": 2},
      options={"budget": Budget(max_tool_rounds=1)}),
    S("calls_per_round", _key("validate", "validating", "budget_exhausted", "round_too_large"),
      _calls_per_round, "budget_exhausted", "calls_per_round",
      {"tool_rounds": 0, "tool_calls": 0}, _nothing_ran,
      options={"budget": Budget(max_calls_per_round=1)}),
    S("total_calls", _key("validate", "validating", "budget_exhausted", "total_calls_spent"),
      _total_calls, "budget_exhausted", "total_calls", {"tool_rounds": 1, "tool_calls": 2},
      options={"budget": Budget(max_total_calls=2)}),
    S("strict_unknown_tool", _key("validate", "validating", "protocol_error", "strict_policy",
                                  "batch_has_unknown_tool"),
      _strict_unknown_tool, "protocol_error", "unknown_tool", {"tool_attempts": {}},
      _nothing_ran, options={"policy": "strict"}),
    S("strict_denied", _key("validate", "validating", "protocol_error", "strict_policy",
                            "batch_has_denied_call"),
      _strict_denied, "protocol_error", "permission_denied", {"tool_attempts": {}},
      _nothing_ran, options={"policy": "strict"}, allowed_tools=["lookup"]),
    S("strict_invalid", _key("validate", "validating", "protocol_error", "strict_policy",
                             "batch_has_invalid_arguments"),
      _strict_invalid, "protocol_error", "invalid_arguments", {"tool_attempts": {}},
      _nothing_ran, options={"policy": "strict"}),
    S("approval_required", _key("validate", "validating", "review_required",
                                "batch_needs_approval"),
      _approval_required, "review_required", "approval_required",
      {"write_attempts": 0, "tool_attempts": {}}, _approval_check,
      options={"approvals": [Approval("create_ticket", {"key": "R-1", "title": "other"})]}),
    S("batch_accepted", _key("validate", "validating", "executing"),
      _read_then_answer, "done", "final_answer",
      {"tool_rounds": 1, "tool_calls": 1, "tool_attempts": {"lookup": 1}}),

    S("refusal_answered", _key("dispatch", "executing", "observing", "!call_admitted"),
      _refusal, "done", "final_answer", {"tool_attempts": {}, "tool_calls": 1},
      _refusal_check),
    S("wall_clock_before_call", _key("dispatch", "executing", "budget_exhausted",
                                     "wall_clock_spent"),
      _wall_clock_dispatch, "budget_exhausted", "wall_clock", {"tool_attempts": {}},
      options={"budget": Budget(max_wall_clock_s=5.0)}),
    S("idempotency_conflict", _key("dispatch", "executing", "review_required",
                                   "idempotency_conflict"),
      _conflict, "review_required", "idempotency_conflict", {"write_attempts": 1},
      _one_ticket),
    S("idempotency_pending", _key("dispatch", "executing", "review_required",
                                  "idempotency_pending"),
      _pending, "review_required", "outcome_unknown", {"write_attempts": 0}, _pending_check),
    S("idempotent_replay", _key("dispatch", "executing", "observing", "idempotent_replay"),
      _replay, "done", "final_answer",
      {"write_attempts": 2, "replays": 1, "tool_attempts": {"create_ticket": 1}},
      _replay_check),
    S("approval_refused", _key("dispatch", "executing", "review_required", "approval_refused"),
      _approval_refused, "review_required", "approval_required",
      {"write_attempts": 1, "tool_rounds": 1, "tool_calls": 2}, _approval_refused_check,
      options={"approvals": [Approval("create_ticket", {"key": "R-1", "title": "refund"},
                                      max_uses=1)]}),
    S("call_runs", _key("dispatch", "executing", "executing"),
      _read_then_answer, "done", "final_answer", {"tool_attempts": {"lookup": 1}}),

    S("call_not_started", _key("tool_returned", "executing", "observing", "call_not_started"),
      _not_started, "done", "final_answer", {"tool_attempts": {"hang": 2}},
      _not_started_check,
      options={"tool_threads": 1, "retry": RetryPolicy(max_attempts=1)}),
    S("call_succeeded", _key("tool_returned", "executing", "observing", "call_succeeded"),
      _read_then_answer, "done", "final_answer", {"tool_attempts": {"lookup": 1}},
      _succeeded_check),
    S("call_rejected", _key("tool_returned", "executing", "observing", "call_rejected"),
      _rejected, "done", "final_answer", {"write_attempts": 1},
      lambda o: None if _answers(o)["c1"]["error"] == "rejected" else _fail("not rejected")),
    S("read_retried", _key("tool_returned", "executing", "retry_wait", "is_retryable",
                           "attempts_left", "retry_fits_deadline"),
      _retried, "done", "final_answer", {"retries": 1, "tool_attempts": {"lookup": 2}},
      _retried_check),
    S("write_outcome_unknown", _key("tool_returned", "executing", "review_required",
                                    "is_write"),
      _write_unknown, "review_required", "outcome_unknown", {"write_attempts": 1},
      _write_unknown_check),
    S("read_failed", _key("tool_returned", "executing", "observing"),
      _read_failed, "done", "final_answer", {"tool_attempts": {"lookup": 1}},
      lambda o: None if _answers(o)["c1"]["error"] == "tool_failed" else _fail("not failed"),
      options={"retry": RetryPolicy(max_attempts=1)}),

    S("review_recorded", _key("review", "review_required", "review_required", "review_fits"),
      _approve_then_resume, "review_required", "approval_required", {}, _reviewed_check,
      review=_approve_c1_later),
    S("review_refused", _key("review", "review_required", "review_required"),
      _approve_then_resume, "review_required", "approval_required", {},
      lambda o: None if not any(e["type"] == "review" for e in o.result.events) else _fail(
          "a refused review was recorded"), review=_misfit_review),
    S("resume_write_lost", _key("resume", "executing", "review_required",
                                "write_outcome_lost"),
      _died_mid_write, "review_required", "outcome_unknown", {}, _one_ticket,
      die_at="tool_returned", review=_resume),
    S("resume_result_stored", _key("resume", "executing", "observing", "write_result_stored"),
      _died_result_stored, "done", "final_answer", {}, _one_ticket,
      die_at="tool_returned", review=_resume),
    S("resume_dispatch_again", _key("resume", "executing", "executing"),
      _dedup_again, "done", "final_answer", {}, die_before_commit=True, review=_resume),
    S("resume_after_review", _key("resume", "review_required", "observing"),
      _approve_then_resume, "done", "final_answer", {}, _one_ticket, review=_approve_c1),

    S("retry", _key("retry", "retry_wait", "executing"),
      _retried, "done", "final_answer", {"retries": 1}),

    S("tool_output", _key("observe", "observing", "budget_exhausted", "output_budget_spent"),
      _oversized, "budget_exhausted", "tool_output", {"tool_attempts": {"lookup": 1}},
      options={"budget": Budget(max_output_bytes=1000)}),
    S("next_call", _key("observe", "observing", "executing", "batch_has_more_calls"),
      _two_calls, "done", "final_answer", {"tool_calls": 2, "tool_rounds": 1}),
    S("model_calls", _key("observe", "observing", "budget_exhausted", "model_calls_spent"),
      _model_calls, "budget_exhausted", "model_calls", {"model_calls": 1},
      options={"budget": Budget(max_model_calls=1)}),
    S("wall_clock_after_call", _key("observe", "observing", "budget_exhausted",
                                    "wall_clock_spent"),
      _read_timeout, "budget_exhausted", "wall_clock", {},
      options={"budget": Budget(max_wall_clock_s=5.0)}),
    S("next_round", _key("observe", "observing", "deciding"),
      _next_round, "done", "final_answer", {"tool_rounds": 2, "model_calls": 3}),

    S("cancel_write_in_flight", _key("cancel", "executing", "review_required",
                                     "write_in_flight"),
      _cancel_write, "review_required", "outcome_unknown", {"write_attempts": 1},
      _check(_interrupted, _one_ticket)),
    S("cancel_deciding", _key("cancel", "deciding", "cancelled"),
      _cancel_deciding, "cancelled", "cancelled", {}, _interrupted),
    S("cancel_validating", _key("cancel", "validating", "cancelled"),
      _cancel_validating, "cancelled", "cancelled", {"write_attempts": 0}, _interrupted),
    S("cancel_executing", _key("cancel", "executing", "cancelled"),
      _cancel_read, "cancelled", "cancelled", {}, _interrupted),
    S("cancel_retry_wait", _key("cancel", "retry_wait", "cancelled"),
      _cancel_backoff, "cancelled", "cancelled", {}, _interrupted,
      cancel_on_entering="retry_wait"),
    S("cancel_observing", _key("cancel", "observing", "cancelled"),
      _cancel_observing, "cancelled", "cancelled", {}, _interrupted,
      cancel_on_entering="observing"),
    S("first_model_call", _key("begin", "deciding", "deciding"),
      _read_then_answer, "done", "final_answer", {"model_calls": 2},
      _first_model_call_check, options={"rules": [_TEN_MODEL_CALLS]}),
)
# fmt: on

del S


def _fail(message: str) -> None:
    raise AssertionError(message)


def scenario_for(transition: Transition | int) -> Scenario | None:
    """The scenario that targets ``transition`` (an edge or its index), if any."""
    edge = TRANSITIONS[transition] if isinstance(transition, int) else transition
    return next((s for s in SUITE if s.target == edge.key), None)


def missing() -> list[Transition]:
    """Edges of the table no scenario targets."""
    targets = {s.target for s in SUITE}
    return [t for t in TRANSITIONS if t.key not in targets]
