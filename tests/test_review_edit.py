"""``edit``: a reviewer approves a paused call with corrected arguments (issue 22 item 4,
issue 19 item 4). Validated against the tool's recorded schema before anything is
recorded, bound by its own digest, recorded with the original and the edited arguments,
executed as edited on resume, and replayed by ``check``. Through the CLI (a subprocess),
the runtime API and the trace checker; HTTP and the browser are in test_server_*.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._core.canonical import digest
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.review import record
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import ReviewError
from fsm_agent._trace.checker import check_events

ASKED = {"request_id": "R-1", "title": "refund 80 EUR"}
EDITED = {"request_id": "R-1", "title": "refund 50 EUR"}


def paused(store: Any, backend: Backend, run_id: str = "r1") -> Any:
    rt = make_runtime(
        [calls(call("c1", "write", **ASKED)), say("Filed.")], backend, store=store, approval=True
    )
    first = rt.run("file it", run_id=run_id)
    assert (first.status, first.reason) == ("review_required", "approval_required")
    return rt


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )


def test_an_edit_through_the_cli_runs_the_corrected_call_and_check_replays_it(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "runs.db")
    backend = Backend()
    with SqliteStore(db) as store:
        rt = paused(store, backend)
        edited = json.dumps(EDITED)
        done = cli("runs", "approve", "--db", db, "r1", "c1", "--arguments", edited,
                   "--by", "ana", "--note", "capped at 50")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "recorded approve of c1 in run r1 by ana with arguments" in done.stdout
        review = store.load_run("r1").events[-1]
        assert review["type"] == "review" and review["action"] == "edit"
        assert review["arguments"] == EDITED and review["original_arguments"] == ASKED
        assert review["digest"] == digest("write", EDITED) != digest("write", ASKED)
        assert (review["reviewer"], review["note"]) == ("ana", "capped at 50")
        assert backend.writes == []  # recorded only: nothing ran
        result = rt.resume("r1")
    assert (result.status, result.answer) == ("done", "Filed.")
    assert backend.writes == [EDITED]  # the edited call ran, once, and the asked one never
    asked = next(e for e in result.events if e["type"] == "decision")
    assert json.loads(asked["message"]["tool_calls"][0]["function"]["arguments"]) == ASKED
    history = next(m for m in result.messages if m.get("tool_calls"))
    assert json.loads(history["tool_calls"][0]["function"]["arguments"]) == EDITED
    dispatch = next(e for e in result.events if e.get("trigger") == "dispatch")
    assert dispatch["approval"] == "review:c1"
    trace = tmp_path / "r1.jsonl"
    exported = cli("runs", "export", "--db", db, "r1", "-o", str(trace))
    assert exported.returncode == 0, exported.stderr
    checked = cli("check", str(trace))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert check_events(result.events) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["r1", "c1", "--arguments", '{"request_id": "R-1", "title": 5}'],
         "the edited arguments of call 'c1' do not fit tool 'write''s schema: title: 5 is not "
         "of type 'string'"),
        (["r1", "c1", "--arguments", '{"request_id": "R-1"}'],
         "(root): 'title' is a required property"),
        (["r1", "c1", "--arguments", "[1, 2]"], "must be a JSON object, got list"),
        (["r1", "c9", "--arguments", json.dumps(EDITED)], "call 'c9' is not pending in run 'r1'"),
        (["r9", "c1", "--arguments", json.dumps(EDITED)], "r9"),
        (["done", "c1", "--arguments", json.dumps(EDITED)],
         "run 'done' is done/final_answer, not waiting for review"),
        (["r1", "c1", "--arguments", "{nope"], "--arguments: not valid JSON"),
    ],
)  # fmt: skip
def test_a_bad_edit_is_one_line_and_records_nothing(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    db = str(tmp_path / "runs.db")
    with SqliteStore(db) as store:
        paused(store, Backend())
        make_runtime([say("hi")], store=store).run("hello", run_id="done")
        before = {r: store.load_run(r).events for r in ("r1", "done")}
    done = cli("runs", "approve", "--db", db, *argv)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in done.stderr
    assert len(lines) == 1 or lines[0].startswith("usage:")  # one line, or argparse's usage
    with SqliteStore(db) as store:
        assert {r: store.load_run(r).events for r in ("r1", "done")} == before


def test_edit_settles_only_what_an_approval_settles_and_only_once() -> None:
    store, backend = MemoryStore(), Backend()
    rt = paused(store, backend)
    rt.approve("r1", "c1", arguments=EDITED)
    with pytest.raises(ReviewError, match="was already approved with edits"):
        rt.approve("r1", "c1", arguments=ASKED)
    with pytest.raises(ReviewError, match="corrected arguments go with the edit action only"):
        record(store, "r1", "c1", "deny", arguments=EDITED)
    # A write of unknown outcome is reconciled or denied, never re-run with other arguments.
    backend2 = Backend()
    backend2.fail_writes.append((TimeoutError("lost"), True))
    rt2 = make_runtime([calls(call("c1", "write", **ASKED)), say("ok")], backend2,
                       store=MemoryStore(), keyed=False)  # fmt: skip
    unknown = rt2.run("go", run_id="u1")
    assert (unknown.status, unknown.reason) == ("review_required", "outcome_unknown")
    with pytest.raises(ReviewError, match="edit does not apply \\(use deny or reconcile\\)"):
        rt2.approve("u1", "c1", arguments=EDITED)


def test_check_refuses_an_edit_whose_arguments_were_changed_in_the_trace() -> None:
    store, backend = MemoryStore(), Backend()
    rt = paused(store, backend)
    rt.approve("r1", "c1", arguments=EDITED, by="ana")
    events = rt.resume("r1").events
    assert check_events(events) == []
    forged = [
        {**e, "arguments": {**EDITED, "title": "refund 500 EUR"}} if e["type"] == "review" else e
        for e in events
    ]
    problems = [str(p) for p in check_events(forged)]
    assert problems, "a changed edit must not pass"


def test_an_edit_survives_a_driver_that_died_after_applying_it(tmp_path: Path) -> None:
    """The edited arguments are in the checkpoint itself (the batch and the history), so
    a second resume after the first one stopped still runs the edited call."""
    backend = Backend()
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = paused(store, backend)
        rt.approve("r1", "c1", arguments=EDITED)
        stored = store.load_run("r1")
        history = next(m for m in stored.messages if m.get("tool_calls"))
        assert json.loads(history["tool_calls"][0]["function"]["arguments"]) == EDITED
        assert json.loads(stored.body["decision"]["tool_calls"][0]["function"]["arguments"]) == (
            EDITED
        )
        assert rt.resume("r1").status == "done"
    assert backend.writes == [EDITED]


def test_an_edit_in_a_batch_changes_only_its_call() -> None:
    store, backend = MemoryStore(), Backend()
    script = [calls(call("c1", "lookup", order_id="A1"), call("c2", "write", **ASKED)),
              say("Filed.")]  # fmt: skip
    rt = make_runtime(script, backend, store=store, approval=True)
    assert rt.run("file it", run_id="r1").reason == "approval_required"
    rt.approve("r1", "c2", arguments=EDITED, by="ana")
    done = rt.resume("r1")
    assert done.status == "done" and backend.lookups == ["A1"] and backend.writes == [EDITED]
    (batch,) = [m for m in done.messages if m.get("tool_calls")]
    args = [json.loads(c["function"]["arguments"]) for c in batch["tool_calls"]]
    assert args == [{"order_id": "A1"}, EDITED]
    assert [m["tool_call_id"] for m in done.messages if m["role"] == "tool"] == ["c1", "c2"]
    assert check_events(done.events) == []
