"""Trace integrity (issue 12): run ids and chain links on every line, signed runs, the
trace file and the store holding the same bytes, resumed runs continuing the chain, and
``fsm-agent check --db`` comparing a stored trace with the store's idempotency records."""

from __future__ import annotations

import hmac
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._cli import main
from fsm_agent._durable.audit import audit_run
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import ConfigError
from fsm_agent._trace.chain import Chain, encode_events, link_function, strip_links
from fsm_agent._trace.checker import check_events, check_file, check_trace

KEY = b"audit-key-0123456789"
TICKET = {"request_id": "R-1", "title": "Damaged parcel"}


def lines_of(path: Path) -> list[str]:
    return path.read_text("utf-8").splitlines()


def test_the_hmac_is_rfc_2104() -> None:
    for key in (b"k", b"x" * 64, b"y" * 100):
        data = b"some line\n{}"
        expected = hmac.new(key, data, "sha256").hexdigest()[:32]
        assert link_function(key)(data) == expected


def test_every_line_carries_the_run_id_and_a_link_that_checks(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    result = make_runtime([calls(call("c1", "lookup", order_id="A17")), say("ok")]).run(
        "go", run_id="r1", trace=path
    )
    events = [json.loads(line) for line in lines_of(path)]
    assert events[0]["integrity"] == "sha256"
    assert all(e["run"] == "r1" and len(e["chain"]) == 32 for e in events)
    # The file is exactly the run's events, encoded once each.
    assert lines_of(path) == encode_events(result.events)
    assert check_file(path) == []
    assert check_events(events) == []  # read back, the links are verified too


def test_a_signed_trace_checks_only_with_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "signed.jsonl"
    make_runtime([say("hello")], trace_key=KEY).run("go", run_id="s1", trace=path)
    assert json.loads(lines_of(path)[0])["integrity"] == "hmac-sha256"
    assert check_file(path, key=KEY) == []
    wrong = check_file(path, key=b"another key")
    assert wrong and "the chain breaks here" in wrong[0].message and wrong[0].line == 1
    report = check_trace(path)  # no key: conformance only, and a note saying so
    assert report.ok and "not verified without the key" in report.notes[0]
    monkeypatch.setenv("FSM_KEY", KEY.decode())
    assert main(["check", "--key-env", "FSM_KEY", str(path)]) == 0
    monkeypatch.setenv("FSM_KEY", "nope")
    assert main(["check", "--key-env", "FSM_KEY", str(path)]) == 1
    assert "the chain breaks here" in capsys.readouterr().out
    assert main(["check", "--key-env", "UNSET_VARIABLE_X", str(path)]) == 2


def test_an_unsigned_trace_fails_when_a_key_is_expected(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    make_runtime([say("hello")]).run("go", trace=path)
    found = check_file(path, key=KEY)
    assert [v.message for v in found] == [
        "a key was given, but the trace is not signed (integrity sha256)"
    ]


def test_an_edit_without_relinking_breaks_the_chain_where_it_is(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    make_runtime([calls(call("c1", "lookup", order_id="A17")), say("ok")]).run("go", trace=path)
    lines = lines_of(path)
    at = next(i for i, line in enumerate(lines) if '"observation"' in line)
    lines[at] = lines[at].replace("in_transit", "delivered!")
    path.write_text("\n".join(lines) + "\n", "utf-8")
    found = check_file(path)
    assert [(v.line, v.message[:25]) for v in found] == [(at + 1, "the chain breaks here: th")]
    # Without its links a line is refused outright.
    lines[at] = json.dumps({k: v for k, v in json.loads(lines[at]).items() if k != "chain"})
    path.write_text("\n".join(lines) + "\n", "utf-8")
    assert any(v.message == "no chain link at the end of the line" for v in check_file(path))


def test_sink_and_sqlite_store_hold_identical_bytes_and_a_resume_continues_the_chain(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    backend = Backend()
    script = [calls(call("w1", "write", **TICKET)), say("Filed.")]
    with SqliteStore(db) as store:
        rt = make_runtime(script, backend, store=store, approval=True, trace_key=KEY)
        paused = rt.run("file it", run_id="r1", trace=tmp_path / "r1.jsonl")
        assert paused.status == "review_required"
        rows = [  # (a row holds the lines of one transaction)
            line
            for r in sqlite3.connect(db).execute("SELECT body FROM events ORDER BY key").fetchall()
            for line in r[0].split("\n")
        ]
        # The trace file and the store hold the very same chained lines.
        assert rows == lines_of(tmp_path / "r1.jsonl")
        done = rt.approve(
            "r1", "w1", resume=True
        )  # review event and resumed run chained on, signed
        assert done.status == "done" and backend.writes
        stored = store.load_run("r1").events
        assert strip_links(stored) == done.events
        assert check_events(stored, key=KEY) == []
        assert audit_run(store, "r1", key=KEY).ok
        # A runtime without the key (or with another) cannot extend the signed chain.
        with pytest.raises(ConfigError, match="signed trace"):
            make_runtime(script, backend, store=store).resume("r1")
        with pytest.raises(ConfigError, match="not the key"):
            make_runtime(script, backend, store=store, trace_key=b"other").resume("r1")
    out = tmp_path / "r1-export.jsonl"
    assert main(["runs", "export", "--db", str(db), "r1", "-o", str(out)]) == 0
    assert lines_of(out)[: len(rows)] == rows  # export gives the stored bytes back
    assert check_file(out, key=KEY) == []


def test_memory_runs_are_chained_on_export_only() -> None:
    store = MemoryStore()
    result = make_runtime([say("hi")], store=store).run("go", run_id="m1")
    assert "chain" not in result.events[0] and "chain" not in store.load_run("m1").events[-1]
    lines = encode_events(result.events)
    assert check_events([json.loads(x) for x in lines]) == []


def test_a_chain_of_events_from_two_runs_is_caught(tmp_path: Path) -> None:
    a = make_runtime([calls(call("c1", "lookup", order_id="A17")), say("a")]).run("x", run_id="A")
    b = make_runtime([calls(call("c1", "lookup", order_id="A17")), say("b")]).run("x", run_id="B")
    la, lb = encode_events(a.events), encode_events(b.events)
    spliced = la[:5] + lb[5:]
    path = tmp_path / "spliced.jsonl"
    path.write_text("\n".join(spliced) + "\n", "utf-8")
    found = [v.message for v in check_file(path)]
    assert "an event of run 'B' in run 'A''s trace" in found
    assert found[0].startswith("the chain breaks here")
    # The same splice re-linked as run A: without a key anyone can relink, and where the
    # two runs agree up to the splice the result is a consistent run of its own (only
    # its payload differs): nothing but a key can tell. Signed, the splice shows.
    relinked = encode_events([*a.events[:5], *b.events[5:]], run_id="A")
    assert check_events([json.loads(x) for x in relinked]) == []
    signed_a, signed_b = encode_events(a.events, key=KEY), encode_events(b.events, key=KEY)
    signed = [json.loads(x) for x in signed_a[:5] + signed_b[5:]]
    signed[0]["integrity"] = "hmac-sha256"  # (encode_events keeps the header as it was)
    found = [v.message for v in check_events(signed, key=KEY)]
    assert any(m.startswith("the chain breaks here") for m in found)


def _db_with_writes(tmp_path: Path) -> Path:
    db = tmp_path / "runs.db"
    with SqliteStore(db) as store:
        first = make_runtime([calls(call("w1", "write", **TICKET)), say("ok")], store=store)
        second = make_runtime([calls(call("w9", "write", **TICKET)), say("ok")], store=store)
        assert first.run("open", run_id="first").counters["write_attempts"] == 1
        assert second.run("again", run_id="second").counters["replays"] == 1
    return db


def test_check_db_cross_checks_the_idempotency_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _db_with_writes(tmp_path)
    assert main(["check", "--db", str(db), "first", "second"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{db}#first: ok", f"{db}#second: ok"]
    # The record that backs the execution and the replay disappears:
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM idempotency")
    assert main(["check", "--db", str(db), "first", "second", "missing"]) == 2
    captured = capsys.readouterr()
    assert "the trace shows write 'write' (w1) executed, but the store holds no record" in (
        captured.out
    )
    assert "is answered as a replay of 'write', but the store holds no committed result" in (
        captured.out
    )
    assert "no run 'missing'" in captured.err


def test_check_db_sees_a_committed_write_the_trace_hides(tmp_path: Path) -> None:
    db = _db_with_writes(tmp_path)
    with SqliteStore(db) as store:
        stored = store.load_run("first")
        events = strip_links(stored.events)
        # Rewrite the run's trace as if the write never ran (re-linked: no key needed).
        # ...the tool rejected the call, so nothing happened:
        returned = next(e for e in events if e.get("trigger") == "tool_returned")
        returned["outcome"] = "rejected"
        returned["guards"] = {
            "call_not_started": False,
            "call_succeeded": False,
            "call_rejected": True,
        }
        at = next(i for i, e in enumerate(events) if e["type"] == "observation")
        events[at]["result"] = {"ok": False, "error": "rejected", "detail": "", "attempts": 1}
    relinked = [json.loads(x) for x in encode_events(events, run_id="first")]

    class Forged:
        def __init__(self, real: SqliteStore) -> None:
            self.real = real

        def load_run(self, run_id: str) -> Any:
            stored.events = relinked
            return stored

        def find_intents(self, **kw: Any) -> Any:
            return self.real.find_intents(**kw)

    with SqliteStore(db, readonly=True) as store:
        report = audit_run(Forged(store), "first")
    messages = [v.message for v in report.violations]
    assert any("holds a committed result of 'write' from call 'w1'" in m for m in messages)


def test_a_chain_continues_from_a_given_link() -> None:
    head = {"type": "run_start", "seq": 0}
    first = Chain("r", None)
    first.encode(head)
    later = Chain("r", None, first.link)
    assert later.encode({"type": "x", "seq": 1}) == Chain("r", None, first.link).encode(
        {"type": "x", "seq": 1}
    )
