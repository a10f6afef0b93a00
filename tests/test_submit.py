"""``Runtime.submit``: a run recorded now and driven later by another runtime (a worker,
or any ``resume``) — on every store that keeps runs (issue 23).

The run's trace starts with its first driver, so its ``run_start`` header records what
governed it: that runtime's approvals, tools and trace key. Every stored line is then
chained under that key, and ``fsm-agent check`` (``audit_run``) accepts the run."""

from __future__ import annotations

import asyncio
from typing import Any

import fleet_app
import pytest

from fsm_agent import Approval, Runtime
from fsm_agent._durable.audit import audit_run
from fsm_agent._durable.memory import MemoryStore


def _driver(store: Any, approvals: list[Approval], key: str | None) -> Runtime:
    app = fleet_app.make_runtime(store)
    return Runtime(
        model=app.model, tools=app.tools, allowed_tools=app.allowed_tools, store=store,
        budget=app.budget, retry=app.retry, approvals=approvals, trace_key=key,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")


def test_a_submitted_run_is_governed_and_signed_by_its_driver(store: Any) -> None:
    refund = Approval("refund", {"request_id": "r1", "cents": 500})
    fleet_app.make_runtime(store).submit(fleet_app.plan("r1", "approval"), run_id="r1")
    assert store.load_run("r1").events == []  # no trace before its first driver
    result = asyncio.run(_driver(store, [refund], "k-1").aresume("r1"))
    assert (result.status, result.reason) == ("done", "final_answer")
    stored = store.load_run("r1")
    assert stored.header["approvals"] == [
        {"tool": "refund", "digest": refund.digest, "max_uses": None}
    ]
    assert stored.events[0]["type"] == "run_start"
    assert stored.events[0]["approvals"] == stored.header["approvals"]
    assert stored.events[0]["integrity"] == "hmac-sha256"
    if isinstance(store, MemoryStore):
        return  # keeps dicts: chained only when written out
    report = audit_run(store, "r1", key=b"k-1")
    assert report.violations == [], [v.format("r1") for v in report.violations]
    assert all(e["run"] == "r1" and len(e["chain"]) == 32 for e in stored.events)
    assert audit_run(store, "r1", key=b"another key").violations


def test_a_submitted_run_resumed_as_is_keeps_the_submitters_settings(store: Any) -> None:
    """Nothing differs between submitter and driver: the header is the submitter's, and
    a later driver (the run has a trace now) changes nothing in it."""
    submitter = fleet_app.make_runtime(store)
    submitter.submit(fleet_app.plan("r1", "read"), run_id="r1")
    header = store.load_run("r1").header
    assert asyncio.run(fleet_app.make_runtime(store).aresume("r1")).status == "done"
    assert store.load_run("r1").header == header
    if not isinstance(store, MemoryStore):
        assert audit_run(store, "r1").violations == []


def test_a_queued_run_passes_the_audit_with_a_note_unless_a_write_claims_it(
    store: Any,
) -> None:
    """Not driven yet: no trace to check (``check --db`` says so, and passes) — but a
    committed record of a write by that run is a violation: nothing of it has run."""
    from fsm_agent import IdempotencyRecord

    fleet_app.make_runtime(store).submit(fleet_app.plan("r1", "keyed"), run_id="r1")
    report = audit_run(store, "r1")
    assert report.violations == [] and "not driven yet" in " ".join(report.notes)
    if isinstance(store, MemoryStore):
        return  # lists no records: not cross-checked
    record = IdempotencyRecord("create_ticket", "k", "d" * 64, "pending", "r1", "c2")
    assert store.begin_intent(record).owned
    store.commit_intent("create_ticket", "k", ("r1", "c2"), {"ticket": "T-k"})
    report = audit_run(store, "r1")
    assert any("does not show that write" in v.message for v in report.violations)
