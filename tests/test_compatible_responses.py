"""OpenAI-compatible Responses servers (issue 23, item 8): DeepSeek's ``/responses``
replies with a reasoning item followed by calls that carry no item id, and accepts that
history back; only OpenAI's own servers require the id-matched follower."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from fake_provider import Answer, FakeProvider

from fsm_agent import Runtime, ToolRegistry
from fsm_agent.models import (
    OpenAIResponsesModel,
    check_openai_responses,
    check_openai_responses_request,
)

REASONING = {
    "type": "reasoning",
    "id": "rs_ds_1",
    "summary": [{"type": "summary_text", "text": "Look the order up."}],
    "encrypted_content": "gAAAA-opaque",
}
CALL = {
    "type": "function_call",
    "call_id": "call_00_a",
    "name": "lookup",
    "arguments": '{"order_id": "A17"}',
    "status": "completed",
}  # no "id": what DeepSeek sends
FIRST = {"id": "r1", "status": "completed", "model": "deepseek-chat", "output": [REASONING, CALL]}
DONE = {
    "id": "r2",
    "status": "completed",
    "model": "deepseek-chat",
    "output": [
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "In transit.", "annotations": []}],
        }
    ],
}


def history_items() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Where is A17?"},
        REASONING,
        {k: v for k, v in CALL.items() if k != "status"},
        {"type": "function_call_output", "call_id": "call_00_a", "output": "{}"},
    ]


def test_the_validator_has_the_openai_rule_only_when_asked() -> None:
    items = history_items()
    assert any("must be followed by the item it" in p for p in check_openai_responses(items))
    assert check_openai_responses(items, reasoning_followers=False) == []
    body = {"model": "deepseek-chat", "input": items}
    assert check_openai_responses_request(body, reasoning_followers=False) == []
    # the other rules still hold for compatible servers
    unanswered = items[:3]
    assert any(
        "never answered" in p for p in check_openai_responses(unanswered, reasoning_followers=False)
    )


def run(url: str, **kw: Any) -> tuple[Any, list[Any]]:
    tools = ToolRegistry()
    tools.register(lambda **_: {"status": "in transit"}, name="lookup",
                   schema={"type": "object"}, effect="read")  # fmt: skip
    with FakeProvider() as server:
        server.queue(Answer(200, FIRST), Answer(200, DONE))
        client = openai.OpenAI(base_url=url or server.url + "/v1", api_key="k", max_retries=0)
        if url:  # send to the fake server while the client says it is another host
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        model = OpenAIResponsesModel("deepseek-chat", client=client, **kw)
        result = Runtime(model=model, tools=tools, allowed_tools={"lookup"}).run("Where is A17?")
        return result, server.received


def test_a_compatible_server_gets_its_reasoning_back_as_it_sent_it() -> None:
    result, received = run("")
    assert (result.status, result.answer) == ("done", "In transit."), result.detail
    sent = received[1].body["input"]
    assert [i.get("type", "message") for i in sent] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert "id" not in sent[2]


def test_openai_rules_can_be_asked_for_and_then_refuse_before_sending() -> None:
    result, received = run("", reasoning_followers=True)
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert "must be followed by the item it produced" in result.detail
    assert len(received) == 1  # the refused request never left


@pytest.mark.parametrize(
    ("url", "applies"),
    [
        ("https://api.openai.com/v1", True),
        ("https://my-team.openai.azure.com/openai/v1", True),
        ("https://api.deepseek.com/v1", False),
        ("http://localhost:8000/v1", False),
    ],
)
def test_the_openai_rule_follows_the_server(url: str, applies: bool) -> None:
    model = OpenAIResponsesModel("m", base_url=url, api_key="k")
    history = [
        {"role": "user", "content": "Where is A17?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_00_a",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": "{}"},
                }
            ],
            "responses_output": [REASONING, {k: v for k, v in CALL.items() if k != "status"}],
        },
        {"role": "tool", "tool_call_id": "call_00_a", "content": "{}"},
    ]
    if applies:
        with pytest.raises(Exception, match="must be followed by the item it produced"):
            model.build_request(history, [])
    else:
        assert model.build_request(history, [])["input"][1]["type"] == "reasoning"


def test_a_bad_option_is_one_line() -> None:
    with pytest.raises(ValueError, match="reasoning_followers must be True, False or None"):
        OpenAIResponsesModel("m", base_url="http://x", api_key="k", reasoning_followers="yes")
