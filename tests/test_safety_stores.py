"""Stores keep the error contract and their memory bounds (issue "Every safety promise
holds", items 10 and 11): a full disk, a lock held by another process and damaged rows
are each a ``StoreError`` naming the cause, never a silent change; a long-lived process
stays bounded; old runs can be pruned, never one waiting for review."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import IdempotencyRecord, MemoryStore, Runtime, ScriptedModel
from fsm_agent._cli import main
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import StoreError

WRITE = {"request_id": "R-1", "title": "refund"}
TRIALS = 200  # random single-bit flips of a store file


_RUNTIMES: dict[int, Runtime] = {}


def _runtime(store: Any) -> Runtime:
    """One runtime per store (building tools compiles schemas: keep it out of loops)."""
    if id(store) not in _RUNTIMES or _RUNTIMES[id(store)].store is not store:
        _RUNTIMES[id(store)] = make_runtime([], Backend(), store=store, approval=True)
    return _RUNTIMES[id(store)]


def paused(store: Any, run_id: str = "r1") -> None:
    model = ScriptedModel([calls(call("w1", "write", **WRITE))])
    assert _runtime(store).run("x", run_id=run_id, model=model).status == "review_required"


def finished(store: Any, run_id: str) -> None:
    model = ScriptedModel([say("ok")])
    assert _runtime(store).run("x", run_id=run_id, model=model).status == "done"


# ── 10. the error contract ────────────────────────────────────────────────────────


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 384 KiB tmpfs (root only): a disk that fills up."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=384k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_a_store_error_naming_the_cause(small_disk: Path) -> None:
    store = SqliteStore(small_disk / "runs.db")
    big = "x" * 20_000
    seen: list[str] = []
    for n in range(200):
        try:
            make_runtime([say(big)], store=store).run("x", run_id=f"r{n}")
        except StoreError as exc:
            seen.append(str(exc))
            break
    assert seen, "the disk never filled up"
    assert "the disk is full" in seen[0] and str(small_disk) in seen[0]
    assert "cannot rollback" not in seen[0]  # the first cause, not a follow-on error
    stored = store.list_runs()  # what was committed is intact and readable
    assert all(store.load_run(r.run_id).run_id == r.run_id for r in stored)


def test_a_lock_held_by_another_process_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        paused(store)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with SqliteStore(path, timeout=0.2) as store:
            before = store.load_run("r1").snapshot  # reading works while it is held
            rt = make_runtime([say("ok")], store=store, approval=True)
            with pytest.raises(StoreError, match=r"locked by another process \(waited 0.2s\)"):
                rt.approve("r1", "w1", resume=True)
            assert store.load_run("r1").snapshot == before
    finally:
        holder.kill()
        holder.wait()


def _rows(path: Path) -> Any:
    with SqliteStore(path, readonly=True) as store:
        return [store.load_run(r.run_id) for r in sorted(store.list_runs(),
                                                         key=lambda r: r.run_id)]  # fmt: skip


def test_bit_flips_are_detected_never_read_back_silently(tmp_path: Path) -> None:
    """Single-byte damage anywhere in the file: every read either fails with a
    ``StoreError`` or returns exactly what was stored."""
    original = tmp_path / "runs.db"
    with SqliteStore(original) as store:
        paused(store, "r1")
        finished(store, "r2")
    expected = _rows(original)
    data = original.read_bytes()
    rng = random.Random(11)
    outcomes = {"error": 0, "same": 0}
    for trial in range(TRIALS):
        damaged = tmp_path / f"d{trial % 4}.db"
        flipped = bytearray(data)
        at = rng.randrange(len(flipped))
        flipped[at] ^= 1 << rng.randrange(8)
        damaged.write_bytes(bytes(flipped))
        for side in (".db-wal", ".db-shm"):
            Path(str(damaged)[:-3] + side).unlink(missing_ok=True)
        try:
            got = _rows(damaged)
        except StoreError:
            outcomes["error"] += 1
            continue
        assert got == expected, f"byte {at} changed what was read back"
        outcomes["same"] += 1
    assert outcomes["error"] > 0 and sum(outcomes.values()) == TRIALS


# ── 11. bounded memory ────────────────────────────────────────────────────────────


def test_a_memory_store_stays_bounded_and_keeps_runs_waiting_for_review() -> None:
    store = MemoryStore(max_runs=50)
    for n in range(5):
        paused(store, f"p{n}")
    for n in range(2000):
        finished(store, f"r{n}")
    runs = {r.run_id for r in store.list_runs()}
    assert len(runs) == 50 and {f"p{n}" for n in range(5)} <= runs
    assert f"r{1999}" in runs and "r0" not in runs  # the oldest finished ones went


def test_a_memory_store_full_of_paused_runs_refuses_new_ones_clearly() -> None:
    store = MemoryStore(max_runs=3)
    for n in range(3):
        paused(store, f"p{n}")
    with pytest.raises(StoreError, match="3 runs are running or waiting for review"):
        finished(store, "new")
    assert len(store.list_runs()) == 3  # none of the paused runs was dropped


def test_forgetting_a_finished_run_costs_the_same_however_many_are_paused() -> None:
    def seconds(paused_runs: int) -> float:
        store = MemoryStore(max_runs=paused_runs + 20)
        for n in range(paused_runs):
            paused(store, f"p{n}")
        for n in range(40):
            finished(store, f"w{n}")  # fill the finished slots
        start = time.perf_counter()
        for n in range(200):
            finished(store, f"r{n}")  # each forgets one
        return time.perf_counter() - start

    small, large = seconds(10), seconds(2000)
    # O(1) eviction: 200x more paused runs must not make forgetting 200x slower (0.1
    # scanned them all). A generous bound, for a shared machine.
    assert large < small * 5, (small, large)


def test_idempotency_records_have_a_lifetime_and_pending_ones_are_kept() -> None:
    store = MemoryStore(max_intents=10, intent_ttl_s=0.0)
    store.begin_intent(IdempotencyRecord("w", "pending", "d", "pending", "r0", "c0"))
    for n in range(50):
        record = IdempotencyRecord("w", f"K{n}", "d", "pending", "r1", f"c{n}")
        store.begin_intent(record)
        store.commit_intent("w", f"K{n}", record.owner, {"n": n})
    kept = [n for n in range(50) if store.get_intent("w", f"K{n}") is not None]
    assert kept == list(range(40, 50))  # the 10 newest committed records
    assert store.get_intent("w", "pending") is not None  # a pending one is never dropped
    young = MemoryStore(max_intents=10)  # within their lifetime, nothing is dropped
    for n in range(20):
        young.begin_intent(IdempotencyRecord("w", f"K{n}", "d", "pending", "r1", f"c{n}"))
        young.commit_intent("w", f"K{n}", ("r1", f"c{n}"), n)
    assert all(young.get_intent("w", f"K{n}") is not None for n in range(20))


def test_prune_deletes_finished_runs_and_never_one_waiting_for_review(
    tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        paused(store, "waiting")
        for n in range(5):
            finished(store, f"r{n}")
        size_before = len(store._read("SELECT 1 FROM events"))
    assert main(["runs", "prune", "--db", str(path), "--older-than", "0s"]) == 0
    assert "pruned 5 finished runs" in capsys.readouterr().out
    with SqliteStore(path) as store:
        assert [r.run_id for r in store.list_runs()] == ["waiting"]
        assert len(store._read("SELECT 1 FROM events")) < size_before
        assert store.load_run("waiting").body["state"] == "review_required"
    with pytest.raises(SystemExit) as bad:
        main(["runs", "prune", "--db", str(path), "--older-than", "7x"])
    assert bad.value.code == 2 and "an age like 7d" in capsys.readouterr().err


def test_read_commands_never_write(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        paused(store)
    before = path.read_bytes()
    assert main(["runs", "list", "--db", str(path)]) == 0
    assert main(["runs", "show", "r1", "--db", str(path)]) == 0
    assert main(["runs", "export", "r1", "--db", str(path), "-o", str(tmp_path / "t.jsonl")]) == 0
    assert path.read_bytes() == before
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert main(["runs", "list", "--db", str(empty)]) == 2
    assert empty.read_bytes() == b""  # a zero-length file gets no schema written into it
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    assert main(["runs", "list", "--db", str(other)]) == 2
