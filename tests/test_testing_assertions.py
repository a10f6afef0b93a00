"""The toolkit's assertions pass on what happened and fail with readable messages."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from fsm_agent import Runtime
from fsm_agent._trace.checker import check_events
from fsm_agent.testing import (
    FaultyTools,
    answer,
    assert_history_valid,
    assert_no_duplicate_writes,
    assert_path,
    assert_stopped,
    assert_trace_legal,
    call,
    decide,
    duplicate_writes,
)
from fsm_agent.testing._faults import SideEffect

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def read_then_answer(fsm_tools: FaultyTools, fsm_runtime: MakeRuntime) -> Any:
    fsm_tools.read("lookup")
    return fsm_runtime([decide(call("lookup", {"key": "A17"})), answer("In transit.")]).run("?")


def test_assert_path_exact_passes_and_shows_the_differing_step(read_then_answer: Any) -> None:
    path = [
        "deciding",
        "validating",
        "executing",
        "executing",
        "observing",
        "deciding",
        "validating",
        "done",
    ]
    assert_path(read_then_answer, path)
    wrong = [*path[:3], "retry_wait", *path[4:]]
    with pytest.raises(AssertionError) as info:
        assert_path(read_then_answer, wrong)
    text = str(info.value)
    assert "differs at step 3: expected 'retry_wait', got 'executing'" in text
    assert "expected: 0:deciding  1:validating  2:executing  3:retry_wait" in text
    assert "actual:   0:deciding  1:validating  2:executing  3:executing" in text


def test_assert_path_reports_a_shorter_or_longer_path(read_then_answer: Any) -> None:
    with pytest.raises(AssertionError, match=r"step 8: expected 'deciding', got '\(path ended"):
        assert_path(read_then_answer, [*read_then_answer.path, "deciding"])
    with pytest.raises(AssertionError, match=r"step 2: expected '\(path ended\)', got 'exec"):
        assert_path(read_then_answer, read_then_answer.path[:2])


def test_assert_path_subsequence(read_then_answer: Any) -> None:
    assert_path(read_then_answer, ["executing", "observing", "done"], exact=False)
    assert_path(read_then_answer, [], exact=False)
    with pytest.raises(AssertionError) as info:
        assert_path(read_then_answer, ["observing", "retry_wait", "done"], exact=False)
    assert "matched ['observing'] then found no 'retry_wait' after step 4" in str(info.value)
    with pytest.raises(AssertionError, match="found no 'executing'"):
        assert_path(read_then_answer, ["done", "executing"], exact=False)
    # A string is a path in the demo's notation now, so one state is a (wrong) path.
    with pytest.raises(AssertionError, match="differs at step 0"):
        assert_path(read_then_answer, "done")


def test_assert_path_takes_a_list_of_states() -> None:
    assert_path(["deciding", "validating", "done"], ["deciding", "validating", "done"])


def test_assert_stopped(
    read_then_answer: Any, fsm_tools: FaultyTools, fsm_runtime: MakeRuntime
) -> None:
    assert_stopped(read_then_answer, "done", "final_answer")
    assert_stopped(read_then_answer, "done")
    with pytest.raises(AssertionError) as info:
        assert_stopped(read_then_answer, "review_required", "outcome_unknown")
    text = str(info.value)
    assert "run stopped as done/final_answer, expected review_required/outcome_unknown" in text
    assert "path: deciding -> validating -> executing" in text
    result = fsm_runtime([decide(call("nope"), call("lookup", no_id=True))]).run("?")
    with pytest.raises(AssertionError, match=r"protocol_error/missing_tool_call_id \(tool_calls"):
        assert_stopped(result, "done")


def test_assert_history_valid() -> None:
    good = [
        {"role": "user", "content": "?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    assert_history_valid(good)
    with pytest.raises(AssertionError, match="'c1' is never answered"):
        assert_history_valid(good[:2])
    with pytest.raises(AssertionError, match="orphan tool result for 'c2'"):
        assert_history_valid([*good, {"role": "tool", "tool_call_id": "c2", "content": ""}])


def _problems(events: list[dict[str, Any]]) -> list[str]:
    return [v.message for v in check_events(events)]


def test_assert_trace_legal_catches_broken_traces(read_then_answer: Any) -> None:
    assert_trace_legal(read_then_answer)
    events = read_then_answer.events
    gap = copy.deepcopy(events)
    del gap[3]
    assert any("seq" in p for p in _problems(gap))
    illegal = copy.deepcopy(events)
    first = next(e for e in illegal if e["type"] == "transition" and e["dest"] == "executing")
    first["dest"] = "done"
    problems = _problems(illegal)
    assert any(
        "the engine writes transition validate validating -> executing of call 'c1' here; the "
        "trace records transition validate validating -> done" in p
        for p in problems
    ), problems
    after_end = [*copy.deepcopy(events), {"type": "observation", "seq": len(events)}]
    assert any("after the run ended" in p for p in _problems(after_end))
    no_end = copy.deepcopy(events[:-1])
    assert any("without run_end" in p for p in _problems(no_end))
    with pytest.raises(AssertionError, match="not a legal path"):
        assert_trace_legal(gap)


def test_the_checker_spots_a_shadowed_edge(read_then_answer: Any) -> None:
    """An event claiming a low-priority edge while a higher one's guards held is illegal."""
    events = copy.deepcopy(read_then_answer.events)
    validate = next(e for e in events if e["type"] == "transition" and e["dest"] == "executing")
    validate["guards"]["tool_rounds_spent"] = True
    problems = _problems(events)
    # The checker recomputes the guard from the budget and the rounds so far.
    assert "seq 3: guard tool_rounds_spent: the engine gives false; the trace records true" in (
        problems
    ), problems


def test_duplicate_writes_from_tools_and_from_events(fsm_tools: FaultyTools) -> None:
    ticket = fsm_tools.write("ticket", idempotent=True)
    ticket.effects += [
        SideEffect("ticket", {"key": "K"}, "K"),
        SideEffect("ticket", {"key": "K"}, "K"),
    ]
    assert duplicate_writes(ticket) == ["ticket: key 'K' took effect 2 times"]
    with pytest.raises(AssertionError, match="a write ran twice"):
        assert_no_duplicate_writes(fsm_tools)
    header = {
        "type": "run_start",
        "seq": 0,
        "tools": {"ticket": {"effect": "write"}, "lookup": {"effect": "read"}},
    }
    events = [
        header,
        {
            "type": "transition",
            "trigger": "dispatch",
            "dest": "executing",
            "seq": 1,
            "tool": "lookup",
            "call_id": "c1",
            "attempt": 2,
        },
        {
            "type": "transition",
            "trigger": "dispatch",
            "dest": "executing",
            "seq": 2,
            "tool": "ticket",
            "call_id": "c2",
            "attempt": 2,
        },
    ]
    assert duplicate_writes(events) == ["write 'ticket' call 'c2' was attempted 2 times (event 2)"]


def test_no_duplicate_writes_when_a_dedup_write_is_retried(
    fsm_tools: FaultyTools, fsm_runtime: MakeRuntime
) -> None:
    """A write whose downstream dedups may be retried; its repeats are not effects."""
    ticket = fsm_tools.write("ticket", dedup=True, faults=["timeout_after_effect"])
    result = fsm_runtime([decide(call("ticket", {"key": "K"})), answer("ok")]).run("?")
    assert_stopped(result, "done", "final_answer")
    assert ticket.attempts == 2
    assert [e.deduplicated for e in ticket.effects] == [False, True]
    assert_no_duplicate_writes(fsm_tools, result)
