"""``fsm-agent check`` on traces of reviewed runs: a review event is legal only while the
run waits for review and only for a paused call; a reconciled result needs no attempt."""

from __future__ import annotations

from typing import Any

from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import MemoryStore
from fsm_agent._trace.checker import check_events

WRITE = {"request_id": "R-1", "title": "A17 is late"}


def reviewed(backend: Backend) -> list[dict[str, Any]]:
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE), call("c2", "lookup", order_id="A")), say("Filed.")],
        backend,
        store=MemoryStore(),
        approval=True,
    )
    rt.run("file it", run_id="r1")
    return rt.approve("r1", "c1", resume=True).events


def renumber(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "seq": i} for i, e in enumerate(events)]


def test_a_reviewed_run_passes(backend: Backend) -> None:
    assert check_events(reviewed(backend)) == []


def test_a_review_outside_a_pause_is_a_violation(backend: Backend) -> None:
    events = reviewed(backend)
    at = next(i for i, e in enumerate(events) if e["type"] == "review")
    review = events.pop(at)
    moved = renumber([*events[:3], review, *events[3:]])  # before the run paused
    assert any(
        "review_required (approval_required) here; the trace records a review event" in v.message
        for v in check_events(moved)
    )
    wrong = renumber([*events[:at], {**review, "call_id": "c9"}, *events[at:]])
    assert any(
        "guard review_fits: the engine gives false; the trace records true" in v.message
        for v in check_events(wrong)
    )


def test_a_reconciled_result_needs_no_attempt(backend: Backend) -> None:
    store = MemoryStore()
    backend.fail_writes.append((RuntimeError("connection reset"), True))
    first = make_runtime(
        [calls(call("c1", "write", **WRITE)), say("Unknown.")], backend, store=store
    )
    assert first.run("file it").reason == "outcome_unknown"  # R-1 is left pending
    rt = make_runtime([calls(call("k1", "write", **WRITE)), say("Filed.")], backend, store=store)
    assert rt.run("file it", run_id="r2").reason == "outcome_unknown"  # never attempted
    done = rt.reconcile("r2", "k1", {"ticket": "T-1"}, resume=True)
    assert done.status == "done" and check_events(done.events) == []
