"""Issue 14, item by item, on recorded real replies (tests/data/providers): reasoning
round-trips, compatible-server variants, native media in tool results. Each run goes
through ``Runtime`` with the official SDK client on loopback."""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic
import openai
import pytest
from fake_provider import Answer, FakeProvider
from provider_corpus import Exchange, load

from fsm_agent import Runtime, ToolRegistry
from fsm_agent._core.content import File, Image
from fsm_agent.models import (
    AnthropicModel,
    HistoryError,
    OpenAIChatModel,
    OpenAIResponsesModel,
)
from fsm_agent.models._validate import (
    check_anthropic_request,
    check_openai_chat_request,
    check_openai_responses_request,
)

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
PDF = b"%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n"


def recorded(api: str, source_part: str, index: int = 0) -> Exchange:
    matches = [e for e in load(api) if source_part in e.source]
    return matches[index]


def registry(*names: str, schema: dict[str, Any] | None = None, value: Any = "ok") -> ToolRegistry:
    tools = ToolRegistry()
    for name in names:
        tools.register(
            lambda **_: value,
            name=name,
            schema=schema or {"type": "object", "additionalProperties": True},
            effect="read",
        )
    return tools


def chat(url: str, **kw: Any) -> OpenAIChatModel:
    client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
    return OpenAIChatModel("gpt-4o", client=client, **kw)


def responses(url: str, **kw: Any) -> OpenAIResponsesModel:
    client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
    return OpenAIResponsesModel("gpt-5", client=client, **kw)


def claude(url: str, **kw: Any) -> AnthropicModel:
    client = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0)
    return AnthropicModel("claude-sonnet-4-5", client=client, **kw)


CHAT_DONE = {
    "id": "c",
    "object": "chat.completion",
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Done."}}
    ],
}
RESPONSES_DONE = {
    "id": "r",
    "status": "completed",
    "model": "gpt-5",
    "output": [
        {
            "type": "message",
            "id": "msg_done",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        }
    ],
}
ANTHROPIC_DONE = {
    "id": "m",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "stop_reason": "end_turn",
    "content": [{"type": "text", "text": "Done."}],
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


# ── 1. reasoning round-trips ─────────────────────────────────────────────────────


def test_anthropic_thinking_goes_back_exactly_and_its_absence_is_refused() -> None:
    real = recorded("anthropic_messages", "test_anthropic_tool_with_thinking.yaml")
    blocks = real.response["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    tools = registry(blocks[2]["name"])
    options = {"thinking": real.request["thinking"]}
    with FakeProvider() as server:
        server.queue(Answer(200, real.response), Answer(200, ANTHROPIC_DONE))
        result = Runtime(
            model=claude(server.url, options=options, max_tokens=4096),
            tools=tools,
            allowed_tools={blocks[2]["name"]},
        ).run("What is the weather?")
        second = server.received[1].body
    assert result.status == "done"
    assistant = second["messages"][1]
    assert assistant == {"role": "assistant", "content": blocks}  # signature and order kept
    assert check_anthropic_request(second) == []
    decision = next(e for e in result.events if e.get("type") == "decision")
    assert decision["message"]["anthropic_content"] == blocks  # in the trace, as data
    # The same history without its thinking is refused before sending, in Anthropic's words.
    stripped = copy.deepcopy(second)
    stripped["messages"][1]["content"] = blocks[1:]
    assert any("must start with a thinking block" in p for p in check_anthropic_request(stripped))


def test_responses_reasoning_items_go_back_with_encrypted_content() -> None:
    real = recorded("openai_responses", "test_openai_responses_thinking_with_tool_calls.yaml")
    kinds = [i["type"] for i in real.response["output"]]
    assert kinds == ["reasoning", "function_call"]
    assert real.response["output"][0]["encrypted_content"]
    name = real.response["output"][1]["name"]
    with FakeProvider() as server:
        server.queue(Answer(200, real.response), Answer(200, RESPONSES_DONE))
        model = responses(server.url, options={"reasoning": real.request["reasoning"]})
        result = Runtime(model=model, tools=registry(name), allowed_tools={name}).run("Hi")
        first, second = (r.body for r in server.received)
    assert result.status == "done"
    assert first["include"] == ["reasoning.encrypted_content"] and first["store"] is False
    sent = second["input"]
    assert sent[1:3] == real.response["output"]  # reasoning, then its function_call, verbatim
    assert sent[3]["type"] == "function_call_output"
    assert check_openai_responses_request(second) == []
    # Reasoning dropped or sent without its call is what the real API refused (400 in the
    # corpus: "... of type 'reasoning' was provided without its required following item").
    alone = {**second, "input": [sent[0], sent[1], sent[0]]}
    assert any("required following item" in p for p in check_openai_responses_request(alone))


@pytest.mark.parametrize(
    "source,key",
    [
        ("test_crusoe/test_crusoe_tool_calling.yaml", "reasoning"),
        ("test_ollama/test_ollama_cloud_tool_output.yaml#1", "reasoning"),
    ],
)
def test_chat_reasoning_beside_tool_calls_goes_back_when_configured(source: str, key: str) -> None:
    real = recorded("openai_chat", source)
    message = real.response["choices"][0]["message"]
    names = {c["function"]["name"] for c in message["tool_calls"]}
    with FakeProvider() as server:
        server.queue(Answer(200, real.response), Answer(200, CHAT_DONE))
        model = chat(server.url, send_reasoning=(key,))
        result = Runtime(model=model, tools=registry(*names), allowed_tools=names).run("Hi")
        second = server.received[1].body
    assert result.status == "done"
    assert second["messages"][1][key] == message[key]
    with FakeProvider() as server:  # by default `reasoning` stays out (Groq refuses it)
        server.queue(Answer(200, real.response), Answer(200, CHAT_DONE))
        Runtime(model=chat(server.url), tools=registry(*names), allowed_tools=names).run("Hi")
        assert key not in server.received[1].body["messages"][1]


def test_deepseek_reasoning_content_is_required_within_the_tool_loop() -> None:
    # DeepSeek's thinking mode: reasoning_content beside tool_calls, required back in the
    # same tool loop (its 400: "Missing `reasoning_content` field in the assistant message").
    real = recorded("openai_chat", "test_crusoe/test_crusoe_tool_calling.yaml")
    body = copy.deepcopy(real.response)
    message = body["choices"][0]["message"]
    message["reasoning_content"] = message.pop("reasoning")
    names = {c["function"]["name"] for c in message["tool_calls"]}
    with FakeProvider() as server:
        server.queue(Answer(200, body), Answer(200, CHAT_DONE))
        result = Runtime(model=chat(server.url), tools=registry(*names), allowed_tools=names).run(
            "Hi"
        )
        second = server.received[1].body
    assert result.status == "done"
    assert second["messages"][1]["reasoning_content"] == message["reasoning_content"]
    # A second round of the same tool loop whose first round lost its reasoning:
    user, asked, answered = copy.deepcopy(result.messages[:3])
    again = copy.deepcopy(asked)
    again["tool_calls"][0]["id"] = "call_again"
    del asked["reasoning_content"]
    history = [user, asked, answered, again, {**answered, "tool_call_id": "call_again"}]
    model = chat("http://127.0.0.1:9")
    with pytest.raises(HistoryError, match="no reasoning_content"):
        model.build_request(history, [])


# ── 4. compatible-server variants ────────────────────────────────────────────────


def test_openrouter_call_without_arguments_reads_as_empty_when_the_schema_allows() -> None:
    real = recorded("openai_chat", "test_openrouter_tool_optional_parameters.yaml")
    call = real.response["choices"][0]["message"]["tool_calls"][0]
    assert "arguments" not in call["function"]
    name = call["function"]["name"]
    optional = {"type": "object", "properties": {"topic": {"type": "string"}}}
    seen: list[dict[str, Any]] = []
    tools = ToolRegistry()

    def find(**kw: Any) -> str:
        seen.append(kw)
        return "found"

    tools.register(find, name=name, schema=optional, effect="read")
    with FakeProvider() as server:
        server.queue(Answer(200, real.response), Answer(200, CHAT_DONE))
        result = Runtime(model=chat(server.url), tools=tools, allowed_tools={name}).run("x")
    assert (result.status, seen) == ("done", [{}])
    decision = next(e for e in result.events if e.get("type") == "decision")
    assert decision["message"]["normalised"] == [
        {"call": 0, "arguments": "missing: read as {} (the tool's schema accepts it)"}
    ]
    required = {**optional, "required": ["topic"]}
    strict = ToolRegistry()
    strict.register(lambda **kw: "found", name=name, schema=required, effect="read")
    with FakeProvider() as server:
        server.queue(Answer(200, real.response))
        result = Runtime(model=chat(server.url), tools=strict, allowed_tools={name}).run("x")
    assert (result.status, result.reason) == ("protocol_error", "malformed_decision")
    assert "arguments must be a JSON string" in result.detail


def test_gemini_empty_ids_stop_the_run_naming_the_option_or_get_minted_ids() -> None:
    real = recorded("openai_chat", "test_compatible_api_with_tool_calls_without_id.yaml")
    call = real.response["choices"][0]["message"]["tool_calls"][0]
    assert call["id"] == ""
    name = call["function"]["name"]
    with FakeProvider() as server:
        server.queue(Answer(200, real.response))
        result = Runtime(model=chat(server.url), tools=registry(name), allowed_tools={name}).run(
            "x"
        )
    assert (result.status, result.reason) == ("protocol_error", "missing_tool_call_id")
    assert "synthesize_missing_ids=True" in result.detail
    with FakeProvider() as server:
        server.queue(Answer(200, real.response), Answer(200, CHAT_DONE))
        model = chat(server.url, synthesize_missing_ids=True)
        result = Runtime(model=model, tools=registry(name), allowed_tools={name}).run("x")
        second = server.received[1].body
    assert result.status == "done"
    minted = result.messages[1]["tool_calls"][0]["id"]
    assert minted.startswith("fsm_") and result.messages[2]["tool_call_id"] == minted
    assert result.messages[1]["synthesized_ids"] == {minted: ""}
    # the server gets its own (empty) ids back, paired by position as it expects
    assert second["messages"][1]["tool_calls"][0]["id"] == ""
    assert second["messages"][2]["tool_call_id"] == ""
    # stable: the same reply at the same point mints the same id
    again = chat("http://127.0.0.1:9", synthesize_missing_ids=True).read_reply(
        real.response, [{"role": "user", "content": "x"}], []
    )
    assert again["tool_calls"][0]["id"] == minted


@pytest.mark.parametrize(
    "wording",
    [  # DeepSeek's own 400 texts, as reported in public issue threads
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. (insufficient tool messages following tool_calls message)",
        "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
        "No tool output found for tool call call_00_ET_SpXxxavgyEWZu15ec5Tb1552",
        "No tool call found for tool output with call_id call_00_abc",
        "Missing `reasoning_content` field in the assistant message at message index 2.",
        "The `reasoning_content` in the thinking mode must be passed back to the API.",
    ],
)
def test_deepseek_rejection_wordings_are_history_errors(wording: str) -> None:
    body = {"error": {"message": wording, "type": "invalid_request_error", "code": None}}
    with FakeProvider() as server:
        server.queue(Answer(400, body))
        with pytest.raises(HistoryError, match=r"rejected the history|wants back reasoning"):
            chat(server.url)([{"role": "user", "content": "x"}], [])


# ── 3. native media in tool results ──────────────────────────────────────────────


def media_run(model: Any, server: FakeProvider, first: dict[str, Any]) -> Any:
    tools = registry(
        "snap",
        value={
            "caption": "a pixel",
            "image": Image(PNG),
            "doc": File(PDF, "application/pdf", "r.pdf"),
        },
    )
    return Runtime(model=model, tools=tools, allowed_tools={"snap"}).run("Show me.")


def call_reply(api: str) -> dict[str, Any]:
    if api == "chat":
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "snap", "arguments": "{}"},
                }
            ],
        }
        return {
            **CHAT_DONE,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}],
        }
    if api == "responses":
        item = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "snap",
            "arguments": "{}",
            "status": "completed",
        }
        return {**RESPONSES_DONE, "output": [item]}
    block = {"type": "tool_use", "id": "toolu_1", "name": "snap", "input": {}}
    return {**ANTHROPIC_DONE, "stop_reason": "tool_use", "content": [block]}


def test_tool_images_and_files_reach_each_api_natively() -> None:
    sent: dict[str, Any] = {}
    for api, make, done in (
        ("anthropic", claude, ANTHROPIC_DONE),
        ("responses", responses, RESPONSES_DONE),
        ("chat", chat, CHAT_DONE),
    ):
        with FakeProvider() as server:
            server.queue(Answer(200, call_reply(api)), Answer(200, done))
            result = media_run(make(server.url), server, call_reply(api))
            assert result.status == "done", result.detail
            sent[api] = server.received[1].body
    text = json.loads(result.messages[2]["content"][0]["text"])
    assert text["value"]["image"] == {
        "type": "image",
        "media_type": "image/png",
        "bytes": len(PNG),
        "part": 1,
    }
    # Anthropic: image and document blocks inside the tool_result (the recorded shape)
    result_block = sent["anthropic"]["messages"][2]["content"][0]
    assert [b["type"] for b in result_block["content"]] == ["text", "image", "document"]
    assert result_block["content"][2]["source"]["media_type"] == "application/pdf"
    assert check_anthropic_request(sent["anthropic"]) == []
    # Responses: a list output of input_text, input_image and input_file parts
    output = sent["responses"]["input"][2]["output"]
    assert [p["type"] for p in output] == ["input_text", "input_image", "input_file"]
    assert output[2]["filename"] == "r.pdf" and output[2]["file_data"].startswith(
        "data:application/pdf;base64,"
    )
    assert check_openai_responses_request(sent["responses"]) == []
    # Chat Completions: text only, the placeholders saying what was left out
    tool = sent["chat"]["messages"][2]
    assert isinstance(tool["content"], str) and '"part": 2' in tool["content"]
    assert check_openai_chat_request(sent["chat"]) == []


def test_chat_can_follow_tool_results_with_a_user_message_of_media() -> None:
    with FakeProvider() as server:
        server.queue(Answer(200, call_reply("chat")), Answer(200, CHAT_DONE))
        result = media_run(chat(server.url, tool_media="user_message"), server, call_reply("chat"))
        messages = server.received[1].body["messages"]
    assert result.status == "done"
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert [p["type"] for p in messages[3]["content"]] == ["text", "image_url", "file"]
    # the shape OpenAI accepted in the recorded traffic: a user message right after the tool
    real = recorded("openai_chat", "direct-binary-document-openai_chat].yaml", 1)
    assert [m["role"] for m in real.request["messages"]] == ["user", "assistant", "tool", "user"]
    assert real.request["messages"][3]["content"][1]["type"] == "file"
