"""Review in the machine: a reviewer's decision is the table's ``review`` trigger, recorded
at once with who decided, when and why; driving the run on is a separate step (issue 18,
item 5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import ScriptedModel
from fsm_agent._core import loop
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.review import paused_state
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import ReviewError
from fsm_agent._trace.checker import check_events
from fsm_agent.testing._scenarios import Mortal, ProcessDied

WRITE = {"request_id": "R-1", "title": "refund"}


def paused(store: Any, backend: Backend) -> Any:
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE)), say("Filed.")], backend, store=store, approval=True
    )
    first = rt.run("file it", run_id="r1")
    assert (first.status, first.reason) == ("review_required", "approval_required")
    return rt


def test_recording_a_review_drives_nothing_and_resume_applies_it() -> None:
    backend, store = Backend(), MemoryStore()
    rt = paused(store, backend)
    model = rt.model
    assert isinstance(model, ScriptedModel)
    asked = model.calls
    recorded = rt.approve("r1", "c1", by="ana", note="checked", at="2026-01-31T12:00:00Z")
    assert (recorded.status, recorded.reason) == ("review_required", "approval_required")
    assert model.calls == asked and backend.writes == []  # returned at once: nothing ran
    assert recorded.events[-1]["type"] == "review"
    stored = store.load_run("r1")
    assert stored.events[-1] == recorded.events[-1]  # it is in the store already
    done = rt.resume("r1")
    assert (done.status, done.answer) == ("done", "Filed.") and backend.writes == [WRITE]
    assert check_events(done.events) == []


def test_a_review_records_who_when_and_why_and_refuses_a_time_not_in_utc() -> None:
    rt = paused(MemoryStore(), Backend())
    with pytest.raises(ReviewError, match="ISO-8601 in UTC"):
        rt.approve("r1", "c1", at="2026-01-31T12:00:00+02:00")
    with pytest.raises(ReviewError, match="note must be a non-empty string"):
        rt.approve("r1", "c1", note="")
    event = rt.approve("r1", "c1", by="ana", note="customer confirmed").events[-1]
    assert (event["reviewer"], event["note"]) == ("ana", "customer confirmed")
    assert event["at"].endswith("Z")  # now, in UTC, read by the durable layer
    transition = rt.store.load_run("r1").events[-2]
    assert transition["trigger"] == "review" and transition["guards"] == {"review_fits": True}
    assert "reason" not in transition  # a review keeps the run's stop reason


def test_a_misfit_review_takes_the_fallback_edge_and_records_nothing() -> None:
    store = MemoryStore()
    rt = paused(store, Backend())
    before = list(store.load_run("r1").events)
    with pytest.raises(ReviewError, match="waiting for approval_required: reconcile does not"):
        rt.reconcile("r1", "c1", {"ticket": "T-1"})
    with pytest.raises(ReviewError, match="call 'c9' is not pending"):
        rt.deny("r1", "c9", "no")
    assert store.load_run("r1").events == before
    rt.approve("r1", "c1")
    with pytest.raises(ReviewError, match="was already approved"):
        rt.deny("r1", "c1", "changed my mind")


def test_the_core_decides_a_review_by_the_table() -> None:
    store = MemoryStore()
    paused(store, Backend())
    s = paused_state(store.load_run("r1"))
    misfit = {"type": "review", "action": "reconcile", "call_id": "c1", "tool": "write"}
    assert loop.review(s, misfit) is False
    assert s.taken.key == "review/review_required->review_required"
    assert s.reviews == {} and s.state == "review_required"
    fits = {"type": "review", "action": "deny", "call_id": "c1", "tool": "write",
            "reason": "no", "reviewer": "bo", "at": "2026-01-31T12:00:00Z"}  # fmt: skip
    n = len(s.events)
    assert loop.review(s, fits) is True
    transition, review = s.events[n:]
    assert transition["guards"] == {"review_fits": True}
    assert review == {**fits, "seq": transition["seq"] + 1}
    assert s.reviews["c1"]["action"] == "deny" and s.reviews["c1"]["reviewer"] == "bo"


def test_the_checker_refuses_a_review_without_its_transition() -> None:
    rt = paused(MemoryStore(), Backend())
    events = rt.approve("r1", "c1", by="ana").events
    assert check_events(events) == []
    transition = events[-2]
    assert transition["trigger"] == "review"
    forged = [*events[:-2], {**events[-1], "seq": transition["seq"]}]
    assert any("no review transition wrote" in p for p in map(str, check_events(forged)))


def test_an_async_application_records_then_aresumes() -> None:
    backend, store = Backend(), MemoryStore()
    rt = paused(store, backend)

    async def main() -> Any:
        rt.approve("r1", "c1", by="ana")  # store I/O only
        return await rt.aresume("r1")

    done = asyncio.run(main())
    assert done.status == "done" and backend.writes == [WRITE]


class DyingBackend(Backend):
    """Its next lookup kills the process (``die``), once."""

    def __init__(self) -> None:
        super().__init__()
        self.die: Any = None

    def lookup(self, order_id: str) -> dict[str, Any]:
        if self.die is not None:
            die, self.die = self.die, None
            die()
        return super().lookup(order_id)


def test_a_reviewers_approval_outlives_a_driver_that_died_after_applying_it(
    tmp_path: Any,
) -> None:
    """The reviews go once applied; the approval stays with the run, so the next driver
    still runs the approved write (and names its approval) instead of pausing again."""
    store = SqliteStore(tmp_path / "runs.db")
    mortal = Mortal(store)
    backend = DyingBackend()
    script = [calls(call("c1", "lookup", order_id="A1"), call("c2", "write", **WRITE)),
              say("Filed.")]  # fmt: skip
    rt = make_runtime(script, backend, store=store, approval=True)
    assert rt.run("file it", run_id="r1").reason == "approval_required"
    rt.approve("r1", "c2", by="ana")

    def die() -> None:
        mortal.kill()
        raise ProcessDied("killed during the lookup")

    backend.die = die
    with pytest.raises(ProcessDied):
        rt.resume("r1")  # applies the review (saved), then dies in c1
    mortal.restart()
    done = rt.resume("r1")
    assert (done.status, done.reason) == ("done", "final_answer") and backend.writes == [WRITE]
    assert check_events(done.events) == []
    (started,) = [e for e in done.events if e.get("tool") == "write" and "approval" in e]
    assert started["approval"] == "review:c2"
    store.close()
