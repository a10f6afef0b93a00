"""PostgresStore on a real server: what only PostgreSQL has (its schema, its faults), and
``fsm-agent runs``/``fsm-agent worker`` against it. Every bad input or fault is one line
(a ``StoreError``; exit 2 from the CLI), never a traceback, with nothing changed.

The store protocol itself (runs, claims, intents, reviews) is checked for every store by
the parametrised suite in ``test_durable_store.py`` and ``test_durable_resume.py``."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._cli import main
from fsm_agent._durable.audit import audit_run
from fsm_agent._durable.pg_schema import SCHEMA_VERSION
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._errors import ConfigError, CorruptRecord, StoreError
from fsm_agent._trace.chain import strip_links
from fsm_agent._trace.checker import check_events

WRITE = {"request_id": "R-1", "title": "A17 is late"}


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


def sql(server: Any, statement: str, params: Any = None) -> Any:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def paused(store: Any, backend: Backend, run_id: str = "r1") -> Any:
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE), call("c2", "lookup", order_id="A")), say("Filed.")],
        backend,
        store=store,
        approval=True,
    )
    assert rt.run("file it", run_id=run_id).status == "review_required"
    return rt


# ── opening ───────────────────────────────────────────────────────────────────────


def test_a_new_schema_is_created_marked_and_reopened(pg_server: Any, pg_schema: str) -> None:
    with PostgresStore(pg_server.dsn, schema=pg_schema):
        pass
    meta = dict(sql(pg_server, f'SELECT key, value FROM "{pg_schema}".meta'))
    assert meta == {"application": "fsm-agent", "schema_version": str(SCHEMA_VERSION)}
    with PostgresStore(pg_server.dsn, schema=pg_schema) as again:
        assert again.list_runs() == []


@pytest.mark.parametrize(
    ("dsn", "expect"),
    [
        ("postgresql://x@[bad", "not a valid PostgreSQL DSN"),
        ("", "an empty PostgreSQL DSN"),
        ("postgresql://nobody@/postgres?host=/nonexistent-dir", "connection failed or lost"),
    ],
)
def test_a_wrong_dsn_is_one_line(dsn: str, expect: str) -> None:
    with pytest.raises(StoreError, match=expect) as info:
        PostgresStore(dsn, timeout=1)
    one_line(info.value)


def test_a_missing_database_and_a_missing_schema(pg_server: Any, pg_schema: str) -> None:
    dsn = pg_server.dsn.replace("/postgres?", "/no_such_db?")
    with pytest.raises(StoreError, match='database "no_such_db" does not exist') as info:
        PostgresStore(dsn)
    one_line(info.value)
    for options in ({"create": False}, {"readonly": True}):
        with pytest.raises(StoreError, match=f"no fsm-agent schema '{pg_schema}'"):
            PostgresStore(pg_server.dsn, schema=pg_schema, **options)
    assert not sql(pg_server, "SELECT 1 FROM pg_namespace WHERE nspname = %s", [pg_schema])
    with pytest.raises(ConfigError, match="lower-case SQL identifier"):
        PostgresStore(pg_server.dsn, schema='x"; DROP TABLE y; --')


def test_a_newer_schema_is_refused_with_nothing_changed(pg_server: Any, pg_schema: str) -> None:
    PostgresStore(pg_server.dsn, schema=pg_schema).close()
    sql(pg_server, f"UPDATE \"{pg_schema}\".meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(
        StoreError,
        match=f"schema version 99 is newer than this fsm-agent supports \\({SCHEMA_VERSION}\\)",
    ):
        PostgresStore(pg_server.dsn, schema=pg_schema)
    assert sql(
        pg_server, f"SELECT value FROM \"{pg_schema}\".meta WHERE key = 'schema_version'"
    ) == [("99",)]


def test_another_programs_schema_is_never_written_into(pg_server: Any, pg_schema: str) -> None:
    sql(pg_server, f'CREATE SCHEMA "{pg_schema}"')
    sql(pg_server, f'CREATE TABLE "{pg_schema}".customers (id int)')
    with pytest.raises(
        StoreError, match=f"schema '{pg_schema}' is not fsm-agent's \\(it holds 1 other"
    ):
        PostgresStore(pg_server.dsn, schema=pg_schema)
    sql(pg_server, f'CREATE TABLE "{pg_schema}".meta (key text, value text)')
    sql(pg_server, f"INSERT INTO \"{pg_schema}\".meta VALUES ('application', 'billing')")
    with pytest.raises(StoreError, match="its meta table names 'billing'"):
        PostgresStore(pg_server.dsn, schema=pg_schema)
    tables = sql(
        pg_server, "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", [pg_schema]
    )
    assert tables == [("customers",), ("meta",)]


def test_workers_starting_together_create_the_schema_once(pg_server: Any, pg_schema: str) -> None:
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            PostgresStore(pg_server.dsn, schema=pg_schema).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ── faults while running ──────────────────────────────────────────────────────────


def test_a_statement_timeout_is_one_line_with_nothing_stored(
    pg_server: Any, pg_schema: str, backend: Backend
) -> None:
    with PostgresStore(pg_server.dsn, schema=pg_schema, statement_timeout_s=0.2) as store:
        rt = paused(store, backend)
        before = store.load_run("r1")
        with psycopg.connect(pg_server.dsn) as other:  # holds the run's row: a long lock
            other.execute(f'SELECT 1 FROM "{pg_schema}".runs WHERE run_id = %s FOR UPDATE', ["r1"])
            with pytest.raises(
                StoreError, match=r"ran past the statement timeout \(0.2s\)"
            ) as info:
                rt.approve("r1", "c1", resume=True)
            one_line(info.value)
            other.rollback()
        after = store.load_run("r1")
        assert (after.snapshot, after.events) == (before.snapshot, before.events)
        assert (
            rt.approve("r1", "c1", resume=True).status == "done"
        )  # and works once the lock is gone


def test_a_connection_cut_mid_statement_is_one_line_and_the_next_call_works(
    pg_server: Any, pg_schema: str, backend: Backend
) -> None:
    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        rt = paused(store, backend)
        before = store.load_run("r1")
        with psycopg.connect(pg_server.dsn) as other:  # the approval's claim waits on this

            def cut() -> None:  # then an operator (or a network cut) kills the waiting one
                while not sql(
                    pg_server,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "application_name = 'fsm-agent' AND wait_event_type = 'Lock'",
                ):
                    pass

            other.execute(f'SELECT 1 FROM "{pg_schema}".runs WHERE run_id = %s FOR UPDATE', ["r1"])
            killer = threading.Thread(target=cut)
            killer.start()
            with pytest.raises(StoreError, match="closed the connection") as info:
                rt.approve("r1", "c1", resume=True)
            killer.join()
            one_line(info.value)
            other.rollback()
        after = store.load_run("r1")
        assert (after.snapshot, after.events, backend.writes) == (
            before.snapshot,
            before.events,
            [],
        )
        assert rt.approve("r1", "c1", resume=True).status == "done" and backend.writes == [WRITE]


def test_a_damaged_row_is_an_error_never_a_silent_change(
    pg_server: Any, pg_schema: str, backend: Backend
) -> None:
    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        rt = paused(store, backend)
        sql(
            pg_server,
            f"UPDATE \"{pg_schema}\".messages SET body = replace(body, 'file it', 'file IT')",
        )
        with pytest.raises(CorruptRecord, match="history row 0 of run 'r1' fails its checksum"):
            rt.resume("r1")
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            sql(pg_server, f'UPDATE "{pg_schema}".events SET body = body')


def test_sink_and_store_hold_identical_bytes_and_a_review_continues_the_chain(
    pg_server: Any, pg_schema: str, backend: Backend, tmp_path: Path
) -> None:
    """What ``test_trace_integrity.py`` checks on SQLite: PostgreSQL keeps the driver's
    chained lines verbatim, and a signed run resumed on approval extends its chain."""
    key = b"audit-key-0123456789"
    trace = tmp_path / "r1.jsonl"
    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        script = [calls(call("c1", "write", **WRITE)), say("Filed.")]
        rt = make_runtime(script, backend, store=store, approval=True, trace_key=key)
        assert rt.run("file it", run_id="r1", trace=trace).status == "review_required"
        rows = sql(pg_server, f'SELECT e.body FROM "{pg_schema}".events e ORDER BY e.num, e.seq')
        assert [r[0] for r in rows] == trace.read_text("utf-8").splitlines()
        done = rt.approve("r1", "c1", resume=True)
        assert done.status == "done" and backend.writes == [WRITE]
        stored = store.load_run("r1").events
        assert strip_links(stored) == done.events
        assert check_events(stored, key=key) == []
        assert audit_run(store, "r1", key=key).ok


# ── the command line ──────────────────────────────────────────────────────────────


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_commands_on_postgres(
    pg_server: Any,
    pg_schema: str,
    backend: Backend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--db", pg_server.dsn, "--schema", pg_schema]
    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        paused(store, backend, "r1")
        paused(store, backend, "r2")
        make_runtime([say("Hello.")], backend, store=store).run("hi", run_id="r3")
    code, out, _ = cli(capsys, "runs", "list", *db, "--status", "review_required")
    assert code == 0 and re.search(r"^r1\s+review_required/approval_required", out, re.M)
    assert "r3" not in out
    code, out, _ = cli(capsys, "runs", "show", *db, "r1")
    assert code == 0 and "c1  write" in out and "waiting for approval_required" in out
    code, out, _ = cli(capsys, "runs", "approve", *db, "r1", "c1")
    assert code == 0 and "recorded approve of c1 in run r1" in out and "a worker" in out
    code, out, _ = cli(capsys, "runs", "deny", *db, "r2", "c1", "--reason", "no")
    assert code == 0
    code, _, err = cli(capsys, "runs", "reconcile", *db, "r2", "c1", "--result", "1")
    assert code == 2 and "was already denied" in err and err.count("\n") == 1
    code, out, _ = cli(capsys, "runs", "export", *db, "r1", "-o", str(tmp_path / "r1.jsonl"))
    assert code == 0 and main(["check", str(tmp_path / "r1.jsonl")]) == 0
    events = [json.loads(line) for line in (tmp_path / "r1.jsonl").read_text().splitlines()]
    assert check_events(events) == [] and events[-1]["type"] == "review"
    code, out, _ = cli(capsys, "runs", "prune", *db, "--older-than", "0s")
    assert code == 0 and "pruned 1 finished runs" in out
    code, out, _ = cli(capsys, "worker", "--status", *db)
    assert code == 0 and "review_required" in out and "workers (0)" in out


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["runs", "list", "--db", "postgresql://x@[bad"], "not a valid PostgreSQL DSN"),
        (
            [
                "runs",
                "show",
                "r1",
                "--db",
                "postgresql://nobody@/db?host=/nonexistent",
                "--timeout",
                "1",
            ],
            "connection failed or lost",
        ),
        (["worker", "--status", "--db", "postgresql://x@[bad"], "not a valid PostgreSQL DSN"),
        (["worker", "--db", "runs.db", "--app", "x:y"], "--db must be a postgresql:// DSN"),
    ],
)
def test_bad_databases_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], expect: str
) -> None:
    code, _, err = cli(capsys, *argv)
    assert code == 2 and expect in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_app_exits_2(
    pg_server: Any, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--db", pg_server.dsn, "--schema", pg_schema]
    for app, expect in [
        ("nowhere_module:make", "cannot load --app nowhere_module:make"),
        ("fleet_app", "--app must be MODULE:FUNCTION"),
        ("fleet_app:KINDS", "is not a function"),
        ("fleet_app:plan", "missing"),
    ]:
        code, _, err = cli(capsys, "worker", *db, "--app", app)
        assert code == 2 and err.count("\n") == 1, err
        assert expect in err or app.endswith(":plan"), err
    code, _, err = cli(capsys, "worker", *db)
    assert code == 2 and "--app MODULE:FUNCTION is required" in err


def test_a_factory_that_takes_no_store_is_refused_up_front(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused with the signature it needs before any store is opened (the DSN names no
    server: a refusal after connecting would be a connection error) or it is called."""
    db = ["--db", "postgresql://nobody@/db?host=/nonexistent"]
    code, _, err = cli(capsys, "worker", *db, "--app", "fleet_app:make_runtime_of_its_own")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "has the signature make_runtime_of_its_own() -> " in err
    assert "def make_runtime_of_its_own(store): return Runtime(..., store=store)" in err


def test_store_objects_racing_on_one_key_run_it_once(pg_server: Any, pg_schema: str) -> None:
    """The race of ``test_safety_concurrency.py`` (every key raced by three runtimes at
    once, an independent ledger) with one PostgresStore object per runtime: the atomic
    compare-and-set is the server's, shared by every worker."""
    from test_safety_concurrency import _runtime, assert_once, race

    ledger: list[str] = []
    stores = [PostgresStore(pg_server.dsn, schema=pg_schema) for _ in range(3)]
    try:
        outcomes = race([_runtime(s, ledger.append) for s in stores], "pg")
    finally:
        for s in stores:
            s.close()
    assert_once(ledger, outcomes, 3)
