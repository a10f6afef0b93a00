"""The history-keyed scripted model, and the warning for reused call ids (issue 23 item 10).

A ``ScriptedModel`` counts its steps in the process that made it, so a run paused for
review and resumed in a new process asked for the refund again. ``KeyedScriptedModel``
decides from the history, so the resumed run continues where it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import fsm_agent
import fsm_agent.models
import fsm_agent.testing
from fsm_agent import (
    ConfigError,
    KeyedScriptedModel,
    MemoryStore,
    Runtime,
    ScriptedModel,
    ToolRegistry,
)
from fsm_agent._durable import review
from fsm_agent._runtime.call_ids import repeated_calls
from fsm_agent.testing import answer, call, decide

HERE = Path(__file__).resolve().parent
DESK = HERE / "refund_desk.py"


def desk(tmp: Path, *args: str) -> dict[str, Any]:
    """One process of the refund desk (``tests/refund_desk.py``)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(DESK),
            str(tmp / "runs.db"),
            str(tmp / "traces"),
            str(tmp / "ledger.jsonl"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    out["stderr"] = proc.stderr
    return out


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def refunds(tmp: Path) -> list[dict[str, Any]]:
    ledger = tmp / "ledger.jsonl"
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines()]


# ── a review in between two processes ────────────────────────────────────────────────


def test_resumed_in_a_fresh_process_the_keyed_model_continues(tmp_path: Path) -> None:
    first = desk(tmp_path, "keyed", "start", "refund-1")
    assert (first["status"], first["reason"]) == ("review_required", "approval_required")
    assert first["asked"] == ["lookup", "issue_refund"] and refunds(tmp_path) == []

    approved = cli("runs", "approve", "--db", str(tmp_path / "runs.db"), "refund-1", "c2")
    assert approved.returncode == 0, approved.stderr

    second = desk(tmp_path, "keyed", "resume", "refund-1")
    assert (second["status"], second["reason"]) == ("done", "final_answer")
    assert second["asked"] == []  # the model answered; it asked for no refund again
    assert "reused" not in second["stderr"] and "asked again" not in second["stderr"]
    assert [r["request_id"] for r in refunds(tmp_path)] == ["RF-17"]


def test_a_positional_script_asks_again_and_the_runtime_says_so(tmp_path: Path) -> None:
    """What the keyed model fixes: a ScriptedModel in the new process starts over."""
    desk(tmp_path, "scripted", "start", "refund-1")
    approved = cli("runs", "approve", "--db", str(tmp_path / "runs.db"), "refund-1", "c2")
    assert approved.returncode == 0, approved.stderr
    second = desk(tmp_path, "scripted", "resume", "refund-1")
    assert second["asked"] == ["lookup", "issue_refund"]  # step 0 again
    assert "asked again for call(s) 'c1' (lookup), 'c2' (issue_refund)" in second["stderr"]
    assert "KeyedScriptedModel" in second["stderr"]


# ── the model itself ─────────────────────────────────────────────────────────────────


def _tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(effect="read", schema={"type": "object"})
    def lookup() -> dict[str, str]:
        return {"status": "late"}

    @tools.tool(effect="write", requires_approval=True, schema={"type": "object"})
    def refund() -> dict[str, bool]:
        return {"ok": True}

    return tools


def test_decisions_are_keyed_by_the_last_result() -> None:
    model = KeyedScriptedModel(
        {
            None: decide(call("lookup", id="a")),
            "a": decide(call("lookup", id="b"), call("lookup", id="c")),
            "c": lambda history: answer(f"{len(history)} messages"),
        }
    )
    rt = Runtime(model=model, tools=_tools(), allowed_tools={"lookup"})
    result = rt.run("go")
    assert (result.status, result.answer) == ("done", "6 messages")
    assert model.calls == 3 and len(model.seen) == 3


def test_a_string_is_an_answer_and_an_exception_is_raised() -> None:
    model = KeyedScriptedModel({None: "hello"})
    assert model([{"role": "user", "content": "hi"}], []) == {
        "role": "assistant",
        "content": "hello",
    }
    failing = KeyedScriptedModel({None: TimeoutError("slow")})
    result = Runtime(model=failing, tools=_tools(), allowed_tools=set()).run("go")
    assert (result.status, result.reason) == ("protocol_error", "model_error")


def test_a_history_the_script_does_not_cover_is_named() -> None:
    model = KeyedScriptedModel({None: decide(call("lookup", id="a")), "b": "never"})
    result = Runtime(model=model, tools=_tools(), allowed_tools={"lookup"}).run("go")
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert result.detail == (
        "LookupError: KeyedScriptedModel has no decision after a result for 'a' (it has "
        "decisions after: the start (no result yet), a result for 'b')"
    )


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({}, "non-empty mapping"),
        ([("a", "x")], "non-empty mapping"),
        ({"": "x"}, "key '' is not a call id"),
        ({3: "x"}, "key 3 is not a call id"),
        ({None: 42}, "the decision after the start (no result yet) is 42"),
    ],
)
def test_a_script_that_cannot_work_is_refused(script: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KeyedScriptedModel(script)


def test_exported_where_the_scripted_model_is() -> None:
    for module in (fsm_agent, fsm_agent.models, fsm_agent.testing):
        assert module.KeyedScriptedModel is KeyedScriptedModel
        assert "KeyedScriptedModel" in module.__all__
    assert fsm_agent.testing.ScriptedModel is ScriptedModel


# ── reused call ids ──────────────────────────────────────────────────────────────────


def _paused(model: Any) -> tuple[Runtime, str]:
    rt = Runtime(
        model=model, tools=_tools(), allowed_tools={"lookup", "refund"}, store=MemoryStore()
    )
    result = rt.run("go", run_id="r")
    assert result.reason == "approval_required"
    review.record_review(rt.store, "r", "c2", "approve")
    return rt, "r"


SCRIPT = [decide(call("lookup", id="c1"), call("refund", id="c2")), answer("done")]


def test_a_restarted_script_warns_that_it_reuses_call_ids() -> None:
    rt, run_id = _paused(ScriptedModel(SCRIPT))
    with pytest.warns(RuntimeWarning) as caught:
        result = rt.resume(run_id, model=ScriptedModel(SCRIPT))
    (warning,) = [w for w in caught if "asked again" in str(w.message)]
    assert result.warnings == [str(warning.message)]
    assert str(warning.message).startswith(
        "run 'r': the model asked again for call(s) 'c1' (lookup), 'c2' (refund) with the "
        "id, tool and arguments of an earlier round of this run; each was handled as a new "
        "call."
    )
    assert warning.filename == __file__  # it points at the caller's line


def test_a_keyed_model_resumes_without_a_warning() -> None:
    keyed: dict[str | None, Any] = {None: SCRIPT[0], "c2": "done"}
    rt, run_id = _paused(KeyedScriptedModel(keyed))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = rt.resume(run_id, model=KeyedScriptedModel(keyed))
    assert (result.status, result.answer) == ("done", "done") and result.warnings == []


def test_repeated_calls_are_those_of_this_driving_with_the_same_call() -> None:
    def ask(*calls: tuple[str, str]) -> dict[str, Any]:
        return {"role": "assistant", "tool_calls": [call(name, {}, id=i) for i, name in calls]}

    history = [
        {"role": "user"},
        ask(("a", "lookup"), ("b", "refund")),
        {"role": "tool"},
        ask(("b", "refund"), ("c", "lookup")),
        ask(("a", "lookup")),
        ask(("c", "refund")),  # id c again for another call (as decide() numbers them)
    ]
    assert repeated_calls(history, 0) == [("b", "refund"), ("a", "lookup")]
    assert repeated_calls(history, 4) == [("a", "lookup")]
    assert repeated_calls(history, 5) == []
    assert repeated_calls([ask(("a", "x"), ("a", "x"))], 0) == []  # one batch's: R1 refuses
    other_args = {"role": "assistant", "tool_calls": [call("lookup", {"k": 1}, id="a")]}
    assert repeated_calls([*history[:2], other_args], 2) == []


def test_decide_numbered_scripts_do_not_warn() -> None:
    """The kit numbers each decision's calls c1, c2, ...: a new call, not a repeat."""
    model = ScriptedModel(
        [decide(call("lookup", {"k": 1})), decide(call("lookup", {"k": 2})), answer("ok")]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = Runtime(model=model, tools=_tools(), allowed_tools={"lookup"}).run("go")
    assert result.status == "done"


def test_a_call_without_a_function_object_is_not_the_first_of_its_id() -> None:
    """Only a call with a string id and a ``function`` object counts: a malformed one
    under the same id neither is the call repeated nor hides the first real one."""
    good: dict[str, Any] = {"role": "assistant", "tool_calls": [call("lookup", {}, id="a")]}
    broken: dict[str, Any] = {
        "role": "assistant",
        "tool_calls": [{"id": "a", "function": "lookup"}, 7],
    }
    history: list[dict[str, Any]] = [broken, {"role": "tool"}, good, {"role": "tool"}, good]
    assert repeated_calls(history, 0) == [("a", "lookup")]
    assert repeated_calls(history, 3) == [("a", "lookup")]
    assert repeated_calls([broken, broken], 0) == []
