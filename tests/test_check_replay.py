"""Check by replay (issue 18, item 1): ``check`` feeds a trace's recorded inputs to the
engine's own loop and compares what it writes, so the engine and the checker decide with
the same code, and an input the trace does not hold is a violation, never a pass."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._core import guards as guards_module
from fsm_agent._core.loop import SCHEMA
from fsm_agent._core.state import RunState
from fsm_agent._errors import TraceError
from fsm_agent._trace.chain import encode_events
from fsm_agent._trace.checker import V2_SCHEMA, check_events, check_trace

DATA = Path(__file__).parent / "data"
TICKET = {"request_id": "R-1", "title": "Damaged parcel"}


def found(events: list[dict[str, Any]]) -> str:
    return "; ".join(f"{v.line}: {v.message}" for v in check_events(events))


def _lenient_has_answer(run: RunState) -> bool:
    """A changed rule: any text at all is an answer (today's: whitespace is none)."""
    return run.decision.answer is not None


def test_a_guard_changed_in_the_engine_changes_what_check_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The done-when test: no checker edit, only the engine's guard changes."""
    blank = make_runtime([say("   ")]).run("go")  # whitespace is no answer
    assert blank.reason == "empty_answer" and found(blank.events) == ""
    with monkeypatch.context() as m:
        m.setitem(guards_module.GUARDS, "has_answer", _lenient_has_answer)
        # The trace that checked now fails: the engine takes another edge.
        assert (
            "4: seq 3: the engine writes transition validate validating -> done (final_answer) "
            "here (guard "
            "has_answer true, recorded false); the trace records transition validate "
            "validating -> protocol_error (empty_answer)"
        ) in found(blank.events)
        lenient = make_runtime([say("   ")]).run("go")  # recorded by the changed engine
        assert lenient.status == "done" and found(lenient.events) == ""
    # ...and vice versa: what the changed engine recorded fails under today's.
    assert "guard has_answer false, recorded true" in found(lenient.events)


def test_a_guard_the_engine_does_not_evaluate_is_a_violation() -> None:
    events = make_runtime([say("ok")]).run("go").events
    forged = copy.deepcopy(events)
    validate = next(e for e in forged if e.get("trigger") == "validate")
    validate["guards"]["strict_policy"] = False
    assert (
        "seq 3: guard strict_policy: the trace records it (false); the engine does not "
        "evaluate it here"
    ) in found(forged)


def test_the_store_s_answers_are_recorded_and_replayed() -> None:
    rt = make_runtime([calls(call("w1", "write", **TICKET)), say("Filed.")], keyed=True)
    events = rt.run("file it").events
    assert events[0]["schema"] == SCHEMA
    validate = next(e for e in events if e.get("trigger") == "validate")
    assert validate["inputs"] == [{"idempotency_key": "R-1"}]
    dispatch = next(e for e in events if e.get("trigger") == "dispatch")
    assert dispatch["inputs"] == [{"begin_intent": {"owned": True, "found": None}}]
    assert found(events) == ""
    # An input the trace does not hold is a violation, never a pass.
    forged = copy.deepcopy(events)
    del next(e for e in forged if e.get("trigger") == "dispatch")["inputs"]
    assert (
        "the engine asks the world to begin the intent of call 'w1' before this transition; "
        "the trace records no such answer (begin_intent 1 in inputs)"
    ) in found(forged)
    # A store that said the key was taken by another write: the engine replays it.
    forged = copy.deepcopy(events)
    other = {
        "tool": "write", "key": "R-1", "args_digest": "sha256:other", "status": "committed",
        "run_id": "r0", "call_id": "x", "result": None, "effect": "write", "dedup": False,
    }  # fmt: skip
    next(e for e in forged if e.get("trigger") == "dispatch")["inputs"] = [
        {"begin_intent": {"owned": False, "found": other}}
    ]
    assert "the engine writes transition dispatch executing -> review_required" in found(forged)


def test_a_model_failure_replays_as_its_recorded_error() -> None:
    class Boom(RuntimeError):
        pass

    events = make_runtime([Boom("the provider is down")]).run("go").events
    decision = next(e for e in events if e["type"] == "decision")
    assert decision["error"] == "Boom: the provider is down"
    assert found(events) == ""
    forged = copy.deepcopy(events)
    next(e for e in forged if e.get("trigger") == "model_failed")["reason"] = "tokens"
    assert 'seq 2: reason: the engine writes "model_error"; the trace records "tokens"' in (
        found(forged)
    )


def test_every_violation_names_the_seq_the_field_and_both_values() -> None:
    events = make_runtime([calls(call("c1", "lookup", order_id="A17")), say("ok")]).run("go")
    forged = copy.deepcopy(events.events)
    observation = next(e for e in forged if e["type"] == "observation")
    observation["synthetic"] = True
    assert "seq 6: synthetic: the engine writes false; the trace records true" in found(forged)


def test_a_v2_trace_still_checks_with_a_note(tmp_path: Path) -> None:
    # A trace written by engine v2 names the v2 table's hash: this machine has more
    # edges (approval_refused, review), so it is refused as another machine's...
    with pytest.raises(TraceError, match="machine hash 'sha256:b9a846887a1441f0' is not"):
        check_trace(DATA / "trace_v2.jsonl")
    # ...and a v2-format trace of this machine is checked by the v2 walker, with a note.
    events = json.loads(json.dumps(make_runtime([say("ok")]).run("go").events))
    events[0]["schema"] = V2_SCHEMA
    path = tmp_path / "v2.jsonl"
    lines = encode_events(events, run_id=events[0]["run_id"])
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    report = check_trace(path)
    assert report.ok, report.violations
    assert any(f"a {V2_SCHEMA} trace" in n and "not replayed" in n for n in report.notes)
    validate = next(e for e in events if e.get("trigger") == "validate")
    validate["guards"]["has_tool_calls"] = True
    assert check_events(events) != []  # the walker still catches a forged guard


def test_a_replay_runs_in_bounded_memory_on_a_trace_the_engine_never_reaches(
    tmp_path: Path,
) -> None:
    """Read from a file the events reach the replay in chunks, and the bound is tested
    once a chunk: the same stop, at the same line, as one event at a time."""
    events = make_runtime([say("ok")]).run("go").events
    junk = [{"type": "review", "seq": n, "call_id": "x"} for n in range(1, 10_050)]
    message = "10000 events recorded that the engine never reaches (not replayed past here)"
    found_ = check_events([events[0], *junk])
    assert [(v.line, v.message) for v in found_] == [(10_002, message)]
    path = tmp_path / "junk.jsonl"
    path.write_text("".join(f"{line}\n" for line in encode_events([events[0], *junk])))
    assert [(v.line, v.message) for v in check_trace(path).violations] == [(10_002, message)]


def test_a_resumed_write_replays_from_its_checkpoint(tmp_path: Path) -> None:
    from fsm_agent._durable.memory import MemoryStore

    store = MemoryStore()
    rt = make_runtime(
        [calls(call("w1", "write", **TICKET)), say("done")], Backend(), store=store, approval=True
    )
    rt.run("go", run_id="r1")
    events = rt.approve("r1", "w1", resume=True).events
    review = next(e for e in events if e["type"] == "review")
    resume = next(e for e in events if e.get("trigger") == "resume")
    assert resume["inputs"][0] == {"resumed": review["seq"]}  # the checkpoint saved with it
    assert found(events) == ""
