"""A durable round on SQLite commits as few times as the D rules allow
(``docs/concepts/durable-runs.md``, "What a round must wait for"), and what rides behind
is as safe as what was committed on its own.

Commits are counted for real, from the statements the store's connection runs. What
goes behind — a write's result, a batch of reads' checkpoint, a keyless write's result —
goes into the driving's next transaction, first: a lost claim refuses it and that
transaction both, a commit that commits nothing rolls the transaction back, and a
process killed before it was stored resumes to ``outcome_unknown``, never to a second
run. The WAL is checkpointed on a thread of its own, so no round waits for its fsync."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import call, calls, say
from round_kinds import SCHEMA, resume_after_kill
from round_kinds import round_script as _script
from round_kinds import round_tools as _tools

from fsm_agent import Budget, Runtime, ScriptedModel
from fsm_agent._core.requests import IdempotencyRecord
from fsm_agent._durable import sqlite as sqlite_store
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._durable.store import Checkpoint
from fsm_agent._errors import CorruptRecord, IntentConflict, RunBusy

ROOT = Path(__file__).resolve().parent.parent


def _commits(
    store: SqliteStore, kind: tuple[str, ...], rounds: int, statements: list[str] | None = None
) -> int:
    statements = [] if statements is None else statements
    store._conn.set_trace_callback(statements.append)
    try:
        runtime = Runtime(
            model=ScriptedModel(_script(kind, rounds)),
            tools=_tools(),
            allowed_tools={"read", "keyed", "keyless"},
            store=store,
            budget=Budget(
                max_tool_rounds=rounds, max_model_calls=rounds + 1, max_total_calls=2 * rounds
            ),
        )
        result = runtime.run("go")
    finally:
        store._conn.set_trace_callback(None)
    assert (result.status, result.reason) == ("done", "final_answer"), result.detail
    return sum(s == "COMMIT" for s in statements)


@pytest.mark.parametrize(
    ("kind", "most"),
    [
        # A read needs nothing durable: its batch's checkpoint rides behind, and waits
        # behind one other, or more within 50 ms (so a run of reads commits at most every
        # second reply; this one, whose model answers at once, hardly ever).
        (("read",), 0.5),
        # A keyed write: its intent, carrying the reply's checkpoint and the previous
        # round's result; its own result rides behind.
        (("keyed",), 1.0),
        (("read", "keyed"), 1.0),
        # A keyless write: the checkpoint that marks its attempt; its result behind.
        (("keyless",), 1.0),
    ],
)
def test_a_round_commits_the_fewest_times(
    tmp_path: Path, kind: tuple[str, ...], most: float
) -> None:
    with SqliteStore(tmp_path / "runs.db") as store:
        short, long = _commits(store, kind, 2), _commits(store, kind, 8)
    per_round = (long - short) / 6
    # (Before: 1, 2, 2 and 2 commits a round.)
    assert per_round <= most, (kind, short, long)
    # The run itself: its creation, and its last checkpoint that lets the claim go
    # (before: a third, the release).
    assert short - 2 * per_round <= 2, (kind, short, long)


def test_a_review_pauses_decides_and_resumes_in_few_commits(tmp_path: Path) -> None:
    tools = _tools()
    tools.register(
        lambda i: {"approved": i},
        name="gated",
        effect="write",
        idempotency_key=lambda a: a["i"],
        requires_approval=True,
        schema=SCHEMA,
    )
    with SqliteStore(tmp_path / "runs.db") as store:
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)

        def runtime(script: list[Any]) -> Runtime:
            return Runtime(
                model=ScriptedModel(script), tools=tools, allowed_tools={"gated"}, store=store
            )

        def commits() -> int:
            n = statements.count("COMMIT")
            statements.clear()
            return n

        paused = runtime([calls(call("g1", "gated", i="x")), say("done")]).run("go", run_id="r")
        assert paused.status == "review_required"
        pause = commits()
        runtime([]).approve("r", "g1", by="ana")
        decision = commits()
        assert runtime([say("done")]).resume("r").status == "done"
        resumed = commits()
        store._conn.set_trace_callback(None)
    # The run's creation and its pause (which lets the claim go); the claim, and the
    # decision that lets it go; the claim, the approved write's intent (carrying the
    # resume's checkpoint), the answer that lets it go. (Before: 3, 3 and 6.)
    assert (pause, decision, resumed) == (2, 2, 3)


def test_a_decision_on_the_version_its_decider_read_commits_once(tmp_path: Path) -> None:
    from fsm_agent._durable.review import record_review

    tools = _tools()
    tools.register(
        lambda i: {"approved": i},
        name="gated",
        effect="write",
        idempotency_key=lambda a: a["i"],
        requires_approval=True,
        schema=SCHEMA,
    )
    with SqliteStore(tmp_path / "runs.db") as store:
        statements: list[str] = []
        counted = {}
        for way in ("seen", "unseen"):
            rt = Runtime(
                model=ScriptedModel([calls(call("g1", "gated", i=way)), say("done")]),
                tools=tools,
                allowed_tools={"gated"},
                store=store,
            )
            assert rt.run("go", run_id=way).status == "review_required"
            view = store.load_run(way)
            store._conn.set_trace_callback(statements.append)
            record_review(store, way, "g1", "approve", seen=view if way == "seen" else None)
            store._conn.set_trace_callback(None)
            counted[way] = statements.count("COMMIT")
            statements.clear()
            assert store.load_run(way).body["reviews"]["g1"]["action"] == "approve"
    # Judged on the view, written in one transaction that checks the run is still it:
    # 1. Without a view: the claim, then the decision that lets it go: 2.
    assert counted == {"seen": 1, "unseen": 2}


# ── what rides behind is fenced and atomic ────────────────────────────────────────


def _record(run_id: str, key: str) -> IdempotencyRecord:
    return IdempotencyRecord("keyed", key, "d" * 64, "pending", run_id, "c1", None, "write", False)


def _checkpoint(state: str) -> Checkpoint:
    return Checkpoint({"body": {"state": state}})


def _event(seq: int) -> dict[str, Any]:
    return {"seq": seq, "type": "transition"}


def _started(store: SqliteStore, run_id: str, owner: str) -> None:
    store.create_run(run_id, {"run": run_id}, owner, [_event(1)], _checkpoint("deciding"))
    claim = store.begin_intent(_record(run_id, f"{run_id}-k"), fence=(run_id, owner))
    assert claim.owned


def _raw(store: SqliteStore, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """What another process sees (or does) in the file: a connection of its own."""
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with SqliteStore(tmp_path / "runs.db") as s:
        yield s


def test_a_result_behind_goes_with_the_next_checkpoint_in_one_commit(
    store: SqliteStore,
) -> None:
    _started(store, "r1", "A")
    store.commit_intent_behind("keyed", "r1-k", ("r1", "c1"), {"ok": 1}, fence=("r1", "A"))
    store.save_behind("r1", "A", [_event(2)], _checkpoint("observing"))
    # Nothing was committed: what is durable is what the store answers.
    assert _raw(store, "SELECT status FROM idempotency") == [("pending",)]
    found = store.get_intent("keyed", "r1-k")
    assert found is not None and found.status == "pending"
    assert [e["seq"] for e in store.load_run("r1").events] == [1]
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    store.save("r1", "A", [_event(3)], _checkpoint("deciding"))
    store._conn.set_trace_callback(None)
    assert statements.count("COMMIT") == 1
    found = store.get_intent("keyed", "r1-k")
    assert found is not None and (found.status, found.result) == ("committed", {"ok": 1})
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1, 2, 3]
    assert stored.body["state"] == "deciding"


def test_a_checkpoint_behind_is_stored_by_the_next_intent_or_release(
    store: SqliteStore,
) -> None:
    _started(store, "r1", "A")
    store.save_behind("r1", "A", [_event(2)], _checkpoint("observing"))
    # A begin without a checkpoint of its own: the one behind is the run's checkpoint.
    store.begin_intent(_record("r1", "r1-other"), fence=("r1", "A"))
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1, 2] and stored.body["state"] == "observing"
    store.save_behind("r1", "A", [_event(3)], _checkpoint("executing"))
    store.release("r1", "A")
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1, 2, 3] and stored.body["state"] == "executing"
    assert _raw(store, "SELECT owner FROM runs") == [(None,)]


def test_a_checkpoint_waits_behind_one_other_once_that_one_is_old(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "_BEHIND_S", 0.0)  # every checkpoint is "old"
    _started(store, "r1", "A")
    store.save_behind("r1", "A", [_event(2)], _checkpoint("observing"))
    assert [e["seq"] for e in store.load_run("r1").events] == [1]  # the first one waits
    store.save_behind("r1", "A", [_event(3)], _checkpoint("deciding"))
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1, 2, 3] and stored.body["state"] == "deciding"


def test_checkpoints_queued_within_the_window_wait_together_up_to_a_bound(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A model that answers at once: a commit would be most of its round.)
    monkeypatch.setattr(sqlite_store, "_BEHIND_S", 3600.0)
    monkeypatch.setattr(sqlite_store, "_BEHIND_MOST", 3)
    _started(store, "r1", "A")
    for seq in (2, 3, 4):
        store.save_behind("r1", "A", [_event(seq)], _checkpoint(f"s{seq}"))
    assert [e["seq"] for e in store.load_run("r1").events] == [1]
    store.save_behind("r1", "A", [_event(5)], _checkpoint("s5"))  # three wait: all go in
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1, 2, 3, 4, 5] and stored.body["state"] == "s5"


def test_a_new_claim_drops_what_an_earlier_driving_left_behind(store: SqliteStore) -> None:
    # A driving of this process that stopped (killed, in a test) with a result behind:
    # the run's next driver does not store it (its fence would refuse it anyway).
    _started(store, "r1", "A")
    store.commit_intent_behind("keyed", "r1-k", ("r1", "c1"), {"ok": 1}, fence=("r1", "A"))
    _raw(store, "UPDATE runs SET owner = NULL")
    store.claim("r1", "B")
    store.save("r1", "B", [_event(2)], _checkpoint("observing"))
    store.release("r1", "A")  # (the old driving's own release: nothing left to store)
    assert [e["seq"] for e in store.load_run("r1").events] == [1, 2]
    found = store.get_intent("keyed", "r1-k")
    assert found is not None and found.status == "pending"


def test_a_lost_claim_refuses_what_rides_behind_and_the_transaction_it_rides_with(
    store: SqliteStore,
) -> None:
    _started(store, "r1", "A")
    store.commit_intent_behind("keyed", "r1-k", ("r1", "c1"), {"ok": 1}, fence=("r1", "A"))
    # Another process takes the run over (A stalled past its lease).
    _raw(store, "UPDATE runs SET owner = 'B'")
    with pytest.raises(RunBusy, match="taken over by B"):
        store.save("r1", "A", [_event(2)], _checkpoint("observing"))
    assert _raw(store, "SELECT status FROM idempotency") == [("pending",)]
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1] and stored.body["state"] == "deciding"
    # A checkpoint behind is refused the same way, with what it went with.
    store.save_behind("r1", "A", [_event(2)], _checkpoint("observing"))
    with pytest.raises(RunBusy):
        store.begin_intent(_record("r1", "r1-other"), fence=("r1", "A"))
    assert store.get_intent("keyed", "r1-other") is None
    assert [e["seq"] for e in store.load_run("r1").events] == [1]


def test_a_commit_behind_that_commits_nothing_rolls_its_transaction_back(
    store: SqliteStore,
) -> None:
    _started(store, "r1", "A")
    store.commit_intent_behind("keyed", "r1-k", ("r1", "c1"), {"ok": 1}, fence=("r1", "A"))
    _raw(store, "DELETE FROM idempotency")  # gone meanwhile
    with pytest.raises(IntentConflict, match="no pending intent for 'keyed' key 'r1-k'"):
        store.save("r1", "A", [_event(2)], _checkpoint("observing"))
    stored = store.load_run("r1")
    assert [e["seq"] for e in stored.events] == [1] and stored.body["state"] == "deciding"


def test_a_reconciled_intent_behind_is_dropped_and_the_rest_goes(store: SqliteStore) -> None:
    _started(store, "r1", "A")
    # A reviewer committed it already (reconcile): the commit behind has nothing to do.
    store.commit_intent("keyed", "r1-k", ("r1", "c1"), {"observed": 1})
    store.commit_intent_behind("keyed", "r1-k", ("r1", "c1"), {"ok": 1}, fence=("r1", "A"))
    store.save("r1", "A", [_event(2)], _checkpoint("observing"))
    found = store.get_intent("keyed", "r1-k")
    assert found is not None and found.result == {"observed": 1}
    assert [e["seq"] for e in store.load_run("r1").events] == [1, 2]


def test_a_checkpoint_behind_is_encoded_when_it_is_queued(store: SqliteStore) -> None:
    # The loop goes on changing what a checkpoint refers to (its lists and dicts): the
    # one that waits behind is stored as it was when the loop handed it over.
    _started(store, "r1", "A")
    body: dict[str, Any] = {"state": "observing", "executed": [1]}
    message = {"role": "tool", "content": "first"}
    store.save_behind("r1", "A", [_event(2)], Checkpoint({"body": body}, [(1, message)]))
    body["executed"].append(2)
    message["content"] = "changed"
    store.begin_intent(_record("r1", "r1-other"), fence=("r1", "A"))
    stored = store.load_run("r1")
    assert stored.body["executed"] == [1]
    assert stored.messages[-1]["content"] == "first"


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from fsm_agent import Runtime, ToolRegistry
    from fsm_agent._durable.sqlite import SqliteStore

    db, ledger = sys.argv[1:]
    tools = ToolRegistry()

    def write(i: str) -> dict:
        with open(ledger, "a") as f:
            f.write(i + "\\n")
        return {"written": i}

    tools.register(write, name="write", effect="write", idempotency_key=lambda a: a["i"],
                   schema={"type": "object", "properties": {"i": {"type": "string"}}})
    asked = []

    def model(messages, specs):
        asked.append(1)
        if len(asked) == 2:  # the write returned; its result is behind, not yet stored
            os.kill(os.getpid(), signal.SIGKILL)
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "write", "arguments": '{"i": "K"}'}}]}

    store = SqliteStore(db)
    Runtime(model=model, tools=tools, allowed_tools={"write"}, store=store).run("go", run_id="r1")
    """
)


def test_killed_before_a_result_behind_was_stored_resumes_to_outcome_unknown(
    tmp_path: Path,
) -> None:
    ledger, db = tmp_path / "ledger", tmp_path / "runs.db"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(db), str(ledger)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert ledger.read_text().split() == ["K"]
    with SqliteStore(db) as store:
        resume_after_kill(store, ledger)


# ── the WAL is checkpointed off the rounds ─────────────────────────────────────────


def test_the_wal_is_checkpointed_on_a_thread_of_its_own_when_the_commits_pause(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        statements: list[str] = []
        commits = _commits(store, ("keyed",), 120, statements)  # > 100, far under 1000 pages
        assert commits > 100
        # The run's commits never checkpoint themselves (SQLite's default would, at
        # 1000 pages; this connection only past 4000, where the thread cannot keep up).
        assert not [s for s in statements if "checkpoint" in s]
        # Once the commits pause, the thread copies the log into the database file: a
        # copy of that file alone, without its WAL, holds the whole run.
        deadline = time.monotonic() + 10
        while True:
            copy = tmp_path / f"copy-{time.monotonic_ns()}.db"
            copy.write_bytes(db.read_bytes())
            conn = sqlite3.connect(copy)
            try:
                (done,) = conn.execute("SELECT count(*) FROM runs WHERE state = 'done'").fetchone()
            except sqlite3.Error:  # (a copy taken while the thread was writing the file)
                done = 0
            finally:
                conn.close()
            if done == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert done == 1
        checkpointer = store._checkpointer
        assert checkpointer is not None and checkpointer._thread is not None
        thread = checkpointer._thread
    # Closing the store stops its thread (this store's: other tests' stores may be open).
    assert not thread.is_alive()


def test_a_store_dropped_without_close_stops_its_thread(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    _commits(store, ("read",), 3, [])
    checkpointer = store._checkpointer
    assert checkpointer is not None and checkpointer._thread is not None
    thread = checkpointer._thread
    assert thread.is_alive()
    del store, checkpointer
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


# ── one events row per transaction (schema 5) ──────────────────────────────────────


def _run_of_reads(store: SqliteStore, rounds: int) -> list[str]:
    statements: list[str] = []
    _commits(store, ("read",), rounds, statements)
    return statements


def test_a_transaction_writes_its_events_in_one_row_and_they_read_back_in_order(
    store: SqliteStore,
) -> None:
    statements = _run_of_reads(store, 6)
    inserts = [s for s in statements if s.startswith("INSERT INTO events")]
    assert len(inserts) == statements.count("COMMIT")  # one row per transaction
    (run_id,) = [r.run_id for r in store.list_runs()]
    events = store.load_run(run_id).events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
    # The feed reads what follows any event, whatever row holds it, and at most `limit`.
    for seq in range(-1, len(events)):
        assert store.events_since(run_id, seq) == events[seq + 1 :]
        assert store.events_since(run_id, seq, limit=3) == events[seq + 1 : seq + 4]


def test_rows_of_one_event_each_written_before_schema_5_read_the_same(
    store: SqliteStore,
) -> None:
    _run_of_reads(store, 4)
    (run_id,) = [r.run_id for r in store.list_runs()]
    before = store.load_run(run_id).events
    # Rewrite the run's events as schema 4 kept them: one row an event, n = 1.
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        rows = conn.execute("SELECT key, type, body FROM events ORDER BY key").fetchall()
        conn.execute("DELETE FROM events")
        for key, kind, body in rows:
            for i, line in enumerate(body.split("\n")):
                crc = zlib.crc32(line.encode())
                conn.execute("INSERT INTO events (key, type, body, sum) VALUES (?, ?, ?, ?)",
                             (key + i, kind, line, crc))  # fmt: skip
    finally:
        conn.close()
    assert store.load_run(run_id).events == before
    assert store.events_since(run_id, 2) == before[3:]


def test_a_damaged_events_row_is_an_error_never_a_silent_change(store: SqliteStore) -> None:
    _run_of_reads(store, 2)
    (run_id,) = [r.run_id for r in store.list_runs()]
    _raw(store, "UPDATE events SET body = replace(body, 'read', 'READ')")
    with pytest.raises(CorruptRecord, match="fail their checksum"):
        store.load_run(run_id)
    _raw(store, "UPDATE events SET sum = NULL, n = n + 1")  # (unchecked, but counted)
    with pytest.raises(CorruptRecord, match="lines, not"):
        store.load_run(run_id)


def test_an_async_run_stores_what_rode_behind_as_a_sync_run_does(tmp_path: Path) -> None:
    # The async driver performs store requests on worker threads: what waits behind a
    # driving is the same whichever thread asks next.
    with SqliteStore(tmp_path / "runs.db") as store:
        runtime = Runtime(
            model=ScriptedModel(_script(("read", "keyed"), 4)),
            tools=_tools(),
            allowed_tools={"read", "keyed"},
            store=store,
        )
        result = asyncio.run(runtime.arun("go", run_id="a1"))
        assert (result.status, result.reason) == ("done", "final_answer"), result.detail
        stored = store.load_run("a1")
        assert [e["seq"] for e in stored.events] == [e["seq"] for e in result.events]
        assert stored.body["state"] == "done"
        keyed = store.find_intents(run_id="a1")
        assert len(keyed) == 4 and {r.status for r in keyed} == {"committed"}


def test_the_store_writes_the_checkpoint_as_the_snapshot_encoded_it(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (RunState.snapshot encodes the body once, for its checksum; the row is that text.)
    last: list[Checkpoint] = []
    real = store.save_and_release

    def save_and_release(
        run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        last.append(checkpoint)
        real(run_id, owner, events, checkpoint)

    monkeypatch.setattr(store, "save_and_release", save_and_release)
    _commits(store, ("read",), 2)
    (ctx,) = _raw(store, "SELECT ctx FROM runs")[0]
    assert ctx == getattr(last[-1].snapshot, "text")  # noqa: B009
    assert json.loads(ctx) == last[-1].snapshot
