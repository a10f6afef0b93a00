"""``fsm-agent keys`` and the refusals of ``fsm-agent serve`` (the server itself is
tested through HTTP in test_server_api.py)."""

from __future__ import annotations

import json
import sqlite3
import zlib
from pathlib import Path

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._cli import main
from fsm_agent._durable.feed import parse_key
from fsm_agent._durable.sqlite import SqliteStore


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-1", title="t")), say("ok")],
            Backend(),
            store=store,
            approval=True,
        )
        rt.run("go", run_id="r1")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_keys_add_shows_the_key_once_and_list_never(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "keys", "add", "alice", "--scope", "review", "--db", db)
    assert code == 0 and "shown once" in err
    key = out.strip()
    parsed = parse_key(key)
    assert parsed is not None
    code, out, _ = run(capsys, "keys", "list", "--db", db)
    assert code == 0 and "alice" in out and "review" in out and "active" in out
    assert parsed[1] not in out
    with SqliteStore(db) as store:
        (record,) = store.list_keys()
        assert parsed[1] not in (record.digest, record.salt)
    code, _, err = run(capsys, "keys", "add", "alice", "--scope", "read", "--db", db)
    assert code == 2 and "a key named 'alice' exists" in err
    code, out, _ = run(capsys, "keys", "revoke", "alice", "--db", db)
    assert code == 0 and "revoked" in out
    code, out, _ = run(capsys, "keys", "list", "--db", db)
    assert "revoked" in out
    code, _, err = run(capsys, "keys", "revoke", "alice", "--db", db)
    assert code == 1 and "no active key named 'alice'" in err


def test_bad_key_input_is_one_line(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "keys", "add", "a b", "--scope", "read", "--db", db)
    assert code == 2 and "key name 'a b'" in err
    missing = str(tmp_path / "nope.db")
    code, _, err = run(capsys, "keys", "add", "bob", "--scope", "read", "--db", missing)
    assert code == 2 and "no such database" in err and err.startswith("fsm-agent keys: ")


def test_serve_refuses_to_listen_beyond_loopback_with_no_keys(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "serve", "--db", db, "--host", "0.0.0.0", "--port", "1")
    assert code == 2 and "refusing to listen on 0.0.0.0 with no API keys" in err
    code, _, err = run(capsys, "serve", "--db", db, "--app", "nope", "--port", "1")
    assert code == 2 and "--app must be MODULE:FUNCTION" in err
    assert err.startswith("fsm-agent serve: ")


def test_the_demo_writes_a_database_that_serves_its_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make demo`` then ``fsm-agent serve --db traces/demo.db``: the demo's runs over
    HTTP, their traces checked, and a second demo replaces the runs but keeps the keys."""
    import httpx
    from server_harness import LiveServer

    from fsm_agent._trace.checker import check_bytes

    db = str(tmp_path / "demo.db")
    code, out, _ = run(capsys, "demo", "--quiet", "--db", db)
    assert code == 0 and f"fsm-agent serve --db {db}" in out
    code, key, _ = run(capsys, "keys", "add", "me", "--scope", "review", "--db", db)
    assert code == 0
    with SqliteStore(db) as store:
        server = LiveServer(store).start()
        try:
            auth = {"authorization": f"Bearer {key.strip()}"}
            with httpx.Client(base_url=server.url, headers=auth, timeout=10) as c:
                runs = {r["run_id"]: r for r in c.get("/api/runs?limit=50").json()["runs"]}
                assert len(runs) == 8 and runs["demo-happy"]["status"] == "done"
                assert runs["demo-denied"]["label"] == "waiting for review"
                assert runs["demo-lost_write"]["reason"] == "outcome_unknown"
                (pending,) = c.get("/api/runs/demo-denied").json()["pending"]
                assert pending["tool"] == "create_ticket" and pending["digest"]
                for run_id in runs:
                    report = check_bytes(c.get(f"/api/runs/{run_id}/trace").content)
                    assert report.violations == [] and report.lines > 2, run_id
                body = {"call_id": pending["call_id"], "action": "deny", "reason": "no"}
                assert c.post("/api/runs/demo-denied/reviews", json=body).status_code == 201
        finally:
            server.stop()
    code, _, _ = run(capsys, "demo", "--quiet", "--db", db)
    assert code == 0
    with SqliteStore(db) as store:
        assert [k.name for k in store.list_keys()] == ["me"]  # the key survived
        events = store.load_run("demo-denied").events
        assert not [e for e in events if e["type"] == "review"]  # the runs are new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.db"]


def test_the_demo_replaces_its_own_database_written_by_an_older_fsm_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The last `make demo` before an upgrade left a file of an older schema: the next one
    # replaces it (its key kept) instead of refusing it as "not a database the demo wrote".
    db = str(tmp_path / "demo.db")
    assert run(capsys, "demo", "--quiet", "--db", db)[0] == 0
    assert run(capsys, "keys", "add", "me", "--scope", "review", "--db", db)[0] == 0
    conn = sqlite3.connect(db, isolation_level=None)
    try:  # schema 4 kept one event a row, with no count column
        rows = conn.execute("SELECT key, type, body FROM events ORDER BY key").fetchall()
        conn.execute("DELETE FROM events")
        conn.execute("ALTER TABLE events DROP COLUMN n")
        conn.execute("ALTER TABLE runs DROP COLUMN cancel")  # (schema 6's)
        for key, kind, body in rows:
            for i, line in enumerate(body.split("\n")):
                conn.execute("INSERT INTO events (key, type, body, sum) VALUES (?, ?, ?, ?)",
                             (key + i, kind, line, zlib.crc32(line.encode())))  # fmt: skip
        conn.execute("PRAGMA user_version = 4")
    finally:
        conn.close()
    code, _, err = run(capsys, "demo", "--quiet", "--db", db)
    assert (code, err) == (0, "")
    with SqliteStore(db, readonly=True) as store:
        assert [k.name for k in store.list_keys()] == ["me"]
        assert store.load_run("demo-denied").events[0]["type"] == "run_start"


def test_the_demo_never_replaces_a_database_of_other_runs(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = Path(db).read_bytes()
    code, _, err = run(capsys, "demo", "--quiet", "--db", db)
    assert code == 2
    refusal = f"demo: --db {db}: it holds runs that are not the demo's (r1); pick another file"
    assert err == refusal + "\n"
    assert Path(db).read_bytes() == before


def test_runs_cancel_takes_the_cancel_edge_or_says_why_not(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with SqliteStore(db) as store:
        make_runtime([say("hi")], store=store).submit("hello", run_id="q1")
    code, out, _ = run(capsys, "runs", "cancel", "q1", "--db", db)
    assert code == 0 and out.startswith("cancelled run q1 (cancelled/cancelled)")
    code, _, err = run(capsys, "runs", "cancel", "q1", "--db", db)
    assert code == 2 and "is cancelled/cancelled: it has ended, nothing to cancel" in err
    code, _, err = run(capsys, "runs", "cancel", "r1", "--db", db)  # paused for review
    assert code == 2 and "waiting for review: deny its pending calls" in err
    code, _, err = run(capsys, "runs", "cancel", "nope", "--db", db)
    assert code == 2 and "nope" in err
    with SqliteStore(db) as store:
        assert store.load_run("r1").body["state"] == "review_required"
        events = store.load_run("q1").events
    assert [e["type"] for e in events] == ["run_start", "transition", "run_end"]


def test_runs_cancel_of_a_run_a_driver_holds_stores_a_request_for_it(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Held by a live driver, the run is not cancelled from the shell: a request is
    stored for that driver (the next one honours it at once), and the command says so."""
    from fsm_agent._durable import owners

    with SqliteStore(db) as store:
        make_runtime([say("hi")], store=store).submit("hello", run_id="q1")
        driver = owners.new_owner()
        owners.hold(driver)
        store.claim("q1", driver)
    try:
        code, out, _ = run(capsys, "runs", "cancel", "q1", "--db", db, "--by", "ops")
    finally:
        owners.drop(driver)
    assert code == 0 and out.startswith("cancel requested for run q1 by ops at "), out
    assert "its driver stops it at its next step" in out
    with SqliteStore(db) as store:
        asked = store.load_run("q1").cancel_request
        assert store.load_run("q1").events == []  # nothing recorded yet
    assert asked is not None and asked.by == "ops"
    code, out, _ = run(capsys, "runs", "show", "q1", "--db", db)
    assert code == 0 and f"  cancel requested by ops at {asked.at} (its driver" in out, out
    code, out, _ = run(capsys, "runs", "show", "q1", "--db", db, "--json")
    assert json.loads(out)["cancel_requested"] == {"by": "ops", "at": asked.at}


def test_runs_cancel_records_by_and_note_in_the_trace_and_check_passes(
    db: str, tmp_path: Path
) -> None:
    """``fsm-agent runs cancel --by --note`` (a process of its own, as an operator runs
    it): the ``cancel`` transition names who and why, with the time, and the exported
    trace passes ``fsm-agent check``."""
    import subprocess
    import sys

    with SqliteStore(db) as store:
        make_runtime([say("hi")], store=store).submit("hello", run_id="q1")

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fsm_agent", *argv], capture_output=True, text=True
        )

    bad = cli("runs", "cancel", "q1", "--db", db, "--by", " ")
    assert bad.returncode == 2 and "the cancel's by must be a non-empty string" in bad.stderr
    done = cli("runs", "cancel", "q1", "--db", db, "--by", "ops", "--note", "duplicate order")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cancelled run q1 (cancelled/cancelled) by ops\n"
    with SqliteStore(db) as store:
        events = store.load_run("q1").events
    (cancel,) = [e for e in events if e["type"] == "transition"]
    assert (cancel["trigger"], cancel["by"], cancel["note"]) == ("cancel", "ops", "duplicate order")
    assert cancel["at"].endswith("Z")
    trace = tmp_path / "q1.jsonl"
    exported = cli("runs", "export", "q1", "--db", db, "-o", str(trace))
    assert exported.returncode == 0, exported.stderr
    checked = cli("check", str(trace))
    assert checked.returncode == 0, checked.stdout + checked.stderr
