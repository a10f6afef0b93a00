"""The per-provider history checks, on hand-built payloads: each finds what its provider
rejects (orphan results, unanswered calls, results in the wrong place) and accepts what
it takes; and each adapter's translation of a valid history passes its own check."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm_agent.models import (
    check_anthropic_messages,
    check_openai_chat,
    check_openai_responses,
)
from fsm_agent.models._anthropic_messages import to_anthropic
from fsm_agent.models._openai_responses import to_items
from fsm_agent.models._validate import recognise_history_rejection


def call(cid: str, name: str = "t", args: Any = None) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args or {})},
    }


def result(cid: str, ok: bool = True) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": json.dumps({"ok": ok})}


VALID: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Two lookups"},
    {"role": "assistant", "content": "Looking.", "tool_calls": [call("c1"), call("c2")]},
    result("c1"),
    result("c2", ok=False),
    {"role": "user", "content": "and?"},
    {"role": "assistant", "content": "Done."},
]


def test_a_valid_history_passes_every_provider_after_translation() -> None:
    assert check_openai_chat(VALID) == []
    assert check_openai_responses(to_items(VALID)) == []
    system, messages = to_anthropic(VALID)
    assert system == "Be brief." and check_anthropic_messages(messages) == []
    # tool results and the user text after them share one user turn, results first
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "tool_result", "text"]
    assert messages[2]["content"][1]["is_error"] is True


@pytest.mark.parametrize(
    "history,needle",
    [
        ([{"role": "user", "content": "x"}, result("ghost")], "must be a response to a preceding"),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [call("c1")]},
            ],
            "must be followed by tool messages",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [call("c1")]},
                {"role": "user", "content": "interrupting"},
                result("c1"),
            ],
            "orphan",
        ),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}],
            "needs content or tool_calls",
        ),
        ([{"role": "robot", "content": "x"}], "role must be one of"),
    ],
)
def test_openai_chat_rejections(history: list[dict[str, Any]], needle: str) -> None:
    problems = check_openai_chat(history)
    assert any(needle in p for p in problems), problems


def test_openai_responses_rejections() -> None:
    orphan = [
        {"role": "user", "content": "x"},
        {"type": "function_call_output", "call_id": "c9", "output": "{}"},
    ]
    assert "No tool call found for function call output c9" in check_openai_responses(orphan)[0]
    unanswered = [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
    ]
    assert "No tool output found for function call c1" in check_openai_responses(unanswered)[0]
    early = [
        {"type": "function_call_output", "call_id": "c1", "output": "{}"},
        {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
    ]
    assert len(check_openai_responses(early)) == 2


def test_anthropic_rejections() -> None:
    use = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}],
    }
    answer = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{}"}
    text = {"type": "text", "text": "hi"}
    user = {"role": "user", "content": [text]}
    # a result one turn too late
    late = [
        user,
        use,
        user,
        {"role": "assistant", "content": [text]},
        {"role": "user", "content": [answer]},
    ]
    problems = check_anthropic_messages(late)
    assert any(
        "ids were found without `tool_result` blocks immediately after" in p for p in problems
    )
    assert any("must have a corresponding `tool_use` block" in p for p in problems)
    # text before the results in the answering turn
    assert any(
        "must come first" in p
        for p in check_anthropic_messages([user, use, {"role": "user", "content": [text, answer]}])
    )
    # ids the API does not accept; a first turn from the assistant is accepted (a recorded
    # request the real API took starts with one: tests/data/providers)
    bad_id = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "call 1", "name": "t", "input": {}}],
    }
    problems = check_anthropic_messages([bad_id, {"role": "user", "content": [answer]}])
    assert not any("first message" in p for p in problems)
    assert any("must match" in p for p in problems)


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response messages: x",
            True,
        ),
        (
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            True,
        ),
        (
            "messages.3: `tool_use` ids were found without `tool_result` blocks immediately after: "
            "toolu_01",
            True,
        ),
        ("max_tokens: must be at least 1", False),
    ],
)
def test_provider_rejection_texts_are_recognised(text: str, expected: bool) -> None:
    assert recognise_history_rejection(text) is expected
