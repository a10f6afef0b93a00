"""Every transition of the table, driven by a run that takes it.

Each case names one edge of ``TRANSITIONS`` (by trigger, source, dest and its first
guard), runs a scripted scenario, and asserts the edge was taken, where the run stopped
and why, that the history is provider-valid, and the counters. ``test_every_transition
_has_a_case`` keeps this file complete when the table grows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import (
    Approval,
    Backend,
    Budget,
    FakeClock,
    ToolRejected,
    TransientToolError,
    assert_valid_run,
    call,
    calls,
    make_runtime,
    say,
)

from fsm_agent import RunResult, Runtime, ScriptedModel, ToolRegistry
from fsm_agent.core.engine import TRANSITION_LISTENERS
from fsm_agent.core.table import TRANSITIONS, Transition

LOOKUP = call("c1", "lookup", order_id="A17")
TICKET = {"request_id": "R-1", "title": "Damaged parcel"}
WRITE = call("w1", "write", **TICKET)


def edge(trigger: str, source: str, dest: str, guard: str | None, reason: str) -> Transition:
    """The one edge with this trigger, source and dest that has ``guard`` among its guards
    (``None``: the unguarded fallback) and, if it is a stop, this reason."""
    found = [
        t
        for t in TRANSITIONS
        if (t.trigger, t.source, t.dest) == (trigger, source, dest)
        and (t.guards == () if guard is None else guard in t.guards)
        and t.reason in (None, reason)
    ]
    assert len(found) == 1, f"{trigger} {source}->{dest} [{guard}] matches {found}"
    return found[0]


@dataclass
class Case:
    edge: Transition
    build: Callable[[], tuple[Any, ...]]  # -> (runtime, backend[, check(result, backend)])
    status: str
    reason: str
    counters: dict[str, Any] = field(default_factory=dict)
    task: str = "Where is order A17?"
    interrupted: bool = False  # the run is cancelled: run() re-raises, the trace is checked


CASES: list[Case] = []


def case(
    trigger: str,
    source: str,
    dest: str,
    guard: str | None,
    status: str,
    reason: str,
    **counters: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(build: Callable[[], Any]) -> Callable[[], Any]:
        CASES.append(
            Case(
                edge(trigger, source, dest, guard, reason),
                build,
                status,
                reason,
                counters,
                interrupted=trigger == "cancel",
            )
        )
        return build

    return register


# ── deciding ──────────────────────────────────────────────────────────────────────


@case(
    "model_replied",
    "deciding",
    "budget_exhausted",
    "tokens_spent",
    "budget_exhausted",
    "tokens",
    model_calls=1,
    tokens=150,
    tool_rounds=0,
)
def _tokens() -> Any:
    b = Backend()
    reply = calls(LOOKUP, usage={"input_tokens": 100, "output_tokens": 50})

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == []  # nothing new executed after the budget tripped
        assert r.messages[-1]["role"] == "tool" and "not_executed" in r.messages[-1]["content"]

    return make_runtime([reply], b, budget=Budget(max_tokens=120)), b, check


@case(
    "model_replied",
    "deciding",
    "budget_exhausted",
    "cost_spent",
    "budget_exhausted",
    "cost",
    model_calls=1,
)
def _cost() -> Any:
    b = Backend()
    reply = say("done", usage={"input_tokens": 1, "output_tokens": 1, "cost": None})

    def check(r: RunResult, b: Backend) -> None:
        assert r.detail == "a reply could not be priced"

    return make_runtime([reply], b, budget=Budget(max_cost=1.0)), b, check


@case(
    "model_replied",
    "deciding",
    "validating",
    None,
    "done",
    "final_answer",
    model_calls=1,
    cost=0.25,
)
def _replied() -> Any:
    b = Backend()
    reply = say("All good.", usage={"prompt_tokens": 3, "completion_tokens": 4, "cost": 0.25})
    return make_runtime([reply], b, budget=Budget(max_cost=1.0)), b


@case(
    "model_failed",
    "deciding",
    "protocol_error",
    None,
    "protocol_error",
    "model_error",
    model_calls=1,
)
def _model_failed() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        assert r.detail == "ConnectionError: provider down"
        assert any(e.get("error") == r.detail for e in r.events if e["type"] == "decision")

    return make_runtime([ConnectionError("provider down")], b), b, check


# ── validating ────────────────────────────────────────────────────────────────────


@case(
    "validate",
    "validating",
    "protocol_error",
    "decision_malformed",
    "protocol_error",
    "malformed_decision",
    tool_rounds=0,
)
def _malformed() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        assert r.detail == "tool_calls[0].function is missing or not an object"
        assert [m["role"] for m in r.messages] == ["user"]  # nothing unpairable kept

    return make_runtime([calls({"id": "c1", "type": "function"})], b), b, check


@case(
    "validate",
    "validating",
    "done",
    "!has_tool_calls",
    "done",
    "final_answer",
    model_calls=1,
    tool_rounds=0,
)
def _done() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        assert r.answer == "Hello." and r.messages[-1] == {"role": "assistant", "content": "Hello."}

    return make_runtime([say("Hello.")], b), b, check


@case(
    "validate",
    "validating",
    "protocol_error",
    "!has_tool_calls",
    "protocol_error",
    "empty_answer",
    model_calls=1,
)
def _empty() -> Any:
    b = Backend()
    return make_runtime([say("   ")], b), b


@case(
    "validate",
    "validating",
    "protocol_error",
    "call_id_missing",
    "protocol_error",
    "missing_tool_call_id",
    tool_attempts={},
)
def _missing_id() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == [] and r.detail == "tool_calls[1] has no id"

    return make_runtime([calls(LOOKUP, call("", "lookup", order_id="A18"))], b), b, check


@case(
    "validate",
    "validating",
    "protocol_error",
    "call_id_duplicate",
    "protocol_error",
    "duplicate_tool_call_id",
    tool_attempts={},
)
def _dup_id() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == []  # the first call did not run before the second was seen

    return make_runtime([calls(LOOKUP, call("c1", "lookup", order_id="A18"))], b), b, check


@case(
    "validate",
    "validating",
    "budget_exhausted",
    "tool_rounds_spent",
    "budget_exhausted",
    "tool_rounds",
    tool_rounds=1,
    model_calls=2,
)
def _rounds() -> Any:
    b = Backend()
    script = [calls(LOOKUP), calls(call("c2", "lookup", order_id="A18"))]

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == ["A17"]

    return make_runtime(script, b, budget=Budget(max_tool_rounds=1)), b, check


@case(
    "validate",
    "validating",
    "budget_exhausted",
    "round_too_large",
    "budget_exhausted",
    "calls_per_round",
    tool_rounds=0,
    tool_calls=0,
)
def _per_round() -> Any:
    b = Backend()
    script = [calls(LOOKUP, call("c2", "lookup", order_id="A18"))]
    return make_runtime(script, b, budget=Budget(max_calls_per_round=1)), b


@case(
    "validate",
    "validating",
    "budget_exhausted",
    "total_calls_spent",
    "budget_exhausted",
    "total_calls",
    tool_rounds=1,
    tool_calls=2,
)
def _total() -> Any:
    b = Backend()
    script = [
        calls(LOOKUP, call("c2", "lookup", order_id="A18")),
        calls(call("c3", "lookup", order_id="A19")),
    ]
    return make_runtime(script, b, budget=Budget(max_total_calls=2)), b


@case(
    "validate",
    "validating",
    "protocol_error",
    "strict_policy",
    "protocol_error",
    "unknown_tool",
    tool_attempts={},
)
def _strict_unknown() -> Any:
    b = Backend()
    return make_runtime([calls(LOOKUP, call("c2", "rm_rf", path="/"))], b, policy="strict"), b


@case(
    "validate",
    "validating",
    "protocol_error",
    "batch_has_denied_call",
    "protocol_error",
    "permission_denied",
    tool_attempts={},
)
def _strict_denied() -> Any:
    b = Backend()
    return make_runtime([calls(call("c1", "admin"))], b, policy="strict"), b


@case(
    "validate",
    "validating",
    "protocol_error",
    "batch_has_invalid_arguments",
    "protocol_error",
    "invalid_arguments",
    tool_attempts={},
)
def _strict_invalid() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        assert "order_id" in r.detail and b.lookups == []

    return make_runtime([calls(call("c1", "lookup", order_id=17))], b, policy="strict"), b, check


@case(
    "validate",
    "validating",
    "review_required",
    "batch_needs_approval",
    "review_required",
    "approval_required",
    write_attempts=0,
    tool_attempts={},
)
def _approval() -> Any:
    b = Backend()
    other = Approval("write", {**TICKET, "title": "Something else"})
    script = [calls(LOOKUP, WRITE)]

    def check(r: RunResult, b: Backend) -> None:
        assert b.writes == [] and b.lookups == []  # the whole batch waits
        contents = [m["content"] for m in r.messages if m["role"] == "tool"]
        assert "skipped_pending_review" in contents[0] and "approval_required" in contents[1]
        assert set(r.pending) == {"c1", "w1"}

    return make_runtime(script, b, approval=True, approvals=[other]), b, check


@case(
    "validate",
    "validating",
    "executing",
    None,
    "done",
    "final_answer",
    tool_rounds=1,
    tool_calls=1,
    tool_attempts={"lookup": 1},
)
def _accepted() -> Any:
    b = Backend()
    return make_runtime([calls(LOOKUP), say("In transit.")], b), b


# ── executing: dispatch ───────────────────────────────────────────────────────────


@case(
    "dispatch",
    "executing",
    "observing",
    "!call_admitted",
    "done",
    "final_answer",
    tool_attempts={},
    tool_calls=1,
)
def _refused() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        result = r.messages[2]["content"]
        assert '"error": "invalid_arguments"' in result and "approved" in result

    script = [calls(call("c1", "lookup", order_id="A17", approved=True)), say("Sorry.")]
    return make_runtime(script, b), b, check


@case(
    "dispatch",
    "executing",
    "budget_exhausted",
    "wall_clock_spent",
    "budget_exhausted",
    "wall_clock",
    tool_attempts={"lookup": 1},
)
def _wall_clock_dispatch() -> Any:
    b = Backend()
    clock = FakeClock()
    b.read_cost_s = 10.0  # the first lookup eats the whole budget
    script = [calls(LOOKUP, call("c2", "lookup", order_id="A18"))]

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == ["A17"] and "not_executed" in r.messages[-1]["content"]

    return make_runtime(script, b, clock=clock, budget=Budget(max_wall_clock_s=5)), b, check


@case(
    "dispatch",
    "executing",
    "review_required",
    "idempotency_conflict",
    "review_required",
    "idempotency_conflict",
    write_attempts=1,
)
def _conflict() -> Any:
    b = Backend()
    script = [calls(WRITE), calls(call("w2", "write", request_id="R-1", title="Other"))]

    def check(r: RunResult, b: Backend) -> None:
        assert len(b.writes) == 1 and "idempotency_conflict" in r.messages[-1]["content"]

    return make_runtime(script, b), b, check


@case(
    "dispatch",
    "executing",
    "review_required",
    "idempotency_pending",
    "review_required",
    "outcome_unknown",
    write_attempts=0,
)
def _pending() -> Any:
    b = Backend()
    rt = make_runtime([calls(WRITE)], b)
    b.fail_writes.append((ConnectionResetError("lost"), True))
    first = rt.run("open a ticket")
    assert (first.status, first.reason) == ("review_required", "outcome_unknown")
    rt.model = __import__("fsm_agent").ScriptedModel([calls(call("w9", "write", **TICKET))])

    def check(r: RunResult, b: Backend) -> None:
        assert len(b.writes) == 1  # never a second execution under the same key
        assert "never reported" in r.detail

    return rt, b, check


@case(
    "dispatch",
    "executing",
    "observing",
    "idempotent_replay",
    "done",
    "final_answer",
    write_attempts=2,
    replays=1,
    tool_attempts={"write": 1},
)
def _replay() -> Any:
    b = Backend()
    script = [calls(WRITE, call("w2", "write", **TICKET)), say("Ticket open.")]

    def check(r: RunResult, b: Backend) -> None:
        assert len(b.writes) == 1 and '"replayed": true' in r.messages[3]["content"]

    return make_runtime(script, b), b, check


@case(
    "dispatch", "executing", "executing", None, "done", "final_answer", tool_attempts={"lookup": 1}
)
def _admitted() -> Any:
    b = Backend()
    return make_runtime([calls(LOOKUP), say("ok")], b), b


# ── executing: tool_returned ──────────────────────────────────────────────────────


@case(
    "tool_returned",
    "executing",
    "observing",
    "call_succeeded",
    "done",
    "final_answer",
    tool_attempts={"lookup": 1},
)
def _succeeded() -> Any:
    b = Backend()

    def check(r: RunResult, b: Backend) -> None:
        result = r.messages[2]
        assert result["tool_call_id"] == "c1"
        assert json.loads(result["content"]) == {
            "ok": True,
            "value": {"order_id": "A17", "status": "in_transit"},
        }
        assert r.counters["output_bytes"] == len(result["content"].encode())

    return make_runtime([calls(LOOKUP), say("ok")], b), b, check


@case(
    "tool_returned",
    "executing",
    "observing",
    "call_rejected",
    "done",
    "final_answer",
    write_attempts=1,
)
def _rejected() -> Any:
    b = Backend()
    b.fail_writes.append((ToolRejected("title not allowed"), False))

    def check(r: RunResult, b: Backend) -> None:
        assert '"error": "rejected"' in r.messages[2]["content"]
        assert rt.store.get_idempotency("write", "R-1") is None  # nothing happened

    rt = make_runtime([calls(WRITE), say("Could not open it.")], b)
    return rt, b, check


@case(
    "tool_returned",
    "executing",
    "retry_wait",
    "is_retryable",
    "done",
    "final_answer",
    tool_attempts={"lookup": 2},
    retries=1,
)
def _retry() -> Any:
    b = Backend()
    b.fail_reads.append(TransientToolError("index busy"))
    return make_runtime([calls(LOOKUP), say("ok")], b), b


@case(
    "tool_returned",
    "executing",
    "review_required",
    "is_write",
    "review_required",
    "outcome_unknown",
    write_attempts=1,
)
def _unknown() -> Any:
    b = Backend()
    b.fail_writes.append((TransientToolError("gateway timeout"), True))  # no dedup: no retry
    script = [calls(WRITE, LOOKUP)]

    def check(r: RunResult, b: Backend) -> None:
        tool_msgs = [m["content"] for m in r.messages if m["role"] == "tool"]
        assert '"error": "outcome_unknown"' in tool_msgs[0]
        assert "skipped_pending_review" in tool_msgs[1] and b.lookups == []
        assert len(b.writes) == 1 and r.pending == {"w1": 2, "c1": 3}

    return make_runtime(script, b), b, check


@case(
    "tool_returned",
    "executing",
    "observing",
    None,
    "done",
    "final_answer",
    tool_attempts={"lookup": 1},
)
def _read_failed() -> Any:
    b = Backend()
    b.fail_reads.append(KeyError("no such order"))  # not transient: never retried

    def check(r: RunResult, b: Backend) -> None:
        assert '"error": "tool_failed"' in r.messages[2]["content"]

    return make_runtime([calls(LOOKUP), say("Not found.")], b), b, check


@case(
    "retry",
    "retry_wait",
    "executing",
    None,
    "done",
    "final_answer",
    tool_attempts={"lookup": 2},
    retries=1,
)
def _retry_edge() -> Any:
    b = Backend()
    b.fail_reads.append(TimeoutError("read timed out"))
    return make_runtime([calls(LOOKUP), say("ok")], b), b


# ── observing ─────────────────────────────────────────────────────────────────────


@case(
    "observe",
    "observing",
    "budget_exhausted",
    "output_budget_spent",
    "budget_exhausted",
    "tool_output",
    tool_attempts={"lookup": 1},
)
def _output() -> Any:
    b = Backend()
    b.output = "x" * 500
    script = [calls(LOOKUP, call("c2", "lookup", order_id="A18"))]

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == ["A17"]

    return make_runtime(script, b, budget=Budget(max_output_bytes=100)), b, check


@case(
    "observe",
    "observing",
    "executing",
    "batch_has_more_calls",
    "done",
    "final_answer",
    tool_attempts={"lookup": 2},
    tool_rounds=1,
    tool_calls=2,
)
def _more() -> Any:
    b = Backend()
    script = [calls(LOOKUP, call("c2", "lookup", order_id="A18")), say("Both in transit.")]

    def check(r: RunResult, b: Backend) -> None:
        assert [m.get("tool_call_id") for m in r.messages[2:4]] == ["c1", "c2"]

    return make_runtime(script, b), b, check


@case(
    "observe",
    "observing",
    "budget_exhausted",
    "model_calls_spent",
    "budget_exhausted",
    "model_calls",
    model_calls=1,
    tool_rounds=1,
)
def _model_calls() -> Any:
    b = Backend()
    return make_runtime([calls(LOOKUP), say("never asked")], b, budget=Budget(max_model_calls=1)), b


@case(
    "observe",
    "observing",
    "budget_exhausted",
    "wall_clock_spent",
    "budget_exhausted",
    "wall_clock",
    model_calls=1,
    tool_attempts={"lookup": 1},
)
def _wall_clock_observe() -> Any:
    b = Backend()
    b.read_cost_s = 10.0
    return make_runtime(
        [calls(LOOKUP), say("never asked")], b, budget=Budget(max_wall_clock_s=5)
    ), b


@case("observe", "observing", "deciding", None, "done", "final_answer", model_calls=2)
def _next_round() -> Any:
    b = Backend()
    return make_runtime([calls(LOOKUP), say("ok")], b), b


# ── cancel: Ctrl-C or a cancelled task, wherever the run is ───────────────────────


class InterruptingClock(FakeClock):
    """Raises KeyboardInterrupt at its first reading once armed."""

    armed = False

    def __call__(self) -> float:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return self.now


def _arm_on(clock: InterruptingClock, state: str) -> Callable[[Any, Transition], None]:
    def listener(run: Any, t: Transition) -> None:
        if t.dest == state:
            clock.armed = True

    return listener


@case("cancel", "deciding", "cancelled", None, "cancelled", "cancelled", model_calls=1)
def _cancel_deciding() -> Any:
    b = Backend()
    return make_runtime([calls(LOOKUP), KeyboardInterrupt()], b), b


@case("cancel", "validating", "cancelled", None, "cancelled", "cancelled", write_attempts=0)
def _cancel_validating() -> Any:
    b = Backend()
    tools = ToolRegistry()

    def interrupted_key(arguments: dict[str, Any]) -> str:
        raise KeyboardInterrupt  # Ctrl-C while the batch is being checked

    tools.register(
        b.write,
        name="write",
        effect="write",
        idempotency_key=interrupted_key,
        schema={"type": "object"},
        allow_extra_fields=True,
    )
    return Runtime(model=ScriptedModel([calls(WRITE)]), tools=tools, allowed_tools={"write"}), b


@case(
    "cancel",
    "executing",
    "review_required",
    "write_in_flight",
    "review_required",
    "outcome_unknown",
    write_attempts=1,
)
def _cancel_write() -> Any:
    b = Backend()
    b.fail_writes.append((KeyboardInterrupt(), True))

    def check(r: RunResult, b: Backend) -> None:
        assert "cancelled while it ran" in r.detail and len(b.writes) == 1

    return make_runtime([calls(WRITE, LOOKUP)], b), b, check


@case(
    "cancel", "executing", "cancelled", None, "cancelled", "cancelled", tool_attempts={"lookup": 1}
)
def _cancel_read() -> Any:
    b = Backend()
    b.fail_reads.append(KeyboardInterrupt())
    return make_runtime([calls(LOOKUP, call("c2", "lookup", order_id="A18"))], b), b


@case("cancel", "retry_wait", "cancelled", None, "cancelled", "cancelled", retries=1)
def _cancel_retry_wait() -> Any:
    b = Backend()
    b.fail_reads.append(TransientToolError("busy"))
    rt = make_runtime([calls(LOOKUP)], b)

    def sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    rt.sleep = sleep
    return rt, b


@case(
    "cancel", "observing", "cancelled", None, "cancelled", "cancelled", tool_attempts={"lookup": 1}
)
def _cancel_observing() -> Any:
    b = Backend()
    clock = InterruptingClock()
    rt = make_runtime([calls(LOOKUP, call("c2", "lookup", order_id="A18"))], b, clock=clock)
    TRANSITION_LISTENERS.append(_arm_on(clock, "observing"))  # the harness restores them

    def check(r: RunResult, b: Backend) -> None:
        assert b.lookups == ["A17"]

    return rt, b, check


def _result_from_trace(events: list[dict[str, Any]]) -> RunResult:
    """What a caller can still see after an interrupted run: its trace."""
    messages = list(events[0]["messages"])
    for e in events:
        if e["type"] == "decision" and isinstance(e.get("message"), dict):
            if any(o["type"] == "observation" for o in events if o["seq"] > e["seq"]) or (
                not e["message"].get("tool_calls")
            ):
                messages.append(e["message"])
        elif e["type"] == "observation":
            messages.append({"role": "tool", "tool_call_id": e["call_id"], "content": "{}"})
    end = events[-1]
    return RunResult(
        run_id=events[0]["run_id"],
        status=end["status"],
        reason=end["reason"],
        answer=end["answer"],
        messages=messages,
        events=events,
        counters=end["counters"],
        detail=end["detail"],
    )


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def write(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


# ── the tests ─────────────────────────────────────────────────────────────────────


def _ids() -> Iterator[str]:
    for c in CASES:
        yield f"{c.edge.trigger}:{c.edge.source}->{c.edge.dest}:{c.reason}:" + ",".join(
            c.edge.guards
        )


@pytest.mark.parametrize("case", CASES, ids=list(_ids()))
def test_transition(case: Case) -> None:
    listeners = list(TRANSITION_LISTENERS)
    runtime, backend, *check = case.build()
    taken: list[Transition] = []
    TRANSITION_LISTENERS.append(lambda run, t: taken.append(t))
    try:
        if case.interrupted:
            sink = ListSink()
            with pytest.raises(KeyboardInterrupt):
                runtime.run(case.task, trace=sink)
            result = _result_from_trace(sink.events)
        else:
            result = runtime.run(case.task)
    finally:
        TRANSITION_LISTENERS[:] = listeners
    assert case.edge in taken, f"edge not taken; path was {result.path}"
    assert (result.status, result.reason) == (case.status, case.reason), result.detail
    assert_valid_run(result)
    for name, expected in case.counters.items():
        assert result.counters[name] == expected, (name, result.counters)
    for extra in check:
        extra(result, backend)


def test_every_transition_has_a_case() -> None:
    # ``resume`` edges need a stored run to resume; tests/test_durable_* drive those.
    covered = {id(c.edge) for c in CASES}
    missing = [
        t.label + f" ({t.source}->{t.dest})"
        for t in TRANSITIONS
        if id(t) not in covered and t.trigger != "resume"
    ]
    assert missing == []
