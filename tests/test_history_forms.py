"""The history a run hands back (``RunResult.messages``) and the Chat Completions form of
it: with images or files in tool results the internal form is not a valid Chat request,
and ``to_openai_chat`` makes it one (issue 23, item 7)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm_agent import Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.content import File, Image
from fsm_agent.models import check_openai_chat, to_openai_chat

PNG = b"\x89PNG\r\n\x1a\n" + bytes(16)


def media_history() -> list[dict[str, Any]]:
    tools = ToolRegistry()

    @tools.tool(schema={"type": "object"}, effect="read")
    def snap() -> dict[str, Any]:
        return {"image": Image(PNG), "doc": File(b"%PDF-1.4", "application/pdf", "r.pdf")}

    call = {"id": "c1", "type": "function", "function": {"name": "snap", "arguments": "{}"}}
    model = ScriptedModel(
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "assistant", "content": "Seen.", "reasoning_content": "I looked."},
        ]
    )
    result = Runtime(model=model, tools=tools, allowed_tools={"snap"}).run("look")
    assert result.status == "done"
    return result.messages


def test_the_internal_history_is_not_a_chat_request_and_the_conversion_is() -> None:
    history = media_history()
    # Documented: a tool message holding media keeps them as a list of parts.
    assert any("tool message's content must be a string" in p for p in check_openai_chat(history))
    sent = to_openai_chat(history)
    assert check_openai_chat(sent) == []
    tool = sent[2]
    assert tool["role"] == "tool" and isinstance(tool["content"], str)
    shown = json.loads(tool["content"])["value"]
    assert shown["image"]["part"] == 1 and shown["doc"]["name"] == "r.pdf"
    assert "reasoning_content" not in sent[3]  # only the keys Chat takes, unless asked


def test_the_conversion_can_send_the_media_in_a_user_message() -> None:
    sent = to_openai_chat(
        media_history(), tool_media="user_message", send_reasoning=["reasoning_content"]
    )
    assert check_openai_chat(sent) == []
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user", "assistant"]
    assert [p["type"] for p in sent[3]["content"]] == ["text", "image_url", "file"]
    assert sent[4]["reasoning_content"] == "I looked."


def test_the_conversion_does_not_change_the_history() -> None:
    history = media_history()
    before = json.dumps(history)
    to_openai_chat(history, tool_media="user_message")
    assert json.dumps(history) == before


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tool_media": "inline"}, "tool_media must be one of text, user_message"),
        ({"send_reasoning": "reasoning_content"}, "send_reasoning names keys among"),
        ({"send_reasoning": ["thoughts"]}, "send_reasoning names keys among"),
    ],
)
def test_bad_options_say_what_is_allowed(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_openai_chat([], **kw)
