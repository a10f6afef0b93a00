"""The fleet on a real PostgreSQL server: the run queue, workers, fencing, draining, and
the chaos run (real worker processes, SIGKILL, SIGSTOP past the lease, a server restart).

Skipped, with the reason, only where no PostgreSQL server can be had (see
``fsm_agent/testing/pgserver.py``); CI installs one (``.ci/run``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fleet_app
import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import IdempotencyRecord
from fsm_agent.durable import owners
from fsm_agent.durable.postgres import PostgresStore
from fsm_agent.durable.review import record_review
from fsm_agent.durable.store import Checkpoint
from fsm_agent.errors import RunBusy
from fsm_agent.runtime.worker import Worker
from fsm_agent.testing import pgserver

HERE = Path(__file__).resolve().parent


def _store(server: Any, schema: str, **options: Any) -> PostgresStore:
    return PostgresStore(server.dsn, schema=schema, **options)


# ── fencing: a worker that lost its lease commits nothing ─────────────────────────


def test_a_stale_owner_commits_nothing_after_a_takeover(pg_server: Any, pg_schema: str) -> None:
    with _store(pg_server, pg_schema, lease_s=0.3) as store:
        rt = fleet_app.make_runtime(store)
        rt.submit(fleet_app.plan("r1", "keyed"), run_id="r1")
        stale = owners.new_owner()
        owners.hold(stale)
        first = store.claim_next(stale)
        assert first is not None and (first.run_id, first.why) == ("r1", "new")
        time.sleep(0.5)  # stalled past the lease (a GC pause, SIGSTOP, a network cut)
        fresh = owners.new_owner()
        owners.hold(fresh)
        second = store.claim_next(fresh)
        assert second is not None and second.why == "orphaned"
        assert second.epoch == first.epoch + 1
        before = store.load_run("r1")
        record = IdempotencyRecord("create_ticket", "r1", "d", "pending", "r1", "c2")
        stale_ops: list[Callable[[], Any]] = [
            lambda: store.save(
                "r1", stale, [{"type": "x", "seq": 99}], Checkpoint(before.snapshot)
            ),
            lambda: store.begin_intent(record, fence=("r1", stale)),
            lambda: store.renew("r1", stale),
        ]
        for op in stale_ops:
            with pytest.raises(RunBusy, match=f"taken over by {fresh}"):
                op()
        assert store.get_intent("create_ticket", "r1") is None
        assert store.begin_intent(record, fence=("r1", fresh)).owned  # the new owner's
        late_ops: list[Callable[[], Any]] = [
            lambda: store.commit_intent(
                "create_ticket", "r1", ("r1", "c2"), 1, fence=("r1", stale)
            ),
            lambda: store.abort_intent("create_ticket", "r1", ("r1", "c2"), fence=("r1", stale)),
        ]
        for op in late_ops:
            with pytest.raises(RunBusy):
                op()
        assert store.get_intent("create_ticket", "r1").status == "pending"  # type: ignore[union-attr]
        after = store.load_run("r1")
        assert (after.snapshot, after.events) == (before.snapshot, before.events)
        store.release("r1", stale)  # a stale release is a no-op
        assert store.claim_next(owners.new_owner()) is None  # still held by `fresh`


def test_a_claim_is_taken_once_by_concurrent_workers(pg_server: Any, pg_schema: str) -> None:
    """Eight threads race for 40 runs with SKIP LOCKED: each run is claimed exactly once."""
    import threading

    with _store(pg_server, pg_schema, pool_size=8) as store:
        rt = fleet_app.make_runtime(store)
        for i in range(40):
            rt.submit(fleet_app.plan(f"r{i}", "read"), run_id=f"r{i}")
        got: list[str] = []

        def take() -> None:
            while (claim := store.claim_next(owners.new_owner())) is not None:
                got.append(claim.run_id)

        threads = [threading.Thread(target=take) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == sorted(f"r{i}" for i in range(40))


# ── workers ───────────────────────────────────────────────────────────────────────


async def _drive_until(worker: Worker, done: Any, timeout: float = 30.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(done):
        assert time.monotonic() < deadline, "the worker did not finish in time"
        await asyncio.sleep(0.05)
    stop.set()
    await task


def test_a_worker_drives_submitted_runs_and_reviewed_ones(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")
    with _store(pg_server, pg_schema, pool_size=12) as store:
        rt = fleet_app.make_runtime(store)
        for i, kind in enumerate(fleet_app.KINDS * 3):
            rt.submit(fleet_app.plan(f"r{i}", kind, f"k{i}"), run_id=f"r{i}")
        worker = Worker(rt, concurrency=4, poll_s=5.0)

        def settled() -> bool:
            return all(r.state in ("done", "review_required") for r in store.list_runs())

        asyncio.run(_drive_until(worker, settled))
        paused = {r.run_id for r in store.list_runs("review_required")}
        assert len(paused) == 3 and worker.counts.claimed == worker.counts.finished == 15

        # A reviewer's decision is announced (NOTIFY): a waiting worker claims the run at
        # once, not at its next poll (5 s away).
        async def review_and_wait() -> list[float]:
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            await asyncio.sleep(0.3)  # listening
            waits = []
            for run_id in sorted(paused):
                decided = time.monotonic()
                await asyncio.to_thread(record_review, store, run_id, "c2", "approve")
                while (await asyncio.to_thread(store.load_run, run_id)).body["state"] != "done":
                    await asyncio.sleep(0.005)
                waits.append(time.monotonic() - decided)
            stop.set()
            await task
            return waits

        waits = asyncio.run(review_and_wait())
        assert max(waits) < 2.0, waits
        assert {r.state for r in store.list_runs()} == {"done"}
        effects = fleet_app.ledger(str(tmp_path / "ledger.jsonl"))
        assert sorted(e["key"] for e in effects if e["tool"] == "refund") == ["k14", "k4", "k9"]
        fleet = store.fleet()
        assert fleet["runs"]["done"]["runs"] == 15
        assert fleet["workers"][0]["finished"] == 18 and fleet["workers"][0]["state"] == "stopped"


def _worker_process(
    server: Any, schema: str, tmp: Path, tool_s: float, *extra: str
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "FSM_LEDGER": str(tmp / "ledger.jsonl"),
        "FSM_TOOL_S": str(tool_s),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fsm_agent", "worker", "--db", server.dsn, "--schema", schema,
         "--app", "fleet_app:make_runtime", "--lease", "1", "--poll", "0.3", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_sigterm_drains_and_another_worker_continues(
    pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    with _store(pg_server, pg_schema) as store:
        rt = fleet_app.make_runtime(store)
        for i in range(3):
            rt.submit(fleet_app.plan(f"r{i}", "unkeyed"), run_id=f"r{i}")
        slow = _worker_process(pg_server, pg_schema, tmp_path, 3.0, "--grace", "0.5")
        deadline = time.monotonic() + 20
        while sum(w["active"] for w in store.fleet()["workers"]) < 3:
            assert time.monotonic() < deadline and slow.poll() is None
            time.sleep(0.1)
        stopped = time.monotonic()
        slow.send_signal(signal.SIGTERM)
        out, _ = slow.communicate(timeout=20)
        assert slow.returncode == 0 and time.monotonic() - stopped < 5, out
        assert out.count("released run") == 3 and "draining 3 runs" in out, out
        # Released, not ended: nothing is claimed, the runs continue elsewhere.
        assert {r.state for r in store.list_runs()} - {"done"} <= {"deciding", "executing"}
        fast = _worker_process(pg_server, pg_schema, tmp_path, 0.001)
        try:
            deadline = time.monotonic() + 20
            while {r.state for r in store.list_runs()} - {"done", "review_required"}:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            fast.send_signal(signal.SIGTERM)
            out, _ = fast.communicate(timeout=20)
        effects = [e["key"] for e in fleet_app.ledger(str(tmp_path / "ledger.jsonl"))]
        assert len(effects) == len(set(effects))  # no notification sent twice
        for r in store.list_runs():
            if r.state == "review_required":  # cut off while its write was in flight
                assert r.reason == "outcome_unknown"


# ── the chaos run ─────────────────────────────────────────────────────────────────


def test_chaos(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reason = pgserver.unavailable(own=True) and pgserver.unavailable()
    if reason:
        pytest.skip(reason)
    import fleet_chaos

    report = fleet_chaos.chaos(tmp_path, runs=240)
    with capsys.disabled():
        print("\n" + report.line())
    assert report.runs >= 200 and report.kills >= 3 and report.stalls >= 2
    assert report.restarts == (1 if pgserver.find_binaries() else 0)
    assert report.approvals > 0 and report.writes > 0
    assert report.duplicates == 0, report.line()
    assert report.lost == 0 and report.phantom == 0, report.line()
    assert report.unsettled == 0, report.line()
    assert report.trace_problems == 0, report.line()
    assert report.stale_accepted == 0, report.line()
    if report.stalled_holding:  # a stalled worker woke up to runs taken over: refused
        assert report.fenced > 0, report.line()


# ── the same promises through the plain Runtime on PostgreSQL ──────────────────────


def test_a_run_resumes_on_postgres_after_the_server_restarts(
    pg_server: Any, pg_schema: str, backend: Backend
) -> None:
    if not pg_server.throwaway:
        pytest.skip(f"{pgserver.ENV} names a server this test cannot restart")
    with _store(pg_server, pg_schema, timeout=15) as store:
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-1", title="x")), say("Filed.")],
            backend,
            store=store,
            approval=True,
        )
        assert rt.run("file it", run_id="r1").status == "review_required"
        pg_server.restart()  # every pooled connection is cut
        done = rt.approve("r1", "c1", resume=True)  # the first operation meets a dead connection...
        assert (done.status, backend.writes) == ("done", [{"request_id": "R-1", "title": "x"}])


def test_submit_records_without_driving(pg_server: Any, pg_schema: str) -> None:
    with _store(pg_server, pg_schema) as store:
        rt = fleet_app.make_runtime(store)
        run_id = rt.submit(fleet_app.plan("r1", "read"))
        stored = store.load_run(run_id)
        assert stored.body["state"] == "deciding" and [e["type"] for e in stored.events] == [
            "run_start"
        ]
        assert json.loads(stored.messages[0]["content"])["tag"] == "r1"
        result = asyncio.run(rt.aresume(run_id))  # any driver may take it from here
        assert result.status == "done"


def test_a_long_call_keeps_its_claim_by_heartbeats(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool that runs three leases long: the heartbeat renews the claim meanwhile, so a
    competing worker polling all along never takes the run over (which would stop it for
    review as an unknown outcome)."""
    import threading

    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.6")  # the write: two pauses, about 1.2 s in all
    with _store(pg_server, pg_schema, lease_s=0.4) as store:
        rt = fleet_app.make_runtime(store)
        rt.submit(fleet_app.plan("r1", "unkeyed"), run_id="r1")
        owner = owners.new_owner()
        owners.hold(owner)
        claim = store.claim_next(owner)
        assert claim is not None
        taken: list[str] = []
        stop = threading.Event()

        def compete() -> None:
            while not stop.is_set():
                other = store.claim_next(owners.new_owner())
                if other is not None:
                    taken.append(other.run_id)
                time.sleep(0.05)

        competitor = threading.Thread(target=compete)
        competitor.start()
        try:
            result = asyncio.run(rt.aresume("r1", claimed_by=owner))
        finally:
            stop.set()
            competitor.join()
        assert (result.status, taken) == ("done", [])
        assert [e["key"] for e in fleet_app.ledger(str(tmp_path / "ledger.jsonl"))] == [
            "hello from r1"
        ]
