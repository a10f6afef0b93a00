"""``fsm-agent runs``: list, show, approve/deny/reconcile (record only), export, and a
precise one-line error with a defined exit code for every bad input."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import read_trace
from fsm_agent._cli import main
from fsm_agent._durable.sqlite import SCHEMA_VERSION, SqliteStore
from fsm_agent._trace.checker import check_events

WRITE = {"request_id": "R-1", "title": "A17 is late"}


def runs(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["runs", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def db(tmp_path: Path, backend: Backend) -> Path:
    """A file with a run paused for approval (r1) and a finished one (r2)."""
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        make_runtime(
            [
                calls(call("c1", "write", **WRITE), call("c2", "lookup", order_id="A")),
                say("Filed."),
            ],
            backend,
            store=store,
            approval=True,
        ).run("file it", run_id="r1")
        make_runtime([say("Hello.")], backend, store=store).run("hi", run_id="r2")
    return path


def resume(path: Path, backend: Backend) -> Any:
    """What the application does after a reviewer used the CLI."""
    with SqliteStore(path) as store:
        rt = make_runtime([say("Filed.")], backend, store=store, approval=True)
        return rt.resume("r1")


def test_list_and_filter(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = runs(capsys, "list", "--db", str(db))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "PENDING", "UPDATED"]
    assert lines[1].split()[:3] == ["r2", "done/final_answer", "0"]
    assert lines[2].split()[:3] == ["r1", "review_required/approval_required", "2"]
    code, out, _ = runs(capsys, "list", "--db", str(db), "--status", "review_required", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [(r["run_id"], r["pending"]) for r in rows] == [("r1", 2)]
    code, out, _ = runs(capsys, "list", "--db", str(db), "--status", "budget_exhausted")
    assert (code, out) == (0, "no runs in state budget_exhausted\n")


def test_list_columns_line_up_whatever_the_cells_hold(
    tmp_path: Path, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.db"
    ids = ["a", "a-much-longer-run-id-than-the-others", "注文-42", "tab\there", "e\u0301t\u00e9"]
    with SqliteStore(path) as store:
        for run_id in ids:
            make_runtime([say("Hello.")], backend, store=store).run("hi", run_id=run_id)
        make_runtime(
            [calls(call("c1", "write", **WRITE))], backend, store=store, approval=True
        ).run("file it", run_id="x")
    code, out, _ = runs(capsys, "list", "--db", str(path))
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 1 + len(ids) + 1  # a header, one line per run, none split

    def starts(line: str) -> list[int]:
        """Display columns where each cell after the first begins."""
        from fsm_agent._cli.runs import _width

        cols, col, prev = [], 0, "x"
        for i, c in enumerate(line):
            if prev == " " and line[i - 2 : i] == "  " and c != " ":
                cols.append(col)
            col += _width(c)
            prev = c
        return cols

    assert len({tuple(starts(line)) for line in lines}) == 1, out
    assert "tab\\there" in out  # escaped, not a tab that breaks the row


def test_show_prints_state_pending_calls_and_last_events(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = runs(capsys, "show", "--db", str(db), "r1", "--events", "2")
    assert code == 0
    assert out.startswith("run r1: review_required/approval_required\n")
    assert "  detail: c1 (write) needs approval\n" in out
    assert "c1  write  " in out and "waiting for approval_required" in out
    assert "c2  lookup  " in out and "waiting for skipped_pending_review" in out
    assert "last 2 events:" in out and "run_end review_required/approval_required" in out
    code, out, _ = runs(capsys, "show", "--db", str(db), "r1", "--json")
    shown = json.loads(out)
    assert [p["call_id"] for p in shown["pending"]] == ["c1", "c2"]
    assert shown["events"][-1]["type"] == "run_end"


def test_approve_records_and_the_application_resumes(
    db: Path, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = runs(capsys, "approve", "--db", str(db), "r1", "c1")
    assert code == 0 and "recorded approve of c1 in run r1" in out
    assert "continues when the application resumes it" in out
    assert backend.writes == []  # the CLI runs nothing
    _, out, _ = runs(capsys, "show", "--db", str(db), "r1")
    assert "[recorded: approve]" in out
    done = resume(db, backend)
    assert (done.status, done.answer) == ("done", "Filed.") and backend.writes == [WRITE]


def test_a_review_records_who_decided_when_and_why(
    db: Path, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = runs(
        capsys, "approve", "--db", str(db), "r1", "c1", "--by", "ana", "--note", "R-1 checked"
    )
    assert code == 0 and "recorded approve of c1 in run r1 by ana" in out
    with SqliteStore(db) as store:
        events = store.load_run("r1").events
    transition, review = events[-2:]
    assert (transition["trigger"], transition["source"], transition["dest"]) == (
        "review", "review_required", "review_required",
    )  # fmt: skip
    assert transition["guards"] == {"review_fits": True}
    assert (review["type"], review["reviewer"], review["note"]) == ("review", "ana", "R-1 checked")
    stamped = datetime.fromisoformat(review["at"].replace("Z", "+00:00"))
    assert stamped.utcoffset() == timedelta(0)
    assert abs((datetime.now(timezone.utc) - stamped).total_seconds()) < 60
    code, _, err = runs(capsys, "deny", "--db", str(db), "r1", "c2", "--reason", "x", "--by", " ")
    assert code == 2 and "the review's reviewer must be a non-empty string" in err


def test_deny_and_reconcile_record_their_payload(
    db: Path, backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = runs(capsys, "deny", "--db", str(db), "r1", "c1", "--reason", "not today")
    assert code == 0
    done = resume(db, backend)
    assert done.status == "done" and backend.writes == []
    assert {"ok": False, "error": "denied", "detail": "not today"} in [
        json.loads(m["content"]) for m in done.messages if m["role"] == "tool"
    ]

    backend.fail_writes.append((RuntimeError("connection reset"), True))
    with SqliteStore(db) as store:
        make_runtime(
            [calls(call("c1", "write", **{**WRITE, "request_id": "R-9"})), say("Filed.")],
            backend,
            store=store,
        ).run("again", run_id="r3")
    code, out, _ = runs(
        capsys, "reconcile", "--db", str(db), "r3", "c1", "--result", '{"ticket": "T-9"}',
        "--by", "bo",
    )  # fmt: skip
    assert code == 0, out
    code, out, _ = runs(capsys, "export", "--db", str(db), "r3")
    events = [json.loads(line) for line in out.splitlines()]
    link = events[-1].pop("chain")  # the review event is chained onto the stored trace
    assert isinstance(link, str) and len(link) == 32
    assert events[-1] == {
        "type": "review",
        "action": "reconcile",
        "call_id": "c1",
        "tool": "write",
        "result": {"ticket": "T-9"},
        "reviewer": "bo",
        "at": events[-1]["at"],
        "seq": len(events) - 1,
        "run": "r3",
    }


def test_export_writes_a_trace_that_reads_back(
    db: Path, backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs(capsys, "approve", "--db", str(db), "r1", "c1")
    resume(db, backend)
    out_file = tmp_path / "r1.jsonl"
    code, out, _ = runs(capsys, "export", "--db", str(db), "r1", "-o", str(out_file))
    assert code == 0 and out.startswith("wrote ")
    events = read_trace(out_file)
    assert events[0]["type"] == "run_start" and events[-1]["status"] == "done"
    assert check_events(events) == []
    assert main(["check", str(out_file)]) == 0  # the trace checker accepts a resumed run


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["show", "r9"], 2, "fsm-agent runs: no run 'r9' in "),
        (["approve", "r1", "c9"], 2, "call 'c9' is not pending in run 'r1' (pending: c1, c2)"),
        (["approve", "r1", "c2"], 2, "approve does not apply (use deny)"),
        (["reconcile", "r1", "c1", "--result", "1"], 2, "reconcile does not apply"),
        (
            ["reconcile", "r2", "c1", "--result", "1"],
            2,
            "run 'r2' is done/final_answer, not waiting for review",
        ),
    ],
)
def test_bad_review_input(
    db: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    before = db.read_bytes()
    got, out, err = runs(capsys, argv[0], "--db", str(db), *argv[1:])
    assert got == code and message in err and err.count("\n") == 1 and out == ""
    assert "Traceback" not in err
    with SqliteStore(db) as store:
        assert not any(e["type"] == "review" for e in store.load_run("r1").events)
    assert len(db.read_bytes()) == len(before)


@pytest.mark.parametrize(
    "argv",
    [
        ["reconcile", "r1", "c1", "--result", "{bad"],
        ["reconcile", "r1", "c1", "--result", "NaN"],
        ["show", "r1", "--events", "-1"],
        ["list", "--status", "finished"],
        ["list", "--timeout", "soon"],
        ["deny", "r1", "c1"],  # --reason is required
    ],
)
def test_bad_usage_exits_2(db: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["runs", argv[0], "--db", str(db), *argv[1:]])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_unreadable_databases_exit_2(
    tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = runs(capsys, "list", "--db", str(tmp_path / "missing.db"))
    assert code == 2 and "missing.db: no such database" in err
    assert not (tmp_path / "missing.db").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"junk" * 1000)
    code, _, err = runs(capsys, "list", "--db", str(junk))
    assert code == 2 and "not an SQLite database or corrupt" in err
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    code, _, err = runs(capsys, "show", "--db", str(db), "r1")
    assert code == 2 and "is newer than this fsm-agent supports" in err


def test_a_run_driven_elsewhere_exits_1(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SqliteStore(db) as store:
        store.claim("r1", f"{socket.gethostname()}:{os.getppid()}:app")
    code, _, err = runs(capsys, "approve", "--db", str(db), "r1", "c1")
    assert code == 1 and "is being driven by" in err


def test_a_locked_database_exits_2(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        code, _, err = runs(capsys, "approve", "--db", str(db), "--timeout", "0.1", "r1", "c1")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert code == 2 and "locked by another process (waited 0.1s)" in err
