"""The stores behind durable runs: schema, migration, claims, and every bad input
(a newer schema, a corrupt, foreign or locked file, an unknown run, a review that does
not fit) giving a clear error with nothing changed in the store."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import IdempotencyRecord, JsonlTrace, MemoryStore
from fsm_agent._durable import owners
from fsm_agent._durable.review import record_review
from fsm_agent._durable.sqlite import APPLICATION_ID, SCHEMA_VERSION, SqliteStore
from fsm_agent._durable.store import Checkpoint, IntentClaim, RunSave
from fsm_agent._errors import (
    CorruptRecord,
    IntentConflict,
    MachineMismatch,
    ReviewError,
    RunBusy,
    RunExists,
    RunNotFound,
    StoreError,
)

WRITE = {"request_id": "R-1", "title": "A17 is late"}


def paused_run(store: Any, backend: Backend, *, fail: bool = False) -> Any:
    """A run stopped for review: approval required, or (``fail``) an unknown outcome."""
    if fail:
        backend.fail_writes.append((RuntimeError("connection reset"), True))
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE), call("c2", "lookup", order_id="A")), say("Filed.")],
        backend,
        store=store,
        approval=not fail,
    )
    result = rt.run("file it", run_id="r1")
    assert result.status == "review_required"
    return rt


def snapshot(store: Any, run_id: str = "r1") -> Any:
    stored = store.load_run(run_id)
    return (stored.snapshot, stored.messages, stored.events)


# ── opening a file ────────────────────────────────────────────────────────────────


def test_a_new_file_gets_the_current_schema_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path):
        pass
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with SqliteStore(path) as again:
        assert again.list_runs() == []


def test_an_empty_file_is_refused_not_initialised(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"")
    for options in ({}, {"readonly": True}, {"create": False}):
        with pytest.raises(StoreError, match="an empty file, not an fsm-agent database"):
            SqliteStore(path, **options)
    assert path.read_bytes() == b""


def test_read_only_opening_never_writes(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        paused_run(store, backend)
    before = path.read_bytes()
    with SqliteStore(path, readonly=True) as store:
        assert [r.run_id for r in store.list_runs()] == ["r1"]
        assert store.load_run("r1").run_id == "r1"
        with pytest.raises(StoreError, match="opened read-only"):
            record_review(store, "r1", "c1", "approve")
    # (SQLite may leave its -wal/-shm side files: a WAL reader needs them.)
    assert path.read_bytes() == before


def _unchanged_after(path: Path, expect: str, **options: Any) -> None:
    before = path.read_bytes()
    with pytest.raises(StoreError, match=expect) as info:
        SqliteStore(path, **options)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path):
        pass
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    _unchanged_after(
        path,
        f"schema version {SCHEMA_VERSION + 1} is newer than this "
        f"fsm-agent supports \\({SCHEMA_VERSION}\\)",
    )


def test_a_corrupt_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"this is not a database at all\n" * 200)
    _unchanged_after(path, "not an SQLite database or corrupt")


def test_another_programs_database_is_not_written_into(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER)")
    _unchanged_after(path, "not an fsm-agent database")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such database"):
        SqliteStore(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(StoreError, match="is a directory"):
        SqliteStore(tmp_path)


def test_a_locked_file_times_out_with_nothing_changed(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path, timeout=0.2) as store:
        rt = paused_run(store, backend)
        before = snapshot(store)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process is writing
        try:
            started = time.monotonic()
            with pytest.raises(StoreError, match=r"locked by another process \(waited 0.2s\)"):
                rt.approve("r1", "c1", resume=True)
            assert time.monotonic() - started < 5
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert snapshot(store) == before
        assert (
            rt.approve("r1", "c1", resume=True).status == "done"
        )  # and works once the lock is gone


# ── runs and claims ───────────────────────────────────────────────────────────────


def test_unknown_run_ids(store: Any, backend: Backend) -> None:
    rt = make_runtime([say("hi")], backend, store=store)
    for attempt in (
        lambda: rt.resume("nope"),
        lambda: rt.approve("nope", "c1", resume=True),
        lambda: rt.deny("nope", "c1", "no", resume=True),
        lambda: store.load_run("nope"),
    ):
        with pytest.raises(RunNotFound, match="no run 'nope'"):
            attempt()
    assert store.list_runs() == []


def test_a_run_id_cannot_be_stored_twice(store: Any, backend: Backend, tmp_path: Path) -> None:
    rt = make_runtime([say("hi"), say("again")], backend, store=store)
    rt.run("hi", run_id="r1")
    trace = JsonlTrace(tmp_path / "again.jsonl")
    with pytest.raises(RunExists, match="already stored"):
        rt.run("hi", run_id="r1", trace=trace)
    assert trace._file is None  # the caller's sink is closed, not leaked
    assert len(store.load_run("r1").events) == len(rt.resume("r1").events)


def test_list_filters_by_state(store: Any, backend: Backend) -> None:
    paused_run(store, backend)
    make_runtime([say("hi")], backend, store=store).run("hi", run_id="r2")
    assert {r.run_id for r in store.list_runs()} == {"r1", "r2"}
    (paused,) = store.list_runs("review_required")
    assert (paused.run_id, paused.reason, paused.pending) == ("r1", "approval_required", 2)
    assert [r.run_id for r in store.list_runs("done")] == ["r2"]


@pytest.mark.parametrize(
    ("action", "call_id", "expect"),
    [
        ("approve", "c9", "call 'c9' is not pending in run 'r1' \\(pending: c1, c2\\)"),
        (
            "approve",
            "c2",
            "waiting for skipped_pending_review: approve does not apply \\(use deny\\)",
        ),
        ("reconcile", "c1", "waiting for approval_required: reconcile does not apply"),
        ("escalate", "c1", "unknown review action 'escalate'"),
    ],
)
def test_a_review_that_does_not_fit_changes_nothing(
    store: Any, backend: Backend, action: str, call_id: str, expect: str
) -> None:
    paused_run(store, backend)
    before = snapshot(store)
    with pytest.raises(ReviewError, match=expect):
        record_review(store, "r1", call_id, action, result={"ticket": "T-1"})
    assert snapshot(store) == before


def test_an_unknown_outcome_takes_reconcile_or_deny_not_approve(
    store: Any, backend: Backend
) -> None:
    rt = paused_run(store, backend, fail=True)
    before = snapshot(store)
    with pytest.raises(ReviewError, match="use deny or reconcile"):
        rt.approve("r1", "c1", resume=True)
    with pytest.raises(ReviewError, match="must be JSON data"):
        rt.reconcile("r1", "c1", {"when": object()}, resume=True)
    assert snapshot(store) == before
    rt.reconcile("r1", "c1", {"ticket": "T-1"}, resume=True)
    with pytest.raises(ReviewError, match="is done/final_answer, not waiting for review"):
        rt.reconcile("r1", "c1", {"ticket": "T-1"}, resume=True)


def test_a_decision_is_recorded_once(store: Any, backend: Backend) -> None:
    other = {"request_id": "R-2", "title": "B"}
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE), call("c2", "write", **other))],
        backend,
        store=store,
        approval=True,
    )
    rt.run("file both", run_id="r1")
    rt.approve("r1", "c1", resume=True)
    before = snapshot(store)
    with pytest.raises(ReviewError, match="was already approved"):
        rt.deny("r1", "c1", "changed my mind", resume=True)
    assert snapshot(store) == before


def _owner_of(pid: int, start: str | None = None) -> str:
    """An owner token of process ``pid`` on this host and boot (``owners.py``)."""
    host, boot, _, _ = owners._this_process()
    return "|".join((host, boot, str(pid), start or owners._start_time(pid), "test"))


def test_a_run_driven_by_a_live_process_is_busy(tmp_path: Path, backend: Backend) -> None:
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = paused_run(store, backend)
        alive = _owner_of(os.getppid())  # our parent: alive
        store.claim("r1", alive)
        before = snapshot(store)
        with pytest.raises(RunBusy, match=f"being driven by {alive}"):
            rt.approve("r1", "c1", resume=True)
        assert snapshot(store) == before


def test_a_claim_of_a_dead_process_or_an_expired_lease_is_taken_over(
    tmp_path: Path, backend: Backend
) -> None:
    with SqliteStore(tmp_path / "runs.db", lease_s=0.0) as store:
        rt = paused_run(store, backend)
        store.claim("r1", _owner_of(999999999, "1"))  # no such pid
        record_review(store, "r1", "c1", "approve")
        # The same pid, started at another time: a container's PID 1 after a restart.
        store.claim("r1", _owner_of(os.getpid(), "12345"))
        record_review(store, "r1", "c2", "deny", reason="not now")
        store.claim("r1", "elsewhere|boot|1|2|x")  # another host; lease_s=0: expired
        assert rt.resume("r1").status == "done"


def test_a_process_that_lost_its_claim_stops_writing(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "runs.db"

    def steal(messages: list[dict[str, Any]]) -> dict[str, Any]:
        with sqlite3.connect(path) as db:  # someone else took the run over meanwhile
            db.execute("UPDATE runs SET owner = 'elsewhere|b|1|2|x', lease_until = 1e12")
        return say("done")

    with SqliteStore(path) as store:
        rt = make_runtime([steal], backend, store=store)
        with pytest.raises(RunBusy, match="taken over by elsewhere\\|b\\|1\\|2\\|x"):
            rt.run("hi", run_id="r1")
        assert store.load_run("r1").body["state"] == "deciding"


# ── idempotency records behave the same in both stores ─────────────────────────────


def test_idempotency_records(store: Any) -> None:
    pending = IdempotencyRecord("write", "R-1", "d1", "pending", "r1", "c1")
    assert store.begin_intent(pending) == IntentClaim(True, None)
    assert store.begin_intent(pending) == IntentClaim(True, pending)  # ours again: a retry
    other = IdempotencyRecord("write", "R-1", "d1", "pending", "r2", "c1")
    assert store.begin_intent(other) == IntentClaim(False, pending)  # pending elsewhere
    assert store.begin_intent(other, take_over=True) == IntentClaim(True, pending)  # dedup
    assert store.begin_intent(pending) == IntentClaim(False, other)
    conflict = IdempotencyRecord("write", "R-1", "d2", "pending", "r3", "c1")
    assert store.begin_intent(conflict, take_over=True) == IntentClaim(False, other)
    store.commit_intent("write", "R-1", ("r2", "c1"), {"ticket": "T-1"})
    record = store.get_intent("write", "R-1")
    assert (record.status, record.result, record.owner) == (
        "committed",
        {"ticket": "T-1"},
        ("r2", "c1"),
    )
    assert store.begin_intent(pending, take_over=True) == IntentClaim(False, record)
    store.abort_intent("write", "R-1", ("r2", "c1"))  # a committed record is never forgotten
    assert store.get_intent("write", "R-1") == record
    store.begin_intent(IdempotencyRecord("write", "R-2", "d", "pending", "r1", "c2"))
    store.abort_intent("write", "R-2", ("r9", "c2"))  # not the owner: nothing happens
    assert store.get_intent("write", "R-2") is not None
    store.abort_intent("write", "R-2", ("r1", "c2"))
    assert store.get_intent("write", "R-2") is None
    with pytest.raises(IntentConflict, match="no pending intent"):
        store.commit_intent("write", "R-3", ("r1", "c1"), 1)


def test_a_memory_store_forgets_its_oldest_finished_runs(backend: Backend) -> None:
    store = MemoryStore(max_runs=3)
    paused_run(store, backend)  # r1 waits for review: kept
    for n in range(2, 7):
        make_runtime([say("hi")], backend, store=store).run("hi", run_id=f"r{n}")
    assert sorted(r.run_id for r in store.list_runs()) == ["r1", "r5", "r6"]
    with pytest.raises(RunNotFound):
        store.load_run("r2")


def test_a_checkpoint_this_version_cannot_read_is_refused(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        rt = paused_run(store, backend)
        with sqlite3.connect(path) as db:
            snap = json.loads(db.execute("SELECT ctx FROM runs").fetchone()[0])
        snap["body"]["taken"] = "validate/validating->nowhere"
        snap["checksum"] = _resum(snap["body"])
        _write_ctx(path, snap)
        before = snapshot(store)
        with pytest.raises(CorruptRecord, match=r"unreadable checkpoint .* no edge of this table"):
            rt.resume("r1")
        assert snapshot(store) == before
        snap["body"]["taken"] = "validate/validating->executing"
        snap["checksum"] = _resum(snap["body"])
        snap["machine_hash"] = "sha256:0000000000000000"  # layout 3: on the envelope
        _write_ctx(path, snap)
        with pytest.raises(MachineMismatch, match="checkpointed by machine sha256:0000"):
            rt.resume("r1")
        _write_ctx(path, {})
        with pytest.raises(CorruptRecord, match="not a state snapshot"):
            rt.resume("r1")
        assert snapshot(store)[1:] == before[1:]


def _resum(body: dict[str, Any]) -> str:
    from fsm_agent._core.state import _checksum

    return _checksum(body)


def _write_ctx(path: Path, snap: dict[str, Any]) -> None:
    """Rewrite the checkpoint row as a tool outside fsm-agent would (row checksum kept
    valid, so only the snapshot's own checks can object)."""
    text = json.dumps(snap)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET ctx = ?, sum = ?", (text, zlib.crc32(text.encode())))


def test_a_damaged_row_is_an_error_never_a_silent_change(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        rt = paused_run(store, backend)
        with sqlite3.connect(path) as db:
            body = db.execute("SELECT body FROM messages ORDER BY key LIMIT 1").fetchone()[0]
            db.execute(
                "UPDATE messages SET body = ? WHERE body = ?",
                (body.replace("file it", "file IT"), body),
            )
        with pytest.raises(CorruptRecord, match="history row 0 of run 'r1' fails its checksum"):
            rt.resume("r1")


@contextmanager
def taken_over(store: Any, backend: Backend) -> Iterator[tuple[str, str]]:
    """A paused run ``r1`` that driver ``gone`` claimed and then lost to ``holder``:
    yields ``(gone, holder)``; ``holder`` lets go afterwards."""
    paused_run(store, backend)
    gone, holder = owners.new_owner(), owners.new_owner()
    store.claim("r1", gone)
    store.release("r1", gone)
    owners.hold(holder)
    store.claim("r1", holder)  # another driver took the run over
    try:
        yield gone, holder
    finally:
        owners.let_go(store, "r1", holder)


def test_a_driver_that_lost_its_claim_begins_commits_and_aborts_no_intent(
    store: Any, backend: Backend
) -> None:
    with taken_over(store, backend) as (gone, holder):
        mine = IdempotencyRecord("write", "R-7", "d", "pending", "r1", "c1")
        with pytest.raises(RunBusy):
            store.begin_intent(mine, fence=("r1", gone))
        assert store.get_intent("write", "R-7") is None
        assert store.begin_intent(mine, fence=("r1", holder)).owned
        stale_ops: list[Callable[[], Any]] = [
            lambda: store.commit_intent("write", "R-7", ("r1", "c1"), 1, fence=("r1", gone)),
            lambda: store.abort_intent("write", "R-7", ("r1", "c1"), fence=("r1", gone)),
        ]
        for stale in stale_ops:
            with pytest.raises(RunBusy):
                stale()
        assert store.get_intent("write", "R-7").status == "pending"
        with pytest.raises(RunNotFound):
            store.begin_intent(mine, fence=("nope", holder))


def test_a_save_riding_on_an_intent_is_fenced_with_it(store: Any, backend: Backend) -> None:
    """A keyed write's checkpoint rides in its intent's transaction (one statement on
    PostgreSQL): a driver that lost the run writes neither; the holder writes both."""
    with taken_over(store, backend) as (gone, holder):
        before = snapshot(store)
        stored_snapshot, _, events = before
        event = {"type": "note", "seq": events[-1]["seq"] + 1, "text": "the checkpoint"}
        moved = {**stored_snapshot, "marker": "saved with the intent"}
        mine = IdempotencyRecord("write", "R-9", "d", "pending", "r1", "c1")

        def save(owner: str) -> RunSave:
            return RunSave("r1", owner, [event], Checkpoint(moved))

        with pytest.raises(RunBusy):
            store.begin_intent(mine, fence=("r1", gone), save=save(gone))
        assert store.get_intent("write", "R-9") is None
        assert snapshot(store) == before  # no event, no checkpoint

        assert store.begin_intent(mine, fence=("r1", holder), save=save(holder)).owned
        assert store.get_intent("write", "R-9").status == "pending"
        after_snapshot, _, after_events = snapshot(store)
        assert after_snapshot["marker"] == "saved with the intent"
        assert after_events[-1]["text"] == "the checkpoint"
