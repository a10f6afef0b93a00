"""The checker recomputes every guard whose inputs are in the trace (issue 12), and no
input makes it, ``replay`` or the viewer's loader raise."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, TransientToolError, call, calls, make_runtime, say

from fsm_agent import Approval, Budget, RetryPolicy
from fsm_agent._cli import main
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._render.replay import Replay, describe_step
from fsm_agent._trace.chain import encode_events
from fsm_agent._trace.checker import check_events, load_trace

TICKET = {"request_id": "R-1", "title": "Damaged parcel"}
LOOKUP = call("c1", "lookup", order_id="A17")


def found(events: list[dict[str, Any]]) -> str:
    return "\n".join(f"{v.line}: {v.message}" for v in check_events(events))


def transition(events: list[dict[str, Any]], trigger: str, n: int = 0) -> dict[str, Any]:
    return [e for e in events if e.get("trigger") == trigger][n]


def test_guards_that_contradict_the_header_are_caught() -> None:
    two = [calls(LOOKUP), calls(call("c2", "lookup", order_id="A18")), say("ok")]
    events = make_runtime(two).run("go").events
    for field, value, guard in [
        ("budget", {**events[0]["budget"], "max_tool_rounds": 1}, "tool_rounds_spent"),
        ("budget", {**events[0]["budget"], "max_total_calls": 1}, "total_calls_spent"),
        ("budget", {**events[0]["budget"], "max_model_calls": 2}, "model_calls_spent"),
        ("policy", "strict", "strict_policy"),
    ]:
        forged = copy.deepcopy(events)
        forged[0][field] = value
        text = found(forged)
        # (the engine takes another edge, or evaluates the guard otherwise)
        assert (
            f"(guard {guard} true, recorded false)" in text
            or f"guard {guard}: the engine gives true; the trace records false" in text
        ), (field, text)
    # The allow-list: a call of a tool the header does not allow cannot be admitted.
    forged = copy.deepcopy(events)
    forged[0]["allowed_tools"] = ["write"]
    assert "dispatch executing -> observing of call 'c1' here (guard call_admitted false, " in (
        found(forged)
    )
    # The tool's effect: a read that fails is retried; a "write" may not be.
    b = Backend()
    b.fail_reads = [TransientToolError("flaky")]
    retried = make_runtime([calls(LOOKUP), say("ok")], b).run("go").events
    forged = copy.deepcopy(retried)
    forged[0]["tools"]["lookup"]["effect"] = "write"
    assert "guard is_retryable false, recorded true" in found(forged)
    forged = copy.deepcopy(retried)
    forged[0]["retry"] = {**forged[0]["retry"], "max_attempts": 1}
    assert "guard attempts_left false, recorded true" in found(forged)


def test_a_decision_contradicting_its_guards_is_caught() -> None:
    events = make_runtime([say("   ")]).run("go").events  # whitespace is no answer
    forged = copy.deepcopy(events)
    transition(forged, "validate")["guards"]["has_answer"] = True
    assert "guard has_answer: the engine gives false; the trace records true" in found(forged)


def test_every_single_guard_deletion_is_caught() -> None:
    b = Backend()
    b.fail_reads = [TransientToolError("flaky")]
    events = make_runtime([calls(LOOKUP), say("ok")], b).run("go").events
    total = 0
    for i, e in enumerate(events):
        for name in list(e.get("guards") or {}):
            forged = copy.deepcopy(events)
            del forged[i]["guards"][name]
            assert f"{i + 1}: " in found(forged), (i, name)
            total += 1
    assert total >= 20


def test_run_end_counters_are_what_the_events_add_up_to() -> None:
    events = make_runtime([calls(LOOKUP), say("ok")]).run("go").events
    forged = copy.deepcopy(events)
    forged[-1]["counters"]["write_attempts"] = 0
    forged[-1]["counters"]["tool_attempts"] = {}
    text = found(forged)
    assert 'counters.tool_attempts: the engine writes {"lookup": 1}; the trace records {}' in text
    assert "counters.write_attempts" not in text  # a read: 0 is right


def test_a_deleted_decision_or_dispatch_is_caught() -> None:
    events = make_runtime([calls(LOOKUP), say("ok")]).run("go").events
    for kind in ("decision", "dispatch"):
        at = next(i for i, e in enumerate(events) if e["type"] == kind or e.get("trigger") == kind)
        forged = copy.deepcopy(events[:at] + events[at + 1 :])
        for n, e in enumerate(forged):
            e["seq"] = n  # renumbered: seq alone gives nothing away
        assert found(forged), kind


def _approved_run() -> tuple[list[dict[str, Any]], Any]:
    store = MemoryStore()
    rt = make_runtime([calls(call("w1", "write", **TICKET)), say("ok")], store=store, approval=True)
    paused = rt.run("go", run_id="r1")
    assert paused.reason == "approval_required"
    done = rt.approve("r1", "w1", resume=True)
    assert done.status == "done"
    return done.events, rt


def test_a_resumed_write_needs_its_approve_review() -> None:
    events, _ = _approved_run()
    assert found(events) == ""
    start = transition(events, "dispatch")
    assert start["approval"] == "review:w1"
    review = next(i for i, e in enumerate(events) if e["type"] == "review")
    forged = copy.deepcopy(events[:review] + events[review + 1 :])
    for n, e in enumerate(forged):
        e["seq"] = n
    # Without its review event, the review transition wrote nothing the engine writes.
    assert "transition review review_required -> review_required" in found(forged)
    forged = copy.deepcopy(events)
    transition(forged, "dispatch")["approval"] = "config:0000000000000000"
    assert 'approval: the engine writes "review:w1"; the trace records "config:0000' in (
        found(forged)
    )


def test_a_configured_approval_must_cover_the_write() -> None:
    rt = make_runtime(
        [calls(call("w1", "write", **TICKET)), say("ok")],
        approval=True,
        approvals=[Approval("write", TICKET)],
    )
    events = rt.run("go").events
    assert found(events) == ""
    forged = copy.deepcopy(events)
    forged[0]["approvals"] = []
    assert "guard batch_needs_approval true, recorded false" in found(forged)
    forged = copy.deepcopy(events)
    del transition(forged, "dispatch")["approval"]
    assert 'approval: the engine writes "config:' in found(forged)


def test_wall_clock_and_output_budgets_are_recomputed() -> None:
    events = (
        make_runtime([calls(LOOKUP), say("ok")], budget=Budget(max_output_bytes=10_000))
        .run("go")
        .events
    )
    forged = copy.deepcopy(events)
    forged[0]["budget"]["max_output_bytes"] = 10
    assert "(guard output_budget_spent true, recorded false)" in found(forged)
    forged = copy.deepcopy(events)
    forged[0]["budget"]["max_wall_clock_s"] = 1.0
    # The clock read after the model replied: past the limit, so the batch may not start.
    transition(forged, "model_replied")["t"] = 2.5
    assert "guard wall_clock_spent true, recorded false" in found(forged)


# ── never a traceback ────────────────────────────────────────────────────────────


HOSTILE_LINES = [
    "[" * 10_000 + "]" * 10_000,
    '{"type": "transition", "seq": 1, "call_id": ["a", "b"], "guards": [1]}',
    '{"type": 5, "seq": 1}',
    '{"type": "observation", "seq": 1, "call_id": {"x": 1}, "result": [1, 2]}',
    '{"type": "decision", "seq": 1, "message": {"role": "assistant", "tool_calls": 7}}',
    '{"type": "review", "seq": 1, "call_id": null, "action": ["approve"]}',
    '{"type": "run_end", "seq": 1, "counters": "many"}',
    '{"type": "transition", "seq": 1, "source": "deciding", "trigger": "model_replied", '
    '"dest": "validating", "guards": {"tokens_spent": [], "cost_spent": {}}}',
    "\udcff".encode("utf-8", "surrogateescape").decode("latin-1"),
    '{"a": ' * 5000 + "1" + "}" * 5000,
    '{"type": "observation", "seq": 1, "call_id": "\\udcff", "result": {"v": "\\ud800"}}',
]


@pytest.mark.parametrize("line", HOSTILE_LINES, ids=range(len(HOSTILE_LINES)))
def test_hostile_lines_give_violations_never_tracebacks(
    tmp_path: Path, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    events = make_runtime([say("hi")]).run("go").events
    lines = encode_events(events)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([lines[0], line, *lines[1:]]) + "\n", "utf-8", "surrogateescape")
    other = tmp_path / "ok.jsonl"
    other.write_text("\n".join(lines) + "\n", "utf-8")
    assert main(["check", str(path), str(other)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2: " in out and f"{other}: ok" in out
    # replay and the viewer read it too, one step per line
    replay = Replay(path)
    assert len(replay) == len(lines) + 1
    for n in range(len(replay)):
        describe_step(replay, n)
    assert main(["replay", str(path), "--step", "1"]) == 0
    assert main(["replay", str(path), "--html", str(tmp_path / "v.html")]) == 0
    capsys.readouterr()


def test_the_python_api_takes_any_event_objects() -> None:
    events = make_runtime([say("hi")]).run("go").events
    for bad in ({"type": 5}, {"type": ["x"], "seq": {}}, {"seq": 1}, {}):
        assert check_events([events[0], bad, *events[1:]])
    assert check_events([])  # an empty trace is a violation, not a crash
    assert check_events([{"type": "decision"}])


def test_the_viewer_loader_keeps_every_line(tmp_path: Path) -> None:
    events = make_runtime([say("hi")]).run("go").events
    lines = encode_events(events)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([lines[0], "garbage", json.dumps([1]), *lines[1:]]) + "\n", "utf-8")
    loaded = load_trace(path)
    assert [e["type"] for e in loaded[1:3]] == ["unreadable", "unreadable"]
    assert main(["replay", str(path), "--html", str(tmp_path / "v.html")]) == 0


def test_a_legacy_trace_still_checks_with_a_note(tmp_path: Path) -> None:
    events = make_runtime([say("ok")], retry=RetryPolicy(max_attempts=1)).run("go").events
    old = copy.deepcopy(events)
    old[0]["schema"] = "fsm-agent.trace/1"
    old[0]["machine_hash"] = "sha256:b0c6ee309f35fbb9"
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in old), "utf-8")
    from fsm_agent._trace.checker import check_trace

    report = check_trace(path)
    assert report.ok, report.violations
    assert "integrity is unavailable" in report.notes[0]
