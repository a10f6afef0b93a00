"""RunState declares its persisted fields: one serialiser over ``fields()``, every
persisted field round-trips, and a field that declares nothing fails at once
(issue 18, item 7). Snapshot layout 3; a stored layout 2 checkpoint still restores."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import pytest
from snapshot_v2 import load_v2

from fsm_agent._core.approvals import ApprovalBook
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.decision import parse_decision
from fsm_agent._core.requests import ToolOutcome
from fsm_agent._core.state import (
    SNAPSHOT_VERSION,
    Counters,
    RunConfig,
    RunState,
    declarations,
    snapshot_machine,
)
from fsm_agent._core.table import MACHINE_HASH, TRANSITIONS
from fsm_agent._errors import CorruptRecord

# Read at import: the determinism trap forbids files while a core test runs.
V2 = load_v2()

CONFIG = RunConfig(
    budget=Budget(),
    retry=RetryPolicy(),
    policy="default",
    allowed=frozenset({"lookup", "write"}),
    tools=lambda name: None,
    tool_specs=[],
    approvals=ApprovalBook(),
)
REPLY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        for i in (1, 2)
    ],
}


def _counters() -> Counters:
    counters = Counters()
    counters.model_calls, counters.cost, counters.tool_attempts = 3, 0.25, {"lookup": 2}
    return counters


def _call(s: RunState) -> None:
    s.decision = parse_decision(REPLY)
    call = s.decision.calls[1]
    call.effect, call.dedup, call.idempotency_key = "write", True, "K-1"
    call.args_digest, call.claimed = "sha256:abc", True
    s.call = call


def _clock(s: RunState) -> None:
    s.started, s.now = 2.0, 7.5


def _view_call(s: RunState) -> Any:
    c = s.call
    return (c.index, c.id, c.effect, c.dedup, c.idempotency_key, c.args_digest, c.claimed)


def _set(name: str, value: Callable[[], Any]) -> Callable[[RunState], None]:
    return lambda s: setattr(s, name, value())


def _get(name: str) -> Callable[[RunState], Any]:
    return lambda s: getattr(s, name)


#: field -> (give it a value that is not its default, read it back comparably). A new
#: persisted field fails test_every_persisted_field_has_a_sample until it is added here.
SAMPLES: dict[str, tuple[Callable[[RunState], None], Callable[[RunState], Any]]] = {
    "state": (_set("state", lambda: "executing"), _get("state")),
    "seq": (_set("seq", lambda: 7), _get("seq")),
    "counters": (_set("counters", _counters), lambda s: s.counters.as_dict()),
    "started": (_clock, lambda s: s.now - s.started),  # persisted as the elapsed time
    "decision": (_call, lambda s: s.decision.message),
    "batch_appended": (_set("batch_appended", lambda: True), _get("batch_appended")),
    "index": (_set("index", lambda: 1), _get("index")),
    "call": (_call, _view_call),
    "attempt": (_set("attempt", lambda: 2), _get("attempt")),
    "outcome": (
        _set("outcome", lambda: ToolOutcome("transient", error="503")),
        lambda s: (s.outcome.kind, s.outcome.error),
    ),
    "tokens_unknown": (_set("tokens_unknown", lambda: True), _get("tokens_unknown")),
    "cost_unknown": (_set("cost_unknown", lambda: True), _get("cost_unknown")),
    "answered": (_set("answered", lambda: {"c1", "c0"}), _get("answered")),
    "placeholders": (
        _set("placeholders", lambda: {"c1": (3, "approval_required")}),
        _get("placeholders"),
    ),
    "reviews": (_set("reviews", lambda: {"c1": {"action": "approve"}}), _get("reviews")),
    "approvals": (_set("approvals", lambda: {"c2": "ok-2"}), _get("approvals")),
    "context": (_set("context", lambda: {"tier": "gold"}), _get("context")),
    "executed": (
        _set("executed", lambda: [{"tool": "t", "args": {}, "ok": True, "result": 1}]),
        _get("executed"),
    ),
    "status": (_set("status", lambda: "review_required"), _get("status")),
    "reason": (_set("reason", lambda: "approval_required"), _get("reason")),
    "detail": (_set("detail", lambda: "why"), _get("detail")),
    "answer": (_set("answer", lambda: "an answer"), _get("answer")),
    "model_error": (_set("model_error", lambda: "boom"), _get("model_error")),
    "taken": (_set("taken", lambda: TRANSITIONS[7]), lambda s: s.taken.key),
}


def fresh() -> RunState:
    return RunState(run_id="r1", config=CONFIG, messages=[{"role": "user", "content": "hi"}])


def restored(snapshot: dict[str, Any], s: RunState | None = None) -> RunState:
    return RunState.restore(
        json.loads(json.dumps(snapshot)),  # what a store gives back
        run_id="r1",
        config=CONFIG,
        messages=list(s.messages) if s else [],
        events=list(s.events) if s else [],
    )


def persisted_names() -> set[str]:
    return {f.name for f in fields(RunState) if f.metadata["persist"]}


def test_every_field_declares_whether_it_is_persisted() -> None:
    undeclared = [f.name for f in fields(RunState) if "persist" not in f.metadata]
    assert undeclared == []
    apart = {f.name: f.metadata["why"] for f in fields(RunState) if not f.metadata["persist"]}
    # The loop's cursors and one transition's scratch are kept apart, and say so.
    for name in ("emitted", "saved_events", "saved_messages", "rewritten"):
        assert apart[name] == "cursor"
    for name in ("guard_log", "in_flight", "attempt_resumed", "now"):
        assert apart[name].startswith("scratch")


def test_every_persisted_field_has_a_sample() -> None:
    assert set(SAMPLES) == persisted_names()


def test_every_persisted_field_round_trips() -> None:
    s = fresh()
    for give, _ in SAMPLES.values():
        give(s)
    snapshot = s.snapshot()
    assert snapshot["version"] == SNAPSHOT_VERSION == 3
    assert snapshot["machine_hash"] == MACHINE_HASH == snapshot_machine(snapshot)
    back = restored(snapshot, s)
    default = fresh()
    for name, (_, view) in SAMPLES.items():
        assert view(s) != view(default), f"{name}: the sample is the default (proves nothing)"
        assert view(back) == view(s), f"{name} did not survive a checkpoint"


def test_fields_kept_apart_stay_out_of_the_checkpoint() -> None:
    s = fresh()
    s.guard_log, s.in_flight, s.attempt_resumed = {"has_answer": True}, True, True
    s.events = [{"type": "run_start", "seq": 0}, {"type": "decision", "seq": 1}]
    s.emitted, s.saved_events, s.saved_messages, s.rewritten = 1, 1, 0, [0]
    snapshot = s.snapshot()
    apart = {f.name for f in fields(RunState) if not f.metadata["persist"]}
    assert not apart & set(snapshot["body"])
    back = restored(snapshot, s)
    assert (back.guard_log, back.in_flight, back.attempt_resumed) == ({}, False, False)
    # The cursors start at what the store holds.
    assert (back.emitted, back.saved_events, back.saved_messages, back.rewritten) == (2, 2, 1, [])


def test_a_field_that_declares_nothing_is_refused() -> None:
    @dataclass(eq=False)
    class Careless(RunState):
        forgotten: int = 0

    with pytest.raises(TypeError, match=r"Careless fields \['forgotten'\] declare neither"):
        declarations(Careless)


def test_a_layout_2_checkpoint_still_restores() -> None:
    snapshot = V2["snapshot"]
    assert snapshot["version"] == 2 and "machine_hash" in snapshot["body"]
    assert snapshot_machine(snapshot) == MACHINE_HASH
    s = RunState.restore(
        snapshot, run_id="r1", config=CONFIG, messages=V2["messages"], events=V2["events"]
    )
    body = snapshot["body"]
    assert (s.state, s.reason, s.seq) == ("review_required", "approval_required", body["seq"])
    assert s.placeholders == {k: tuple(v) for k, v in body["placeholders"].items()}
    assert [c.id for c in s.decision.calls] == ["c1", "c2"] and s.taken.key == body["taken"]
    again = s.snapshot()  # written back at layout 3: the same fields, the hash moved out
    assert again["version"] == 3 and again["machine_hash"] == body["machine_hash"]
    assert again["body"] == {k: v for k, v in body.items() if k != "machine_hash"}


def test_a_layout_2_checkpoint_is_still_checksummed() -> None:
    damaged = json.loads(json.dumps(V2["snapshot"]))
    damaged["body"]["seq"] += 1
    with pytest.raises(CorruptRecord, match="fails its checksum"):
        RunState.restore(damaged, run_id="r1", config=CONFIG, messages=[], events=[])
    with pytest.raises(CorruptRecord, match="checkpoint layout 1 is not 3 or 2"):
        RunState.restore({**damaged, "version": 1}, run_id="r1", config=CONFIG, messages=[],
                         events=[])  # fmt: skip


@pytest.mark.parametrize("context", [{}, {"traceparent": "00-abc-def-01"}])
def test_a_snapshot_carries_its_own_json_text(context: dict[str, str]) -> None:
    # A store that keeps text writes these bytes instead of encoding the checkpoint
    # again: they must be the checkpoint's JSON, whatever it holds.
    s = fresh()
    for give, _ in SAMPLES.values():
        give(s)
    s.trace_context = context
    snapshot = s.snapshot()
    text = getattr(snapshot, "text")  # noqa: B009  (not part of the dict's type)
    assert text == json.dumps(snapshot, separators=(",", ":"), ensure_ascii=False)
    assert json.loads(text) == snapshot
    assert ("trace_context" in snapshot) == bool(context)
