"""Attacks on the fleet that no one had made (issue 23), on a real PostgreSQL server:
two submits of one run id at once, connections killed by the server mid-commit,
``runs prune`` racing the workers, and notifications that never arrive.

Each checks the same truth as the chaos run: the side-effect ledger the tools write
(``fleet_app.py``) against the store, and ``fsm-agent check --db`` on every run."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fleet_app
import pytest

from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import RunExists, StoreError
from fsm_agent._runtime.worker import Worker

FINISHED = {"done", "budget_exhausted", "protocol_error", "cancelled"}


def _store(server: Any, schema: str, **options: Any) -> PostgresStore:
    return PostgresStore(server.dsn, schema=schema, **options)


async def _drive_until(worker: Worker, done: Any, timeout: float = 60.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while not await asyncio.to_thread(done):
            assert time.monotonic() < deadline, "the worker did not finish in time"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task


def _settled(store: PostgresStore) -> bool:
    try:
        runs = store.list_runs()
    except StoreError:
        return False
    return all(r.state in FINISHED or r.state == "review_required" for r in runs)


def _check_all(server: Any, schema: str, run_ids: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", "-q", "--db", server.dsn,
         "--schema", schema, *run_ids],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _no_write_twice(ledger: str) -> Counter[tuple[str, str]]:
    executed = Counter((e["tool"], e["key"]) for e in fleet_app.ledger(ledger))
    twice = {k: n for k, n in executed.items() if k[0] != "charge" and n > 1}
    assert not twice, twice
    return executed


# ── two submits of one run id at once ─────────────────────────────────────────────


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_concurrent_submits_of_one_run_id_one_wins_the_others_get_run_exists(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Eight submitters, each with a store object of its own, race on each of 25 run
    ids: exactly one submit per id returns it, every other raises ``RunExists`` naming
    the id, and the stored run is the winner's (its task, one header, no events)."""
    stores: list[Any]
    if kind == "postgres":
        server, schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
        stores = [_store(server, schema, pool_size=2) for _ in range(8)]
    else:
        stores = [SqliteStore(tmp_path / "runs.db", timeout=30) for _ in range(8)]
    try:
        runtimes = [fleet_app.make_runtime(s) for s in stores]
        wins: Counter[str] = Counter()
        errors: list[BaseException] = []
        task_of: dict[str, int] = {}
        lock = threading.Lock()
        barrier = threading.Barrier(len(runtimes))

        def submit(n: int) -> None:
            barrier.wait()
            for i in range(25):
                run_id = f"r{i}"
                try:
                    runtimes[n].submit(fleet_app.plan(f"{run_id}-by-{n}", "read"), run_id=run_id)
                except RunExists as exc:
                    assert repr(run_id) in str(exc) and "already stored" in str(exc)
                    continue
                except BaseException as exc:  # anything else is a failure of the race
                    errors.append(exc)
                    continue
                with lock:
                    wins[run_id] += 1
                    task_of[run_id] = n

        threads = [threading.Thread(target=submit, args=(n,)) for n in range(len(runtimes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert wins == Counter({f"r{i}": 1 for i in range(25)})
        for run_id, n in task_of.items():
            stored = stores[0].load_run(run_id)
            assert stored.events == [] and stored.body["state"] == "deciding"
            assert f"{run_id}-by-{n}" in stored.messages[0]["content"]
    finally:
        for s in stores:
            s.close()


# ── the server kills a worker's connections mid-commit ─────────────────────────────


def _terminator(dsn: str, schema: str, stop: threading.Event, kills: list[int]) -> None:
    """Terminate a random backend of the workers' pool every 20-80 ms (not its own)."""
    import psycopg

    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        me = conn.info.backend_pid
        while not stop.is_set():
            pids = [
                pid
                for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> %s AND backend_type = 'client backend' "
                    "AND application_name LIKE 'fsm-agent%%'",
                    [me],
                ).fetchall()
            ]
            if pids:
                conn.execute("SELECT pg_terminate_backend(%s)", [rng.choice(pids)])
                kills.append(1)
            stop.wait(rng.uniform(0.02, 0.08))


def _run_of(tool: str, key: str) -> str:
    return key.removeprefix("hello from ") if tool == "notify" else key


def _nothing_lost(store: PostgresStore, executed: Counter[tuple[str, str]]) -> None:
    """Every write in the ledger is recorded (a committed intent, or the run's own
    history) or its run waits for a reviewer to settle it (``outcome_unknown``)."""
    for tool, key in executed:
        stored = store.load_run(_run_of(tool, key))
        if stored.body["state"] == "review_required":
            assert stored.body["reason"] == "outcome_unknown"
            continue
        if tool != "notify":
            intent = store.get_intent(tool, key)
            assert intent is not None and intent.status == "committed", (tool, key)
        answers = [m for m in stored.messages if m.get("tool_call_id") == "c2"]
        assert answers and stored.body["state"] == "done", (tool, key, stored.body["state"])


def test_connections_killed_mid_commit_lose_and_repeat_nothing(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server terminates a random connection of the fleet every 20-80 ms
    (``pg_terminate_backend``: mid-statement, mid-commit, the listener's) while a
    worker drives 40 runs with writes: every run ends or waits for review as
    ``outcome_unknown``, no keyed write runs twice, none is lost, and every trace
    passes ``fsm-agent check --db``."""
    ledger = str(tmp_path / "ledger.jsonl")
    monkeypatch.setenv("FSM_LEDGER", ledger)
    monkeypatch.setenv("FSM_TOOL_S", "0.02")
    kinds = ("read", "keyed", "unkeyed", "dedup")
    with _store(pg_server, pg_schema, lease_s=1.0, pool_size=10) as store:
        rt = fleet_app.make_runtime(store)
        run_ids = [f"r{i}" for i in range(40)]
        for i, run_id in enumerate(run_ids):
            rt.submit(fleet_app.plan(run_id, kinds[i % len(kinds)]), run_id=run_id)
        stop = threading.Event()
        kills: list[int] = []
        killer = threading.Thread(target=_terminator, args=(pg_server.dsn, pg_schema, stop, kills))
        killer.start()
        worker = Worker(rt, concurrency=4, poll_s=0.2)
        try:
            asyncio.run(_drive_until(worker, lambda: _settled(store), timeout=120))
        finally:
            stop.set()
            killer.join()
        executed = _no_write_twice(ledger)
        print(f"\nconnections killed: {len(kills)}; worker: {worker.counts}")
        assert len(kills) >= 10  # (measured: 22-327 per run on a loaded 2-core machine)
    # What the database holds, read on connections of its own: right after the storm the
    # attacked pool is still testing and replacing what was killed (all ten back within
    # 0.5 s in the runs measured; once, on a clean clone, not within its 5 s timeout).
    with _store(pg_server, pg_schema) as reader:
        _nothing_lost(reader, executed)
    _check_all(pg_server, pg_schema, run_ids)


# ── runs prune racing the workers ────────────────────────────────────────────────


def test_runs_prune_racing_workers_deletes_only_finished_runs(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fsm-agent runs prune --older-than 0s`` in a loop while a worker drives 30 runs:
    only runs that had finished are ever deleted (a run still queued, driven or
    waiting for review stays), no worker fails, and no write runs twice."""
    ledger = str(tmp_path / "ledger.jsonl")
    monkeypatch.setenv("FSM_LEDGER", ledger)
    monkeypatch.setenv("FSM_TOOL_S", "0.02")
    kinds = ("read", "keyed", "unkeyed", "approval")
    with _store(pg_server, pg_schema, lease_s=2.0, pool_size=10) as store:
        rt = fleet_app.make_runtime(store)
        run_ids = [f"r{i}" for i in range(30)]
        for i, run_id in enumerate(run_ids):
            rt.submit(fleet_app.plan(run_id, kinds[i % len(kinds)]), run_id=run_id)
        stop = threading.Event()
        prunes: list[tuple[int, int]] = []

        def prune() -> None:
            with _store(pg_server, pg_schema, pool_size=1) as pruner:
                while not stop.is_set():
                    prunes.append(pruner.prune(0.0))

        pruner = threading.Thread(target=prune)
        pruner.start()
        worker = Worker(rt, concurrency=4, poll_s=0.2)

        def settled() -> bool:
            return all(r.state == "review_required" for r in store.list_runs())

        try:
            asyncio.run(_drive_until(worker, settled, timeout=60))
        finally:
            stop.set()
            pruner.join()
        left = {r.run_id: r for r in store.list_runs()}
        # What is left waits for a reviewer (the approvals); everything else finished
        # and was pruned.
        assert set(left) == {f"r{i}" for i in range(3, 30, 4)}, sorted(left)
        assert sum(n for n, _ in prunes) == 30 - len(left)
        assert worker.counts.failed == 0 and worker.counts.fenced == 0, worker.counts
        _no_write_twice(ledger)
        effects = {(e["tool"], e["key"]) for e in fleet_app.ledger(ledger)}
        assert len([e for e in effects if e[0] in ("create_ticket", "notify")]) == 15


# ── notifications that never arrive ───────────────────────────────────────────────


def test_a_worker_that_never_hears_a_notify_still_finds_the_work(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``NOTIFY`` lost (the worker's listener never hears one): the worker finds
    runs submitted while it waits by its poll alone, each within about ``poll_s``."""
    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")

    async def deaf(self: Worker, wake: asyncio.Event) -> None:
        await asyncio.Event().wait()  # connected to nothing: hears nothing, ever

    monkeypatch.setattr(Worker, "_listen", deaf)
    with _store(pg_server, pg_schema) as store:
        rt = fleet_app.make_runtime(store)
        worker = Worker(rt, concurrency=2, poll_s=0.3)

        async def scenario() -> list[float]:
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            await asyncio.sleep(0.5)
            waits = []
            for i in range(10):
                submitted = time.monotonic()
                await asyncio.to_thread(rt.submit, fleet_app.plan(f"r{i}", "read"), run_id=f"r{i}")
                while (await asyncio.to_thread(store.load_run, f"r{i}")).body["state"] != "done":
                    assert time.monotonic() - submitted < 10, "the poll did not find the run"
                    await asyncio.sleep(0.02)
                waits.append(time.monotonic() - submitted)
            stop.set()
            await task
            return waits

        waits = asyncio.run(scenario())
        assert max(waits) < 0.3 + 1.5, waits  # a poll interval and the run itself
        assert worker.counts.finished == 10


def test_notifies_lost_under_load_leave_no_run_behind(
    pg_server: Any, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 runs submitted at once by 6 threads to 3 workers whose listeners lose their
    connections over and over (their backends terminated): every run is driven."""
    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")
    import psycopg

    with _store(pg_server, pg_schema, pool_size=12) as store:
        rt = fleet_app.make_runtime(store)
        workers = [
            Worker(fleet_app.make_runtime(store), concurrency=4, poll_s=1.0) for _ in range(3)
        ]
        stop_cutting = threading.Event()
        cuts: list[int] = []

        def cut_listeners() -> None:
            with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
                while not stop_cutting.wait(0.05):
                    cuts.extend(
                        1
                        for (cut,) in conn.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
                        ).fetchall()
                        if cut
                    )

        async def scenario() -> None:
            stop = asyncio.Event()
            tasks = [asyncio.create_task(w.run(stop)) for w in workers]
            await asyncio.sleep(0.3)

            def submit(n: int) -> None:
                for i in range(n, 300, 6):
                    rt.submit(fleet_app.plan(f"r{i}", "read"), run_id=f"r{i}")

            await asyncio.gather(*(asyncio.to_thread(submit, n) for n in range(6)))
            deadline = time.monotonic() + 90
            while not await asyncio.to_thread(
                lambda: {r.state for r in store.list_runs()} == {"done"}
            ):
                assert time.monotonic() < deadline, "runs left behind"
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*tasks)

        cutter = threading.Thread(target=cut_listeners)
        cutter.start()
        try:
            asyncio.run(scenario())
        finally:
            stop_cutting.set()
            cutter.join()
        assert len(store.list_runs("done")) == 300
        assert sum(w.counts.finished for w in workers) == 300
        print(f"\nlisteners cut: {len(cuts)}")
        assert len(cuts) >= 3
