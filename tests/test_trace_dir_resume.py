"""A ``trace_dir`` file holds the whole run after a resume (issue 23 item 11).

The file used to stop at the pause: ``resume``, ``approve``, ``deny`` and ``reconcile``
never wrote to it. Now the resumed run appends the store's events the file lacks (the
reviews) and then the rest of the run, and ``fsm-agent check`` passes on the file.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_keyed_model import cli, desk, refunds

from fsm_agent import (
    ConfigError,
    KeyedScriptedModel,
    MemoryStore,
    Runtime,
    SqliteStore,
    ToolRegistry,
)
from fsm_agent._durable import review
from fsm_agent._runtime.trace_files import _last_line, continue_trace_file
from fsm_agent._trace.chain import encode_events
from fsm_agent.testing import call, decide

KEY_ENV = {"FSM_TRACE_KEY": "a key the desk and its auditors share"}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def checked(path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
    result = cli("check", str(path), *extra, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("signed", [False, True], ids=["sha256", "hmac"])
def test_paused_reviewed_on_the_cli_resumed_elsewhere_one_file_checks(
    tmp_path: Path, signed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = KEY_ENV if signed else {}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    trace = tmp_path / "traces" / "refund-1.jsonl"
    desk(tmp_path, "keyed", "start", "refund-1")
    paused = lines(trace)
    assert paused[-1]["type"] == "run_end" and paused[-1]["status"] == "review_required"
    key_args = ["--key-env", "FSM_TRACE_KEY"] if signed else []
    approve = cli(
        "runs", "approve", "--db", str(tmp_path / "runs.db"), "refund-1", "c2", *key_args, env=env
    )
    assert approve.returncode == 0, approve.stderr

    assert desk(tmp_path, "keyed", "resume", "refund-1")["status"] == "done"
    whole = lines(trace)
    assert whole[: len(paused)] == paused  # continued, never rewritten
    # first what the CLI recorded in the store (the review), then the rest of the run
    recorded = [e for e in whole[len(paused) :] if e["type"] == "review"]
    assert recorded and recorded[0]["call_id"] == "c2" and recorded[0]["action"] == "approve"
    assert whole.index(recorded[0]) < next(
        i for i, e in enumerate(whole) if e.get("trigger") == "resume"
    )
    assert whole[-1]["type"] == "run_end" and whole[-1]["status"] == "done"
    assert [e["seq"] for e in whole] == list(range(len(whole)))
    checked(trace, *key_args, env=env)
    # the file holds what the store holds, byte for byte
    exported = cli("runs", "export", "refund-1", "--db", str(tmp_path / "runs.db"))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout == trace.read_text(encoding="utf-8")
    assert len(refunds(tmp_path)) == 1


def _tools(effects: list[str]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(effect="write", requires_approval=True, schema={"type": "object"})
    def refund() -> dict[str, bool]:
        effects.append("refund")
        return {"ok": True}

    @tools.tool(effect="write", schema={"type": "object"})
    def email() -> dict[str, bool]:
        effects.append("email")
        raise ConnectionResetError("the mail server hung up")

    return tools


MODEL = KeyedScriptedModel(
    {None: decide(call("refund", id="c1")), "c1": "refunded", "m1": "mailed"}
)


@pytest.mark.parametrize("action", ["approve", "deny"])
def test_a_memory_store_run_reviewed_in_process_continues_its_file(
    tmp_path: Path, action: str
) -> None:
    effects: list[str] = []
    rt = Runtime(
        model=MODEL,
        tools=_tools(effects),
        allowed_tools={"refund"},
        store=MemoryStore(),
        trace_dir=tmp_path,
    )
    assert rt.run("refund it", run_id="m").reason == "approval_required"
    result = (
        rt.approve("m", "c1", resume=True)
        if action == "approve"
        else rt.deny("m", "c1", "no", resume=True)
    )
    assert (result.status, result.answer) == ("done", "refunded")
    events = lines(tmp_path / "m.jsonl")
    assert events[-1]["status"] == "done"
    assert next(e for e in events if e["type"] == "review")["action"] == action
    assert effects == (["refund"] if action == "approve" else [])
    checked(tmp_path / "m.jsonl")


def test_a_reconciled_write_continues_the_file(tmp_path: Path) -> None:
    effects: list[str] = []
    model = KeyedScriptedModel({None: decide(call("email", id="m1")), "m1": "mailed"})
    rt = Runtime(
        model=model,
        tools=_tools(effects),
        allowed_tools={"email"},
        store=SqliteStore(tmp_path / "runs.db"),
        trace_dir=tmp_path,
    )
    assert rt.run("mail them", run_id="e").reason == "outcome_unknown"
    result = rt.reconcile("e", "m1", {"ok": True, "sent": True}, resume=True)
    assert (result.status, result.answer) == ("done", "mailed") and effects == ["email"]
    assert [e["action"] for e in lines(tmp_path / "e.jsonl") if e["type"] == "review"] == [
        "reconcile"
    ]
    assert lines(tmp_path / "e.jsonl")[-1]["status"] == "done"
    checked(tmp_path / "e.jsonl")


def test_a_file_that_is_not_the_stores_prefix_is_kept_and_the_run_goes_to_a_new_one(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    rt = Runtime(
        model=MODEL, tools=_tools([]), allowed_tools={"refund"}, store=store, trace_dir=tmp_path
    )
    rt.run("refund it", run_id="x")
    first = tmp_path / "x.jsonl"
    cut = first.read_bytes()[:-7]  # the last line, cut as by a crash mid-write
    first.write_bytes(cut)
    with pytest.warns(RuntimeWarning, match=r"x\.jsonl: its last line is cut short") as w:
        assert rt.approve("x", "c1", resume=True).status == "done"
    assert "is written to " + str(tmp_path / "x.2.jsonl") in str(w[0].message)
    assert first.read_bytes() == cut
    checked(tmp_path / "x.2.jsonl")
    assert lines(tmp_path / "x.2.jsonl")[-1]["status"] == "done"


def test_an_edited_file_is_not_continued(tmp_path: Path) -> None:
    rt = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=SqliteStore(tmp_path / "runs.db"),
        trace_dir=tmp_path,
    )
    rt.run("refund it", run_id="y")
    path = tmp_path / "y.jsonl"
    text = path.read_text()
    path.write_text(
        text[: text.rindex('"status"')]
        + text[text.rindex('"status"') :].replace("review_required", "done")
    )
    with pytest.warns(RuntimeWarning, match=r"its last line \(event \d+\) is not the store's"):
        rt.approve("y", "c1", resume=True)
    checked(tmp_path / "y.2.jsonl")


def test_a_file_of_another_run_with_the_same_id_is_not_continued(tmp_path: Path) -> None:
    rt = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=SqliteStore(tmp_path / "runs.db"),
        trace_dir=tmp_path,
    )
    rt.run("refund it", run_id="v")
    other = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=MemoryStore(),
        trace_dir=tmp_path / "o",
    )
    other.run("refund it", run_id="v")
    (tmp_path / "o" / "v.jsonl").replace(tmp_path / "v.jsonl")  # same id, other run_start
    with pytest.warns(RuntimeWarning, match="is not the store's"):
        rt.approve("v", "c1", resume=True)
    checked(tmp_path / "v.2.jsonl")


def test_a_run_begun_without_a_trace_dir_gets_its_whole_file_at_resume(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    tools = _tools([])
    Runtime(model=MODEL, tools=tools, allowed_tools={"refund"}, store=SqliteStore(db)).run(
        "refund it", run_id="z"
    )
    later = Runtime(
        model=MODEL,
        tools=tools,
        allowed_tools={"refund"},
        store=SqliteStore(db),
        trace_dir=tmp_path / "t",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert later.approve("z", "c1", resume=True).status == "done"
    events = lines(tmp_path / "t" / "z.jsonl")
    assert events[0]["type"] == "run_start" and events[-1]["status"] == "done"
    checked(tmp_path / "t" / "z.jsonl")


def test_a_finished_run_resumed_again_adds_nothing(tmp_path: Path) -> None:
    rt = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=SqliteStore(tmp_path / "runs.db"),
        trace_dir=tmp_path,
    )
    rt.run("refund it", run_id="w")
    rt.approve("w", "c1", resume=True)
    before = (tmp_path / "w.jsonl").read_bytes()
    assert rt.resume("w").status == "done"
    assert (tmp_path / "w.jsonl").read_bytes() == before


def test_the_last_line_is_found_past_the_read_block(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"x" * 10 + b"\n" + b"y" * 200_000 + b"\n")
    assert _last_line(path) == b"y" * 200_000 + b"\n"
    path.write_bytes(b"z" * 70_000 + b"\n")  # one line, longer than a block
    assert _last_line(path) == b"z" * 70_000 + b"\n"
    path.write_bytes(b"a\nb")  # cut: no newline at the end
    assert _last_line(path) == b"b"
    path.write_bytes(b"")
    assert _last_line(path) is None


def test_a_file_ahead_of_its_store_is_not_continued(tmp_path: Path) -> None:
    """A store that failed keeps its last good checkpoint while the file got more (the
    driver still writes run_end there): the store's run is what continues."""
    rt = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=MemoryStore(),
        trace_dir=tmp_path,
    )
    rt.run("refund it", run_id="u")
    events = lines(tmp_path / "u.jsonl")
    stored = [{k: v for k, v in e.items() if k not in ("run", "chain")} for e in events]
    with pytest.warns(RuntimeWarning, match=f"not one of the {len(events) - 1} events"):
        sink, chain = continue_trace_file(tmp_path, "u", stored[:-1], None)
    sink.close()
    assert chain is not None and lines(tmp_path / "u.2.jsonl") == events[:-1]


def test_a_signed_run_without_its_key_is_refused_before_the_file_is_touched(
    tmp_path: Path,
) -> None:
    keyed = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=MemoryStore(),
        trace_dir=tmp_path,
        trace_key="k",
    )
    keyed.run("refund it", run_id="s")
    before = (tmp_path / "s.jsonl").read_bytes()
    stored = [
        {k: v for k, v in e.items() if k not in ("run", "chain")}
        for e in lines(tmp_path / "s.jsonl")
    ]
    with pytest.raises(ConfigError, match="has a signed trace"):
        continue_trace_file(tmp_path, "s", stored, None)
    assert (tmp_path / "s.jsonl").read_bytes() == before


def test_async_resume_with_a_key_and_a_redact_hook_continues_the_file(tmp_path: Path) -> None:
    def redact(event: dict[str, Any]) -> dict[str, Any]:
        return {**event, "secret": "[redacted]"} if event.get("type") == "decision" else event

    effects: list[str] = []
    rt = Runtime(
        model=MODEL,
        tools=_tools(effects),
        allowed_tools={"refund"},
        store=SqliteStore(tmp_path / "runs.db"),
        trace_dir=tmp_path,
        trace_key="a shared key",
        redact=redact,
    )

    async def scenario() -> Any:
        assert (await rt.arun("refund it", run_id="a")).reason == "approval_required"
        review.record_review(rt.store, "a", "c1", "approve", key="a shared key")
        return await rt.aresume("a")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert asyncio.run(scenario()).status == "done"
    assert effects == ["refund"]
    assert not (tmp_path / "a.2.jsonl").exists()
    # One unbroken chain under the key, byte for byte what the store holds. (`check`
    # replays the run, so it reports the redacted fields as not the engine's: by design.)
    text = (tmp_path / "a.jsonl").read_text(encoding="utf-8")
    events = [
        {k: v for k, v in e.items() if k not in ("run", "chain")}
        for e in lines(tmp_path / "a.jsonl")
    ]
    assert "".join(line + "\n" for line in encode_events(events, "a", b"a shared key")) == text
    assert events[-1]["status"] == "done" and sum(e.get("secret") is not None for e in events) >= 2
    exported = cli("runs", "export", "a", "--db", str(tmp_path / "runs.db"))
    assert exported.returncode == 0 and exported.stdout == text


def test_replay_of_a_paused_trace_says_where_the_rest_of_the_run_is(tmp_path: Path) -> None:
    rt = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=SqliteStore(tmp_path / "runs.db"),
    )
    paused = tmp_path / "given.jsonl"
    rt.run("refund it", run_id="p", trace=paused)  # a path of the caller's: not continued
    rt.approve("p", "c1", resume=True)
    shown = cli("replay", str(paused))
    assert shown.returncode == 0, shown.stderr
    assert "the run paused for review; once resumed, the rest of it is in its store" in (
        shown.stdout
    )
    assert "fsm-agent runs export p --db" in shown.stdout

    (tmp_path / "given.2.jsonl").write_text(paused.read_text())
    (tmp_path / "given.10.jsonl").write_text(paused.read_text())
    shown = cli("replay", str(paused))
    assert f"the whole run, resumed, is in {tmp_path / 'given.10.jsonl'}" in shown.stdout


def test_a_submitted_run_driven_by_resume_gets_a_whole_file_that_checks(tmp_path: Path) -> None:
    """A run recorded by ``submit`` and driven later (as a worker does) with a trace_dir:
    the file and the store take each event's line once, from one chain."""
    rt = Runtime(
        model=MODEL,
        tools=_tools([]),
        allowed_tools={"refund"},
        store=SqliteStore(tmp_path / "runs.db"),
        trace_dir=tmp_path,
    )
    rt.submit("refund it", run_id="q")
    assert rt.resume("q").reason == "approval_required"
    assert rt.approve("q", "c1", resume=True).status == "done"
    checked(tmp_path / "q.jsonl")
    assert not (tmp_path / "q.2.jsonl").exists()
