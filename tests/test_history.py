"""check_history finds what a Chat Completions provider would reject."""

from __future__ import annotations

from conftest import call, calls, say

from fsm_agent import check_history

USER = {"role": "user", "content": "q"}


def tool(call_id: str) -> dict[str, str]:
    return {"role": "tool", "tool_call_id": call_id, "content": "{}"}


def test_a_paired_history_is_valid() -> None:
    batch = calls(call("a", "t"), call("b", "t"))
    assert check_history([USER, batch, tool("b"), tool("a"), say("done")]) == []


def test_each_kind_of_breakage_is_named() -> None:
    batch = calls(call("a", "t"), call("b", "t"))
    assert check_history([USER, batch, tool("a"), say("x")]) == [
        "message 1: tool_call_id 'b' has no tool result before message 3"
    ]
    assert check_history([USER, tool("z")]) == ["message 1: orphan tool result for 'z'"]
    assert check_history([USER, batch, tool("a"), tool("a"), tool("b")]) == [
        "message 3: tool_call_id 'a' answered twice"
    ]
    assert check_history([USER, calls(call("a", "t"), call("a", "t")), tool("a")]) == [
        "message 1: duplicate tool_call_id 'a'"
    ]
    assert check_history([USER, calls(call("", "t"))]) == ["message 1: a tool call without an id"]
    assert check_history([USER, batch]) == [
        "message 1: tool_call_id 'a' is never answered",
        "message 1: tool_call_id 'b' is never answered",
    ]


def test_a_result_after_the_next_turn_is_an_orphan() -> None:
    history = [USER, calls(call("a", "t")), USER, tool("a")]
    assert check_history(history) == [
        "message 1: tool_call_id 'a' has no tool result before message 2",
        "message 3: orphan tool result for 'a'",
    ]
