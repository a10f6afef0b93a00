"""Cancelling a run while it is driven: the cancel request stored with the run, returned
by the driver's heartbeat (no read of its own) or read with its claim, and honoured
through the table's ``cancel`` edges with who asked, when and why.

Through real boundaries: a worker process (``fsm-agent worker``) driving a slow run on
PostgreSQL, an application process driving one on SQLite (``Runtime.arun``), the review
server over HTTP; SIGKILL of the worker after the request; the exported trace checked by
``fsm-agent check``. The store operation itself on every store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fleet_app
import httpx
import pytest
from conftest import Backend, call, calls, make_runtime, say
from server_harness import LiveServer

from fsm_agent import MemoryStore, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._durable import owners
from fsm_agent._durable.cancel import NotCancellable, ask_cancel
from fsm_agent._durable.feed import make_key
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._durable.store import CancelRequest
from fsm_agent._errors import RunNotFound
from fsm_agent._runtime.worker import Worker
from fsm_agent._trace.checker import check_bytes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _wait(what: Callable[[], Any], timeout: float, why: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        assert time.monotonic() < deadline, why
        time.sleep(0.02)


def _admin(store: Any) -> str:
    key, record = make_key("root", "admin")
    store.add_key(record)
    return key


def _client(server: LiveServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}, timeout=10)


def _state(store: Any, run_id: str) -> tuple[str, str]:
    body = store.load_run(run_id).body
    return str(body.get("state")), str(body.get("reason") or "")


def _the_cancel(store: Any, run_id: str) -> dict[str, Any]:
    """The run's ``cancel`` transition (exactly one); the run ended after it."""
    events: list[dict[str, Any]] = store.load_run(run_id).events
    (cancel,) = [e for e in events if e["type"] == "transition" and e["trigger"] == "cancel"]
    assert events[-1]["type"] == "run_end"
    return cancel


def _checks(server: LiveServer, key: str, run_id: str, tmp: Path) -> None:
    """The trace as the server exports it passes ``fsm-agent check``."""
    with _client(server, key) as c:
        trace = c.get(f"/api/runs/{run_id}/trace").content
    path = tmp / f"{run_id}.jsonl"
    path.write_bytes(trace)
    checked = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ── the store operation, on every store ───────────────────────────────────────────


def test_a_cancel_request_is_stored_once_renewed_back_and_read_with_the_run(store: Any) -> None:
    rt = make_runtime([say("hi")], Backend(), store=store)
    rt.run("hello", run_id="done")
    rt.submit("hello again", run_id="r1")
    driver = owners.new_owner()
    owners.hold(driver)
    store.claim("r1", driver)
    try:
        assert store.renew("r1", driver) is None  # nothing asked yet
        first = CancelRequest("2026-01-31T12:00:00.000Z", "root", "the customer called")
        assert store.request_cancel("r1", first) == first
        again = CancelRequest("2026-01-31T12:00:09.000Z", "bob")
        assert store.request_cancel("r1", again) == first  # the first one stays
        assert store.renew("r1", driver) == first  # the heartbeat's renewal brings it
        assert store.load_run("r1").cancel_request == first
        assert again.to_json() == {"at": "2026-01-31T12:00:09.000Z", "by": "bob"}
    finally:
        owners.let_go(store, "r1", driver)
    assert store.request_cancel("done", first) is None  # ended: nothing stored
    assert store.load_run("done").cancel_request is None
    with pytest.raises(RunNotFound):
        store.request_cancel("nope", first)


def test_the_next_driver_honours_a_stored_request_before_it_asks_anything(store: Any) -> None:
    """A request stored while nobody drives the run (its driver died, or it stopped in
    the middle of a batch) is read with the next claim: the run ends cancelled at its
    first step, the model never asked — also on a MemoryStore, which has no heartbeat."""
    backend = Backend()
    rt = make_runtime([say("never asked")], backend, store=store)
    rt.submit("hello", run_id="r1")
    driver = owners.new_owner()
    owners.hold(driver)
    store.claim("r1", driver)  # a live driver: the cancel is a request
    try:
        asked = ask_cancel(store, "r1", by="root", note="stop")
        assert isinstance(asked, CancelRequest)
    finally:
        owners.let_go(store, "r1", driver)
    result = rt.resume("r1")
    assert (result.status, result.reason) == ("cancelled", "cancelled")
    cancel = _the_cancel(store, "r1")
    assert (cancel["by"], cancel["note"], cancel["at"]) == ("root", "stop", asked.at)
    assert rt.model.calls == 0  # type: ignore[attr-defined]
    with pytest.raises(NotCancellable, match="it has ended"):
        ask_cancel(store, "r1", by="root")


def _lookups(store: Any, script: list[Any], lookup: Callable[..., Any]) -> Runtime:
    """A runtime whose one tool is ``lookup`` (a read), on the real clock."""
    tools = ToolRegistry()
    schema = {"type": "object", "required": ["order_id"],
              "properties": {"order_id": {"type": "string"}}}  # fmt: skip
    tools.register(lookup, name="lookup", effect="read", schema=schema)
    return Runtime(model=ScriptedModel(script), tools=tools, allowed_tools=["lookup"], store=store)


def test_a_run_stopped_mid_batch_gets_a_request_its_resume_honours(tmp_path: Path) -> None:
    """Mid-batch, the run cannot be cancelled without its tools (409 before); now the
    request is stored and the resume stops it at once, nothing run."""
    from fsm_agent.testing._faults import ProcessDied
    from fsm_agent.testing._mortal import Mortal

    ran: list[str] = []
    with SqliteStore(tmp_path / "runs.db") as store:
        # Every checkpoint committed as it is asked for (none waits behind the next):
        # the process dies with the batch's first call stored.
        store.save_behind = store.save  # type: ignore[method-assign]
        mortal = Mortal(store)

        def lookup(order_id: str) -> dict[str, Any]:
            if order_id == "B2" and not mortal.dead and len(ran) == 1:
                mortal.kill()
                raise ProcessDied("killed between the calls")
            ran.append(order_id)
            return {"order_id": order_id}

        script = [calls(call("c1", "lookup", order_id="A1"), call("c2", "lookup", order_id="B2"))]
        rt = _lookups(store, [*script, say("never")], lookup)
        with pytest.raises(ProcessDied):
            rt.run("two lookups", run_id="r1")
        mortal.restart()
        assert _state(store, "r1")[0] != "deciding"
        asked = ask_cancel(store, "r1", by="root", note="enough")
        assert isinstance(asked, CancelRequest)
        before = list(ran)
        result = rt.resume("r1")
        assert (result.status, result.reason) == ("cancelled", "cancelled")
        assert ran == before  # nothing more ran
        assert _the_cancel(store, "r1")["by"] == "root"
        report = check_bytes(_trace(store, "r1"))
        assert report.violations == [], report.violations


def _trace(store: Any, run_id: str) -> bytes:
    from fsm_agent.server._runs import trace_lines

    return trace_lines(store.load_run(run_id)).encode()


def test_a_sync_run_honours_the_request_at_its_next_step(tmp_path: Path) -> None:
    """``Runtime.run`` in an application process: its heartbeat brings the request; a
    sync tool running inline is not interrupted (it finishes, its result is kept), and
    the run stops before the model is asked again."""
    started = threading.Event()
    ran: list[str] = []

    def slow(order_id: str) -> dict[str, Any]:
        started.set()
        time.sleep(0.8)  # several heartbeats
        ran.append(order_id)
        return {"order_id": order_id}

    with SqliteStore(tmp_path / "runs.db", lease_s=0.3) as store:
        script = [calls(call("c1", "lookup", order_id="A1")), say("never asked")]
        rt = _lookups(store, script, slow)

        def cancel() -> None:
            started.wait(10)
            with SqliteStore(tmp_path / "runs.db") as other:  # as another process would
                ask_cancel(other, "r1", by="ops", note="taking too long")

        asker = threading.Thread(target=cancel)
        asker.start()
        result = rt.run("where is A1?", run_id="r1")
        asker.join()
        assert (result.status, result.reason) == ("cancelled", "cancelled")
        assert ran == ["A1"]  # the tool finished; its result is in the history
        assert rt.model.calls == 1  # type: ignore[attr-defined]
        assert _the_cancel(store, "r1")["by"] == "ops"
        assert check_bytes(_trace(store, "r1")).violations == []


def test_sqlite_an_application_process_stops_when_cancelled_over_http(tmp_path: Path) -> None:
    """An application process drives a slow run (``Runtime.arun`` on a SQLite file with
    a 0.9 s lease); the review server, on the same file, is asked over HTTP to cancel it:
    202 with the request, then the run ends cancelled within a heartbeat (0.3 s) and a
    little, the model call in flight interrupted; the export checks."""
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        key = _admin(store)
    app = subprocess.Popen(
        [sys.executable, "-c", _APP, str(db), "r1", "read"],
        env={**os.environ, "PYTHONPATH": str(HERE), "FSM_TOOL_S": "6",
             "FSM_LEDGER": str(tmp_path / "ledger.jsonl")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        with SqliteStore(db) as store:
            server = LiveServer(store).start()
            try:
                _wait(lambda: _exists(store, "r1"), 30, "the application did not start the run")
                with _client(server, key) as c:
                    asked = time.monotonic()
                    r = c.post("/api/runs/r1/cancel", json={"note": "wrong customer"})
                    assert r.status_code == 202, r.text
                    assert r.json()["run"]["cancel_requested"]["by"] == "root"
                    assert r.json()["run"]["status"] not in ("cancelled", "done")
                out, _ = app.communicate(timeout=30)
                latency = time.monotonic() - asked
                assert app.returncode == 0, out
                assert json.loads(out.splitlines()[-1]) == ["cancelled", "cancelled"], out
                assert latency < 0.3 + 2.0, latency  # the model call took 3-9 s
                cancel = _the_cancel(store, "r1")
                assert (cancel["by"], cancel["note"]) == ("root", "wrong customer")
                assert cancel["at"] == r.json()["run"]["cancel_requested"]["at"]
                _checks(server, key, "r1", tmp_path)
                with _client(server, key) as c:
                    again = c.post("/api/runs/r1/cancel")
                    assert again.status_code == 409 and "it has ended" in again.json()["detail"]
            finally:
                server.stop()
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate()


#: An application process: drives one fleet_app run on a SQLite file and prints its end.
_APP = """
import asyncio, json, sys
import fleet_app
from fsm_agent import SqliteStore
db, run_id, kind = sys.argv[1:4]
with SqliteStore(db, lease_s=0.9) as store:
    result = asyncio.run(fleet_app.make_runtime(store).arun(fleet_app.plan(run_id, kind),
                                                            run_id=run_id))
print(json.dumps([result.status, result.reason]))
"""


def _exists(store: Any, run_id: str) -> bool:
    try:
        store.load_run(run_id)
    except RunNotFound:
        return False
    return True


# ── a worker process on PostgreSQL ────────────────────────────────────────────────


@pytest.fixture
def pg(pg_server: Any, pg_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        yield store


def _worker(pg_server: Any, schema: str, tmp: Path, tool_s: float, lease: float) -> Any:
    env = {**os.environ, "PYTHONPATH": str(HERE), "FSM_LEDGER": str(tmp / "ledger.jsonl"),
           "FSM_TOOL_S": str(tool_s)}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "fsm_agent", "worker", "--db", pg_server.dsn, "--schema", schema,
         "--app", "fleet_app:make_runtime", "--lease", str(lease), "--poll", "0.3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _claimed(store: PostgresStore) -> bool:
    return any(w["active"] for w in store.fleet()["workers"])


def _stop(worker: Any) -> str:
    if worker.poll() is None:
        worker.terminate()
    out, _ = worker.communicate(timeout=30)
    return str(out)


def test_a_worker_stops_a_running_run_cancelled_over_http(
    pg: PostgresStore, pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    """``fsm-agent worker`` (lease 1.2 s: a heartbeat every 0.4 s) drives a run whose
    model and lookup take seconds; a cancel over HTTP is 202 and nothing more, then the
    worker's lease renewal brings the request (at once: the request's NOTIFY wakes its
    heartbeat; else within 0.4 s) and the run ends ``cancelled/cancelled`` with
    the key's holder and the note in its ``cancel`` transition; the export checks."""
    key = _admin(pg)
    fleet_app.make_runtime(pg).submit(fleet_app.plan("r1", "read"), run_id="r1")
    worker = _worker(pg_server, pg_schema, tmp_path, 4.0, 1.2)
    server = LiveServer(pg).start()
    try:
        _wait(lambda: _claimed(pg), 30, "no worker claimed the run")
        time.sleep(0.3)
        with _client(server, key) as c:
            asked = time.monotonic()
            r = c.post("/api/runs/r1/cancel", json={"note": "duplicate order"})
            assert r.status_code == 202, r.text
            request = r.json()["run"]["cancel_requested"]
            assert request["by"] == "root" and request["note"] == "duplicate order"
        _wait(lambda: _state(pg, "r1")[0] == "cancelled", 10, "the worker did not cancel")
        latency = time.monotonic() - asked
        assert latency < 0.4 + 1.5, latency
        cancel = _the_cancel(pg, "r1")
        assert (cancel["by"], cancel["note"], cancel["at"]) == ("root", "duplicate order",
                                                                 request["at"])  # fmt: skip
        assert _state(pg, "r1") == ("cancelled", "cancelled")
        _checks(server, key, "r1", tmp_path)
        with _client(server, key) as c:
            again = c.post("/api/runs/r1/cancel")
            assert again.status_code == 409 and "it has ended" in again.json()["detail"]
    finally:
        server.stop()
        out = _stop(worker)
    assert "finished run r1: cancelled/cancelled" in out, out
    print(f"\nrequest to cancelled: {latency * 1000:.0f} ms (lease 1.2 s)")


def test_on_postgresql_the_request_wakes_the_worker_without_waiting_for_its_heartbeat(
    pg: PostgresStore, pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    """With the default-sized lease (30 s: a heartbeat every 10 s) the request would wait
    up to 10 s for the renewal that brings it; the store's ``NOTIFY cancel:<run>`` makes
    the worker driving the run renew at once."""
    key = _admin(pg)
    fleet_app.make_runtime(pg).submit(fleet_app.plan("r1", "read"), run_id="r1")
    worker = _worker(pg_server, pg_schema, tmp_path, 8.0, 30.0)
    server = LiveServer(pg).start()
    try:
        _wait(lambda: _claimed(pg), 30, "no worker claimed the run")
        with _client(server, key) as c:
            asked = time.monotonic()
            r = c.post("/api/runs/r1/cancel", json={"note": "now, not in 10 s"})
            assert r.status_code == 202, r.text
        _wait(lambda: _state(pg, "r1")[0] == "cancelled", 15, "the worker did not cancel")
        latency = time.monotonic() - asked
        assert latency < 1.5, latency
        assert _the_cancel(pg, "r1")["note"] == "now, not in 10 s"
        _checks(server, key, "r1", tmp_path)
    finally:
        server.stop()
        _stop(worker)
    print(f"\nrequest to cancelled, woken by NOTIFY: {latency * 1000:.0f} ms (lease 30 s)")


def test_a_write_in_flight_when_the_request_comes_goes_to_review(
    pg: PostgresStore, pg_server: Any, pg_schema: str, tmp_path: Path
) -> None:
    """The request comes while a write is in flight (its effect in the ledger, its answer
    not back): the call is interrupted and may have happened, so the run stops in
    ``review_required/outcome_unknown`` (R6), the cancel transition naming who asked."""
    key = _admin(pg)
    ledger = tmp_path / "ledger.jsonl"
    fleet_app.make_runtime(pg).submit(fleet_app.plan("r1", "unkeyed"), run_id="r1")
    worker = _worker(pg_server, pg_schema, tmp_path, 3.0, 1.2)
    server = LiveServer(pg).start()
    try:
        _wait(lambda: fleet_app.ledger(str(ledger)), 40, "the write never took effect")
        with _client(server, key) as c:
            r = c.post("/api/runs/r1/cancel", json={"note": "stop now"})
            assert r.status_code == 202, r.text
        _wait(lambda: _state(pg, "r1")[0] != "executing", 10, "the worker did not stop it")
        assert _state(pg, "r1") == ("review_required", "outcome_unknown")
        cancel = _the_cancel(pg, "r1")
        assert (cancel["by"], cancel["dest"]) == ("root", "review_required")
        assert [e["tool"] for e in fleet_app.ledger(str(ledger))] == ["notify"]  # once
        _checks(server, key, "r1", tmp_path)
    finally:
        server.stop()
        out = _stop(worker)
    assert "finished run r1: review_required/outcome_unknown" in out, out


def test_after_sigkill_the_next_worker_honours_the_request_at_once(
    pg: PostgresStore, pg_server: Any, pg_schema: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The request is stored, then the worker driving the run is killed (SIGKILL) before
    it could honour it (stopped first, SIGSTOP: neither its heartbeat nor the request's
    NOTIFY can reach it): the next worker takes the run over at once (its owner's process
    is gone) and stops it before asking the model or a tool."""
    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "0.001")
    key = _admin(pg)
    fleet_app.make_runtime(pg).submit(fleet_app.plan("r1", "read"), run_id="r1")
    doomed = _worker(pg_server, pg_schema, tmp_path, 8.0, 30.0)
    server = LiveServer(pg).start()
    try:
        _wait(lambda: _claimed(pg), 30, "no worker claimed the run")
        doomed.send_signal(signal.SIGSTOP)
        with _client(server, key) as c:
            r = c.post("/api/runs/r1/cancel", json={"note": "after the crash too"})
            assert r.status_code == 202, r.text
        time.sleep(0.3)  # (the NOTIFY is queued for a process that cannot read it)
        doomed.kill()
        doomed.communicate()
        killed = time.monotonic()
        assert _state(pg, "r1")[0] not in ("cancelled", "done")
        runtime = fleet_app.make_runtime(pg)
        asked_model: list[int] = []
        model = runtime.model

        async def counting(messages: Any, specs: Any) -> Any:
            asked_model.append(1)
            return await model(messages, specs)

        runtime.model = counting
        worker = Worker(runtime, concurrency=1, poll_s=0.2)

        async def drive() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            while not await asyncio.to_thread(lambda: _state(pg, "r1")[0] == "cancelled"):
                assert time.monotonic() - killed < 20, "the next worker did not cancel it"
                await asyncio.sleep(0.05)
            stop.set()
            await task

        asyncio.run(drive())
        assert time.monotonic() - killed < 5, "the dead worker's lease was waited out"
        assert worker.counts.claimed == 1 and asked_model == []
        cancel = _the_cancel(pg, "r1")
        assert (cancel["by"], cancel["note"]) == ("root", "after the crash too")
        _checks(server, key, "r1", tmp_path)
    finally:
        server.stop()
        if doomed.poll() is None:
            doomed.kill()
            doomed.communicate()


def test_schema_migrations_add_the_cancel_request(tmp_path: Path, pg_server: Any) -> None:
    """A SQLite file of schema 5 and a PostgreSQL schema of version 4 are migrated (their
    runs kept, cancellable by request); read-only, the old file says it needs migrating."""
    import sqlite3

    import psycopg

    from fsm_agent._durable import pg_schema
    from fsm_agent._durable import sqlite as sqlite_store
    from fsm_agent._errors import StoreError

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for step in sqlite_store._MIGRATIONS[:5]:
            conn.executescript(step)
        conn.execute(f"PRAGMA application_id = {sqlite_store.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 5")
    with pytest.raises(StoreError, match="schema version 5 needs migrating"):
        SqliteStore(path, readonly=True)
    with SqliteStore(path) as store:
        make_runtime([say("x")], Backend(), store=store).submit("hi", run_id="old")
        store.claim("old", "someone-else:1")
        assert store.request_cancel("old", CancelRequest("2026-01-01T00:00:00Z")) is not None
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION == 6

    schema = "t_cancel_migration"
    s = f'"{schema}"'
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        conn.execute(f"CREATE SCHEMA {s}")
        for step in pg_schema.MIGRATIONS[:4]:
            conn.execute(step.replace("{s}", s))
        conn.execute(f"INSERT INTO {s}.meta VALUES ('application', 'fsm-agent'), "
                     "('schema_version', '4')")  # fmt: skip
    try:
        with pytest.raises(StoreError, match="schema version 4 needs migrating"):
            PostgresStore(pg_server.dsn, schema=schema, readonly=True)
        with PostgresStore(pg_server.dsn, schema=schema) as store:
            make_runtime([say("x")], Backend(), store=store).submit("hi", run_id="old")
            asked = CancelRequest("2026-01-01T00:00:00Z", "root")
            assert store.request_cancel("old", asked) == asked
            assert store.load_run("old").cancel_request == asked
        assert pg_schema.SCHEMA_VERSION == 5
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")


def test_an_unreadable_stored_request_is_a_corrupt_record(tmp_path: Path) -> None:
    import sqlite3

    from fsm_agent._errors import CorruptRecord

    with SqliteStore(tmp_path / "runs.db") as store:
        make_runtime([say("x")], Backend(), store=store).submit("hi", run_id="r1")
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        conn.execute("UPDATE runs SET cancel = '{\"by\": 3}'")
    with (
        SqliteStore(tmp_path / "runs.db") as store,
        pytest.raises(CorruptRecord, match="run 'r1': the stored cancel request"),
    ):
        store.load_run("r1")


def test_a_worker_drains_a_run_that_finishes_while_it_reports(tmp_path: Path) -> None:
    """A worker told to stop just as its last run ended (a run cancelled a moment before
    SIGTERM) crashed with ``ValueError: Set of Tasks/Futures is empty``: the run finished
    while the drain reported the worker's state, and ``asyncio.wait`` got no task."""

    class Queue(MemoryStore):
        def claim_next(self, owner: str, skip: tuple[str, ...] = ()) -> None:
            return None

    worker = Worker(make_runtime([say("x")], Backend(), store=Queue()), concurrency=1)

    async def scenario() -> None:
        finishing = asyncio.create_task(asyncio.sleep(0))
        worker._active[finishing] = object()
        finishing.add_done_callback(worker._active.pop)

        async def report(*, force: bool = False) -> None:
            await finishing  # the run ends while the report is under way

        worker._report = report  # type: ignore[method-assign]
        await worker._drain()

    asyncio.run(scenario())
    assert worker._active == {}
