"""The fleet on a real PostgreSQL server: the run queue, workers, fencing, draining, and
the chaos run (real worker processes, SIGKILL, SIGSTOP past the lease, a server restart).

Skipped, with the reason, only where no PostgreSQL server can be had (see
``fsm_agent/testing/_pgserver.py``); CI installs one (``.ci/run``)."""

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
from fsm_agent._durable import owners
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.review import record_review
from fsm_agent._durable.store import Checkpoint
from fsm_agent._errors import RunBusy, StoreError
from fsm_agent._runtime.worker import Worker
from fsm_agent.testing import _pgserver as pgserver

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
    # ...found by the real CLI: every stored run checked, and exported files too
    assert report.checked == report.runs and report.exported >= report.runs // 10
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
        # No trace yet: its first driver writes the run_start, under its own settings.
        assert (stored.body["state"], stored.events) == ("deciding", [])
        assert stored.header["allowed_tools"] == sorted(fleet_app.TOOLS)
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


# ── fleet traces: chained, signed and headed by what governed them (issue 23) ─────


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_agent", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_a_submitted_run_driven_by_a_worker_passes_check_on_its_export(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted by a runtime with no key and no approvals, driven by a worker whose
    application signs its traces and approves the refund: every stored line is chained
    under the worker's key, the header names the approval that let the refund run, and
    both `check` on the export and `check --db <DSN>` pass."""
    from fsm_agent import Approval, Runtime

    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")
    refund = Approval("refund", {"request_id": "r2", "cents": 500})
    with _store(pg_server, pg_schema) as store:
        submitter = fleet_app.make_runtime(store)
        for i, kind in enumerate(("read", "keyed", "approval")):
            submitter.submit(fleet_app.plan(f"r{i}", kind), run_id=f"r{i}")
        app = fleet_app.make_runtime(store)
        worker_rt = Runtime(
            model=app.model, tools=app.tools, allowed_tools=app.allowed_tools, store=store,
            budget=app.budget, retry=app.retry, approvals=[refund], trace_key="fleet-key",
        )  # fmt: skip
        worker = Worker(worker_rt, concurrency=3, poll_s=0.2)

        def settled() -> bool:
            return {r.state for r in store.list_runs()} == {"done"}

        asyncio.run(_drive_until(worker, settled))
        header = store.load_run("r2").events[0]
        assert header["integrity"] == "hmac-sha256"
        assert [a["digest"] for a in header["approvals"]] == [refund.digest]
    db = ["--db", pg_server.dsn, "--schema", pg_schema]
    key = {"FLEET_KEY": "fleet-key"}
    for run_id in ("r0", "r1", "r2"):
        out = tmp_path / f"{run_id}.jsonl"
        done = _cli("runs", "export", run_id, *db, "-o", str(out))
        assert done.returncode == 0, done.stderr
        lines = out.read_text().splitlines()
        assert all(json.loads(line)["run"] == run_id for line in lines)
        checked = _cli("check", "--key-env", "FLEET_KEY", str(out), env=key)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    stored = _cli("check", "--key-env", "FLEET_KEY", *db, "r0", "r1", "r2", env=key)
    assert stored.returncode == 0, stored.stdout + stored.stderr
    assert stored.stdout.count(": ok") == 3 and "password" not in stored.stdout
    wrong = _cli("check", "--key-env", "FLEET_KEY", *db, "r2", env={"FLEET_KEY": "other"})
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr


# ── a store outage shorter than the lease (issue 23) ──────────────────────────────


def _state_of(store: PostgresStore, run_id: str) -> str | None:
    try:
        return str(store.load_run(run_id).body["state"])
    except StoreError:  # the pool is still reconnecting
        return None


def _slow_write_runtime(store: PostgresStore, started: Any, write_s: float) -> Any:
    """One write (``ship``) that takes ``write_s`` seconds, then a final answer."""
    from fsm_agent import Runtime, ToolRegistry

    registry = ToolRegistry()
    text = {"type": "string", "minLength": 1}

    @registry.tool(
        schema={"type": "object", "required": ["order_id"], "properties": {"order_id": text}},
        effect="write",
        idempotency_key=lambda a: a["order_id"],
    )
    async def ship(order_id: str) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(write_s)
        return {"shipped": order_id}

    async def model(messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> Any:
        if any(m.get("role") == "tool" for m in messages):
            return {"role": "assistant", "content": "Shipped."}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "ship", "arguments": '{"order_id": "o1"}'}}]}  # fmt: skip

    return Runtime(model=model, tools=registry, allowed_tools={"ship"}, store=store)


@pytest.mark.parametrize(
    ("lease", "down_s", "write_s"),
    [(6.0, 3.0, 10.0), (1.5, 3.0, 7.0)],
    ids=["shorter-than-the-lease", "longer-than-the-lease"],
)
def test_a_store_outage_costs_a_live_worker_nothing(
    pg_server: Any, pg_schema: str, lease: float, down_s: float, write_s: float
) -> None:
    """The server is stopped while the worker's write runs, then started again: the
    heartbeat retries until the store is back and keeps the claim (the lease is out
    after the longer outage, but no other driver took the run), the worker does not
    re-claim its own run as orphaned, and the write's result is committed (``done``),
    not lost to ``review_required/outcome_unknown``."""
    import threading

    if not pg_server.throwaway:
        pytest.skip(f"{pgserver.ENV} names a server this test cannot stop")
    started = threading.Event()
    # The pool waits ``timeout`` for a connection: the outage must outlast it to fail
    # a renewal at all.
    with _store(pg_server, pg_schema, lease_s=lease, timeout=1) as store:
        rt = _slow_write_runtime(store, started, write_s=write_s)
        rt.submit("ship o1", run_id="r1")
        worker = Worker(rt, concurrency=2, poll_s=0.2)

        async def scenario() -> float:
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            assert await asyncio.to_thread(started.wait, 20)
            await asyncio.sleep(0.5)  # past the checkpoint taken before the write
            down = time.monotonic()
            await asyncio.to_thread(pg_server.stop_server)
            await asyncio.sleep(down_s)  # renewals fail meanwhile
            await asyncio.to_thread(pg_server.start_again)
            outage = time.monotonic() - down
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(_state_of, store, "r1") not in (
                "done",
                "review_required",
            ):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            stop.set()
            await task
            return outage

        outage = asyncio.run(scenario())
        assert (outage < lease) == (lease > down_s), f"outage {outage:.1f}s, lease {lease}s"
        stored = store.load_run("r1")
        assert (stored.body["state"], stored.body["reason"]) == ("done", "final_answer")
        assert (worker.counts.claimed, worker.counts.fenced, worker.counts.failed) == (1, 0, 0)
        assert store.get_intent("ship", "o1").status == "committed"  # type: ignore[union-attr]


def test_a_live_driver_in_another_pid_namespace_keeps_its_run_on_postgres(
    pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    """Same host name, same boot id, PID 1 of its own namespace: this process cannot see
    it, so it does not declare it dead — ``claim`` (what ``resume`` does) is refused
    while the lease holds."""
    from test_safety_runs import live_in_another_pid_namespace

    with _store(pg_server, pg_schema) as store:
        child = live_in_another_pid_namespace(tmp_path, pg_server.dsn, pg_schema)
        try:
            with pytest.raises(RunBusy, match="is being driven by"):
                store.claim("r1", owners.new_owner())
            assert child.poll() is None
        finally:
            child.kill()
            child.wait()


def test_a_run_this_process_still_drives_is_not_taken_when_its_lease_lapses(
    pg_server: Any, pg_schema: str
) -> None:
    """Its lease ran out (the store was unreachable longer than the lease) but this
    process still drives it: ``claim`` here refuses; once that driving ends it is free."""
    with _store(pg_server, pg_schema, lease_s=0.3) as store:
        fleet_app.make_runtime(store).submit(fleet_app.plan("r1", "read"), run_id="r1")
        driving = owners.new_owner()
        owners.hold(driving)
        assert store.claim_next(driving) is not None
        time.sleep(0.5)
        with pytest.raises(RunBusy, match=driving):
            store.claim("r1", owners.new_owner())
        owners.drop(driving)
        store.claim("r1", owners.new_owner())


def test_a_sigkilled_worker_lets_go_at_once_and_is_listed_as_lost(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process with a 30 s lease is killed (SIGKILL) mid-run: a worker on the
    same host takes its run over at once (its process is certainly gone), not 30 s
    later; and ``fleet()`` lists the killed worker as ``lost``, not ``running``."""
    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")
    with _store(pg_server, pg_schema, lease_s=30.0) as store:
        fleet_app.make_runtime(store).submit(fleet_app.plan("r1", "unkeyed"), run_id="r1")
        doomed = _worker_process(pg_server, pg_schema, tmp_path, 5.0, "--lease", "30")
        try:
            deadline = time.monotonic() + 30
            while not any(w["active"] for w in store.fleet()["workers"]):
                assert time.monotonic() < deadline and doomed.poll() is None
                time.sleep(0.1)
        finally:
            doomed.kill()
            doomed.communicate()
        killed = time.monotonic()
        worker = Worker(fleet_app.make_runtime(store), concurrency=1, poll_s=0.2)

        def settled() -> bool:
            return store.load_run("r1").body["state"] in ("done", "review_required")

        asyncio.run(_drive_until(worker, settled, timeout=20))
        assert time.monotonic() - killed < 10, "the dead worker's lease was waited out"
        assert worker.counts.claimed == 1
        time.sleep(max(5.5 - (time.monotonic() - killed), 0))
        with _store(pg_server, pg_schema, lease_s=1.0) as status:
            states = sorted(w["state"] for w in status.fleet()["workers"])
        assert states == ["lost", "stopped"], states
