"""Resume and review, in one process: every ``resume`` edge of the table is driven by a
run here, with its state, reason, history, trace and counters checked, against both the
in-memory store and SQLite. (A process dying is simulated by an exception that no part
of the engine catches; ``test_durable_crash.py`` kills real processes.)"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import Backend, assert_valid_run, call, calls, edges, make_runtime, say

from fsm_agent import RunResult
from fsm_agent._core.canonical import digest
from fsm_agent._core.events import Event, Transitioned
from fsm_agent._runtime.interceptors import Interceptor, observing
from fsm_agent._trace.checker import check_events
from fsm_agent.testing._scenarios import Mortal, ProcessDied

WRITE = {"request_id": "R-1", "title": "A17 is late"}


class Died(BaseException):
    """The process dying, as far as the engine can tell: nothing catches it (unlike
    ``KeyboardInterrupt``, which cancels the run cleanly)."""


class OnEvent(Interceptor):
    def __init__(self, act: Callable[[Event], None]) -> None:
        self.act = act

    def on_event(self, event: Event) -> None:
        self.act(event)


@contextmanager
def dies_at(store: Any, trigger: str) -> Iterator[None]:
    """The process dies at the first ``trigger`` transition, before it is saved (and
    writes nothing after); the store works again for the next process."""
    mortal = Mortal(store)

    def die(event: Event) -> None:
        if isinstance(event, Transitioned) and event.trigger == trigger and not mortal.dead:
            mortal.kill()
            raise ProcessDied

    try:
        with observing(OnEvent(die)):
            yield
    except ProcessDied:
        raise Died from None
    finally:
        mortal.restart()


@contextmanager
def dies_before_result_is_stored(store: Any) -> Iterator[None]:
    """The process dies after a keyed write ran, before its result is recorded (and
    writes nothing after that); the store works again for the next process."""
    mortal = Mortal(store, before_commit=True)
    try:
        yield
    except ProcessDied:
        raise Died from None
    finally:
        mortal.restart()


def content(result: RunResult, call_id: str) -> dict[str, Any]:
    (message,) = [m for m in result.messages if m.get("tool_call_id") == call_id]
    parsed: dict[str, Any] = json.loads(message["content"])
    return parsed


def check(result: RunResult) -> None:
    assert_valid_run(result)
    assert check_events(result.events) == []  # what `fsm-agent check` verifies


# ── resume executing -> review_required [write_outcome_lost] ──────────────────────────


@pytest.mark.parametrize("keyed", [True, False])
def test_a_write_that_was_running_when_the_process_died_stops_for_review(
    store: Any, backend: Backend, keyed: bool
) -> None:
    script = [
        calls(call("c1", "write", **WRITE), call("c2", "lookup", order_id="A17")),
        say("Filed."),
    ]
    rt = make_runtime(script, backend, store=store, keyed=keyed)
    with (
        pytest.raises(Died),
        dies_before_result_is_stored(store) if keyed else dies_at(store, "tool_returned"),
    ):
        rt.run("file it", run_id="r1")
    assert len(backend.writes) == 1

    paused = rt.resume("r1")
    assert (paused.status, paused.reason) == ("review_required", "outcome_unknown")
    assert edges(paused)[-1] == ("resume", "executing", "review_required")
    assert "the process stopped while it was running" in paused.detail
    assert len(backend.writes) == 1 and backend.lookups == []  # never run a second time
    assert paused.counters["write_attempts"] == 1
    assert content(paused, "c1")["error"] == "outcome_unknown"
    assert content(paused, "c2")["error"] == "skipped_pending_review"
    assert set(paused.pending) == {"c1", "c2"}
    check(paused)
    assert rt.resume("r1").events == paused.events  # nothing to do until a reviewer acts

    done = rt.reconcile("r1", "c1", {"ticket": "T-1"}, resume=True)
    assert (done.status, done.reason, done.answer) == ("done", "final_answer", "Filed.")
    assert ("resume", "review_required", "observing") in edges(done)
    assert len(backend.writes) == 1 and backend.lookups == ["A17"]  # skipped call ran afresh
    assert content(done, "c1") == {"ok": True, "value": {"ticket": "T-1"}, "reconciled": True}
    assert content(done, "c2")["ok"] is True
    assert done.pending == {}
    assert done.counters["tool_rounds"] == 1 and done.counters["write_attempts"] == 1
    check(done)


def test_the_checker_counts_a_keyed_attempt_only_a_resume_can_see(
    store: Any, backend: Backend
) -> None:
    """A keyed write's ``dispatch`` transition is not checkpointed (its intent, begun
    with the checkpoint before dispatch, stands for it), so the stored history goes from
    ``validate`` straight to ``resume``, which counts that attempt. The checker accepts
    exactly that: for a keyed call, with the attempt counted once."""
    script = [calls(call("c1", "write", **WRITE)), say("Filed.")]
    rt = make_runtime(script, backend, store=store, keyed=True)
    with pytest.raises(Died), dies_before_result_is_stored(store):
        rt.run("file it", run_id="r1")
    events = rt.resume("r1").events
    triggers = [e.get("trigger") for e in events if e["type"] == "transition"]
    assert triggers == ["model_replied", "validate", "resume"]
    assert check_events(events) == []

    def changed(edit: Any) -> str:
        copy = json.loads(json.dumps(events))
        edit(copy)
        return "; ".join(v.message for v in check_events(copy))

    def unkeyed(copy: list[dict[str, Any]]) -> None:
        copy[0]["tools"]["write"]["idempotent"] = False

    def attempt_zero(copy: list[dict[str, Any]]) -> None:
        next(e for e in copy if e.get("trigger") == "resume")["attempt"] = 0

    # Unkeyed, the engine derives no key and, resumed, takes no resume edge.
    assert 'the trace records inputs [{"idempotency_key": "R-1"}], which the engine does not' in (
        changed(unkeyed)
    )
    assert "seq 4: attempt: the engine writes 1; the trace records 0" in changed(attempt_zero)


# ── resume executing -> observing [write_result_stored] ─────────────────────────────


def test_a_write_whose_result_was_stored_before_the_crash_is_answered_with_it(
    store: Any, backend: Backend
) -> None:
    rt = make_runtime([calls(call("c1", "write", **WRITE)), say("Filed.")], backend, store=store)
    with pytest.raises(Died), dies_at(store, "tool_returned"):  # the result is in the record only
        rt.run("file it", run_id="r1")

    done = rt.resume("r1")
    if hasattr(store, "commit_intent_behind"):
        # PostgresStore sends the result with the run's next statement, so it died with
        # the process: the write may have happened, a reviewer must say (never twice).
        assert (done.status, done.reason) == ("review_required", "outcome_unknown")
        assert len(backend.writes) == 1
        check(done)
        return
    assert (done.status, done.reason) == ("done", "final_answer")
    assert ("resume", "executing", "observing") in edges(done)
    assert len(backend.writes) == 1
    assert content(done, "c1") == {"ok": True, "value": {"ticket": "T-1"}}
    assert done.counters["replays"] == 0 and done.counters["write_attempts"] == 1
    check(done)


# ── resume executing -> executing (fallback) ──────────────────────────────────────


def test_a_deduplicated_write_is_dispatched_again(store: Any, backend: Backend) -> None:
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE)), say("Filed.")], backend, store=store, dedup=True
    )
    with pytest.raises(Died), dies_before_result_is_stored(store):
        rt.run("file it", run_id="r1")
    done = rt.resume("r1")
    assert (done.status, done.reason) == ("done", "final_answer")
    assert ("resume", "executing", "executing") in edges(done)
    # Sent twice under one key: the registrar declared that the downstream dedupes it.
    assert [w["request_id"] for w in backend.writes] == ["R-1", "R-1"]
    assert done.counters["tool_attempts"] == {"write": 2}
    check(done)


def test_a_read_that_died_is_simply_run_again(store: Any, backend: Backend) -> None:
    def model(messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> Any:
        asked = sum(m["role"] == "assistant" for m in messages)
        return calls(call("c1", "lookup", order_id="A17")) if asked == 0 else say("In transit.")

    rt = make_runtime([], backend, store=store)
    with pytest.raises(Died), dies_at(store, "tool_returned"):
        rt.run("where?", run_id="r1", model=model)
    done = rt.resume("r1", model=model)
    assert (done.status, done.answer) == ("done", "In transit.")
    assert backend.lookups == ["A17", "A17"]
    # Reads are not checkpointed: the run goes on from the model's reply (SQLite) or
    # asks the model again (memory), so no resume edge is needed.
    assert not any(t == "resume" for t, _, _ in edges(done))
    assert done.counters["model_calls"] == 2
    check(done)


# ── resume review_required -> observing (apply_review) ─────────────────────────────


def test_approve_binds_the_exact_arguments_and_runs_the_paused_batch(
    store: Any, backend: Backend
) -> None:
    script = [
        calls(
            call("c1", "lookup", order_id="A17"),
            call("c2", "write", **WRITE),
            call("c3", "lookup", order_id="B2"),
        ),
        say("Filed."),
    ]
    rt = make_runtime(script, backend, store=store, approval=True)
    paused = rt.run("file it", run_id="r1")
    assert (paused.status, paused.reason) == ("review_required", "approval_required")
    assert paused.counters["tool_rounds"] == 0 and backend.lookups == []

    recorded = rt.approve("r1", "c2", by="ana", at="2026-01-31T12:00:00Z")
    assert (recorded.status, recorded.reason) == ("review_required", "approval_required")
    assert backend.lookups == [] and not backend.writes  # recorded only: nothing ran
    done = rt.resume("r1")
    assert (done.status, done.reason) == ("done", "final_answer")
    assert backend.lookups == ["A17", "B2"] and len(backend.writes) == 1
    assert done.counters["tool_rounds"] == 1 and done.counters["tool_calls"] == 3
    review = [e for e in done.events if e["type"] == "review"]
    assert review == [
        {
            "type": "review",
            "action": "approve",
            "call_id": "c2",
            "tool": "write",
            "digest": digest("write", WRITE),
            "reviewer": "ana",
            "at": "2026-01-31T12:00:00Z",
            "seq": review[0]["seq"],
        }
    ]
    before = done.events[review[0]["seq"] - 1]
    assert (before["trigger"], before["dest"]) == ("review", "review_required")
    (attempt,) = [
        e
        for e in done.events
        if e.get("call_id") == "c2"
        and e.get("dest") == "executing"
        and e.get("trigger") == "dispatch"
    ]
    assert attempt["approval"] == "review:c2"  # the trace names the approval it consumed
    assert all(content(done, c)["ok"] for c in ("c1", "c2", "c3"))
    check(done)


def test_a_run_waits_until_every_call_needing_approval_is_settled(
    store: Any, backend: Backend
) -> None:
    other = {"request_id": "R-2", "title": "B2 is late"}
    script = [calls(call("c1", "write", **WRITE), call("c2", "write", **other)), say("Done.")]
    rt = make_runtime(script, backend, store=store, approval=True)
    rt.run("file both", run_id="r1")
    half = rt.approve("r1", "c1", resume=True)
    assert (half.status, half.reason) == ("review_required", "approval_required")
    assert not any(t == "resume" for t, _, _ in edges(half)) and backend.writes == []
    done = rt.deny("r1", "c2", "R-2 is a duplicate", resume=True)
    assert done.status == "done"
    assert backend.writes == [WRITE]
    assert content(done, "c2") == {"ok": False, "error": "denied", "detail": "R-2 is a duplicate"}
    check(done)


def test_deny_settles_an_idempotency_conflict(store: Any, backend: Backend) -> None:
    rt = make_runtime([calls(call("c1", "write", **WRITE)), say("Filed.")], backend, store=store)
    assert rt.run("file it").status == "done"
    changed = {**WRITE, "title": "something else"}
    rt2 = make_runtime(
        [calls(call("c1", "write", **changed)), say("Not filed.")], backend, store=store
    )
    paused = rt2.run("file it again", run_id="r2")
    assert (paused.status, paused.reason) == ("review_required", "idempotency_conflict")
    done = rt2.deny("r2", "c1", "R-1 was filed with another title", resume=True)
    assert (done.status, done.answer) == ("done", "Not filed.")
    assert len(backend.writes) == 1
    check(done)


def test_a_reconciled_result_is_replayed_by_later_runs(store: Any, backend: Backend) -> None:
    backend.fail_writes.append((RuntimeError("connection reset"), True))
    rt = make_runtime([calls(call("c1", "write", **WRITE)), say("Filed.")], backend, store=store)
    paused = rt.run("file it", run_id="r1")
    assert (paused.status, paused.reason) == ("review_required", "outcome_unknown")
    done = rt.reconcile("r1", "c1", {"ticket": "T-9"}, resume=True)
    assert done.status == "done" and len(backend.writes) == 1
    check(done)
    later = make_runtime(
        [calls(call("c1", "write", **WRITE)), say("Already filed.")], backend, store=store
    ).run("file it")
    assert content(later, "c1") == {"ok": True, "value": {"ticket": "T-9"}, "replayed": True}
    assert len(backend.writes) == 1


def test_resuming_a_finished_run_returns_it_unchanged(store: Any, backend: Backend) -> None:
    rt = make_runtime(
        [calls(call("c1", "lookup", order_id="A17")), say("In transit.")], backend, store=store
    )
    first = rt.run("where?", run_id="r1")
    again = rt.resume("r1")
    assert (again.status, again.answer, again.events) == ("done", "In transit.", first.events)
    assert again.messages == first.messages and backend.lookups == ["A17"]


def test_aresume_drives_async_models_after_a_recorded_review(store: Any, backend: Backend) -> None:
    import asyncio

    from fsm_agent._durable.review import record_review

    async def model(messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> Any:
        asked = sum(m["role"] == "assistant" for m in messages)
        return calls(call("c1", "write", **WRITE)) if asked == 0 else say("Filed.")

    rt = make_runtime([], backend, store=store, approval=True)
    paused = asyncio.run(rt.arun("file it", run_id="r1", model=model))
    assert paused.reason == "approval_required"
    with pytest.raises(ValueError, match=r"use 'await runtime\.aresume"):
        rt.resume("r1", model=model)
    record_review(store, "r1", "c1", "approve")  # what the CLI does
    done = asyncio.run(rt.aresume("r1", model=model))
    assert (done.status, done.answer) == ("done", "Filed.") and backend.writes == [WRITE]
    check(done)


def test_a_write_left_pending_by_a_dead_run_is_settled_once_for_both_runs(
    store: Any, backend: Backend
) -> None:
    first = make_runtime([calls(call("c1", "write", **WRITE)), say("Filed.")], backend, store=store)
    with pytest.raises(Died), dies_before_result_is_stored(store):
        first.run("file it", run_id="r1")  # R-1 is left pending: did it happen?
    second = make_runtime(
        [calls(call("k1", "write", **WRITE)), say("Filed too.")], backend, store=store
    )
    paused = second.run("file it", run_id="r2")
    assert (paused.status, paused.reason) == ("review_required", "outcome_unknown")
    assert "never reported" in paused.detail and len(backend.writes) == 1

    done = second.reconcile(
        "r2", "k1", {"ticket": "T-1"}, resume=True
    )  # a reviewer found the ticket
    assert done.status == "done" and len(backend.writes) == 1
    resumed = first.resume("r1")  # the dead run's own call is answered with that fact
    assert (resumed.status, resumed.answer) == ("done", "Filed.")
    assert ("resume", "executing", "observing") in edges(resumed)
    assert content(resumed, "c1") == {"ok": True, "value": {"ticket": "T-1"}}
    assert len(backend.writes) == 1
    check(resumed)
