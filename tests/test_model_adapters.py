"""Every provider adapter, driven by its official SDK client against a loopback server,
through full ``Runtime.run`` loops: the behaviour the three must share."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fake_provider import Answer, FakeProvider
from provider_shapes import APIS, AnthropicApi

from fsm_agent import Budget, Runtime, ToolRegistry
from fsm_agent.models import (
    AnthropicModel,
    HistoryError,
    ModelRetry,
    OpenAIChatModel,
    Price,
    check_anthropic_messages,
    check_openai_chat,
)

api_params = pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as s:
        yield s


def order_tools(executed: list[dict[str, Any]]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(
        schema={
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
        effect="read",
    )
    def check_order(order_id: str) -> dict[str, Any]:
        """Where an order is."""
        executed.append({"order_id": order_id})
        return {"order_id": order_id, "status": "in_transit"}

    return tools


def runtime(model: Any, executed: list[dict[str, Any]], **kw: Any) -> Runtime:
    return Runtime(model=model, tools=order_tools(executed), allowed_tools={"check_order"}, **kw)


def no_sleep(waits: list[float]) -> Any:
    return waits.append


@api_params
def test_plain_answer_and_usage(api: Any, server: FakeProvider) -> None:
    server.queue(api.text("Hello.", usage=(1000, 200)))
    result = runtime(api.adapter(server.url), []).run("Hi")
    assert (result.status, result.reason, result.answer) == ("done", "final_answer", "Hello.")
    assert result.counters["input_tokens"] == 1000 and result.counters["tokens"] == 1200
    price = {
        "openai-chat": (0.15, 0.60),
        "openai-responses": (0.40, 1.60),
        "anthropic": (1.00, 5.00),
    }[api.name]
    assert result.counters["cost"] == pytest.approx((1000 * price[0] + 200 * price[1]) / 1e6)
    [request] = server.received
    assert request.path == api.path
    assert request.body["model"] == api.model and "tools" in request.body


@api_params
def test_one_call_then_answer_pairs_by_id(api: Any, server: FakeProvider) -> None:
    server.queue(
        api.calls([("call_1", "check_order", {"order_id": "A17"})]), api.text("A17 is in transit.")
    )
    executed: list[dict[str, Any]] = []
    result = runtime(api.adapter(server.url), executed).run("Where is A17?")
    assert (result.status, result.answer) == ("done", "A17 is in transit.")
    assert executed == [{"order_id": "A17"}]
    second = json.dumps(api.sent_messages(server.received[1].body))
    assert '"call_1"' in second and "in_transit" in second
    assert result.counters["model_calls"] == 2 and result.counters["tokens"] == 30


@api_params
def test_parallel_calls_each_answered_with_its_own_id(api: Any, server: FakeProvider) -> None:
    server.queue(
        api.calls(
            [
                ("call_a", "check_order", {"order_id": "A1"}),
                ("call_b", "check_order", {"order_id": "B2"}),
            ]
        ),
        api.text("Both in transit."),
    )
    executed: list[dict[str, Any]] = []
    result = runtime(api.adapter(server.url), executed).run("A1 and B2?")
    assert result.status == "done" and executed == [{"order_id": "A1"}, {"order_id": "B2"}]
    results = {
        m["tool_call_id"]: json.loads(m["content"])["value"]["order_id"]
        for m in result.messages
        if m["role"] == "tool"
    }
    assert results == {"call_a": "A1", "call_b": "B2"}
    sent = json.dumps(api.sent_messages(server.received[1].body))
    assert sent.index('"call_a"') < sent.index('"call_b"')


@api_params
def test_call_without_id_executes_nothing(api: Any, server: FakeProvider) -> None:
    server.queue(api.calls([(None, "check_order", {"order_id": "A17"})]))
    executed: list[dict[str, Any]] = []
    result = runtime(api.adapter(server.url), executed).run("Where is A17?")
    assert (result.status, result.reason) == ("protocol_error", "missing_tool_call_id")
    assert executed == []


@api_params
def test_call_id_reused_from_history(api: Any, server: FakeProvider) -> None:
    """Responses keys results by id across the whole input, so a reused id is a protocol
    error there; Chat Completions pairs per message, and Anthropic per turn (recorded
    requests reusing an earlier turn's id were accepted), so both take it."""
    server.queue(
        api.calls([("call_1", "check_order", {"order_id": "A1"})]),
        api.calls([("call_1", "check_order", {"order_id": "B2"})]),
        api.text("Both in transit."),
    )
    executed: list[dict[str, Any]] = []
    result = runtime(api.adapter(server.url), executed).run("A1 then B2")
    if api.name == "openai-chat":
        assert result.status == "done" and executed == [{"order_id": "A1"}, {"order_id": "B2"}]
        assert check_openai_chat(api.sent_messages(server.received[2].body)) == []
        return
    if api.name == "anthropic":
        assert result.status == "done" and executed == [{"order_id": "A1"}, {"order_id": "B2"}]
        assert check_anthropic_messages(server.received[2].body["messages"]) == []
        return
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert "reuses call id 'call_1'" in result.detail and executed == [{"order_id": "A1"}]


@api_params
def test_unknown_stop_reason_is_a_protocol_error(api: Any, server: FakeProvider) -> None:
    server.queue(api.stopped(api.calls([("c1", "check_order", {"order_id": "A"})]), "weird"))
    executed: list[dict[str, Any]] = []
    result = runtime(api.adapter(server.url), executed).run("x")
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert "ModelResponseError" in result.detail and "'weird'" in result.detail
    assert executed == []
    decision = next(e for e in result.events if e["type"] == "decision")
    assert "'weird'" in decision["error"]


@api_params
@pytest.mark.parametrize(
    "body,expected",
    [
        (b"", "response body is empty"),
        (b"<html>bad gateway</html>", "not JSON"),
        ([1, 2], "JSON list, not an object"),
    ],
)
def test_unreadable_bodies(api: Any, server: FakeProvider, body: Any, expected: str) -> None:
    server.queue(Answer(200, body))
    result = runtime(api.adapter(server.url), []).run("x")
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert expected in result.detail


@api_params
def test_malformed_body_names_the_field(api: Any, server: FakeProvider) -> None:
    body = api.text("hi")
    body.pop(
        {"openai-chat": "choices", "openai-responses": "output", "anthropic": "content"}[api.name]
    )
    server.queue(body)
    result = runtime(api.adapter(server.url), []).run("x")
    assert result.reason == "model_error" and "must be list, got missing" in result.detail


@api_params
def test_rate_limit_then_success(api: Any, server: FakeProvider) -> None:
    server.queue(
        Answer(429, {"error": {"message": "slow down"}}, {"retry-after": "0.3"}),
        Answer(503, {"error": {"message": "overloaded"}}),
        api.text("ok"),
    )
    waits: list[float] = []
    model = api.adapter(
        server.url, sleep=no_sleep(waits), retry=ModelRetry(max_attempts=3, backoff_s=0.1)
    )
    result = runtime(model, []).run("x")
    assert (result.status, result.answer) == ("done", "ok")
    assert waits == [0.3, 0.2]  # Retry-After wins when longer; then plain backoff
    assert len(server.received) == 3


@api_params
def test_server_errors_exhaust_the_retries(api: Any, server: FakeProvider) -> None:
    server.queue(*[Answer(500, {"error": {"message": "boom"}})] * 3)
    waits: list[float] = []
    model = api.adapter(server.url, sleep=no_sleep(waits), retry=ModelRetry(max_attempts=3))
    result = runtime(model, []).run("x")
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert result.detail.startswith("ModelUnavailableError: gave up after 3 attempts")
    assert "HTTP 500: boom" in result.detail and len(server.received) == 3 and len(waits) == 2


@api_params
def test_retry_never_waits_past_the_wall_clock(api: Any, server: FakeProvider) -> None:
    server.queue(Answer(429, {"error": {"message": "slow"}}, {"retry-after": "30"}))
    waits: list[float] = []
    model = api.adapter(server.url, sleep=no_sleep(waits), retry=ModelRetry(max_backoff_s=60))
    result = runtime(model, [], budget=Budget(max_wall_clock_s=5)).run("x")
    assert result.reason == "model_error" and "past the wall-clock budget" in result.detail
    assert waits == [] and len(server.received) == 1


@api_params
def test_auth_error_is_not_retried(api: Any, server: FakeProvider) -> None:
    server.queue(
        Answer(401, {"error": {"type": "authentication_error", "message": "invalid x-api-key"}})
    )
    result = runtime(api.adapter(server.url), []).run("x")
    assert result.detail == f"ModelAuthError: {api.name} answered HTTP 401: invalid x-api-key"
    assert len(server.received) == 1


@api_params
def test_provider_pairing_rejection_is_recognised(api: Any, server: FakeProvider) -> None:
    text = {
        "anthropic": "messages.2: `tool_use` ids were found without `tool_result` blocks "
        "immediately after: toolu_1",
        "openai-chat": "An assistant message with 'tool_calls' must be followed by tool "
        "messages responding to each 'tool_call_id'.",
        "openai-responses": "No tool output found for function call call_1.",
    }[api.name]
    server.queue(Answer(400, {"error": {"message": text}}))
    result = runtime(api.adapter(server.url), []).run("x")
    assert result.detail.startswith("HistoryError:") and "rejected the history" in result.detail


@api_params
def test_invalid_history_is_refused_before_any_request(api: Any, server: FakeProvider) -> None:
    history = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "check_order", "arguments": "{}"},
                }
            ],
        },
        {"role": "user", "content": "and?"},
    ]
    with pytest.raises(HistoryError, match="call_9"):
        api.adapter(server.url)(history, [])
    assert server.received == []


def test_a_provider_only_rule_stops_the_run_before_sending(server: FakeProvider) -> None:
    """Valid Chat Completions, invalid for Anthropic (tool_use ids allow no spaces): the
    runtime accepts the history, the adapter refuses it before any request."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call 9",
                    "type": "function",
                    "function": {"name": "check_order", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call 9", "content": "{}"},
    ]
    result = runtime(AnthropicApi().adapter(server.url), []).run(history)
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert result.detail.startswith("HistoryError: anthropic: refusing to send")
    assert "'call 9' must match" in result.detail and server.received == []


@api_params
def test_unpriced_model_trips_a_cost_budget(api: Any, server: FakeProvider) -> None:
    server.queue(api.calls([("c1", "check_order", {"order_id": "A"})]))
    executed: list[dict[str, Any]] = []
    model = api.adapter(server.url, prices={}, price_db=False)
    result = runtime(model, executed, budget=Budget(max_cost=10.0)).run("x")
    assert (result.status, result.reason) == ("budget_exhausted", "cost")
    assert executed == []


@api_params
def test_price_override_and_token_budget(api: Any, server: FakeProvider) -> None:
    server.queue(api.calls([("c1", "check_order", {"order_id": "A"})], usage=(800, 300)))
    executed: list[dict[str, Any]] = []
    model = api.adapter(server.url, model="local-model", prices={"local-model": Price(1, 2)})
    result = runtime(model, executed, budget=Budget(max_tokens=1000)).run("x")
    assert (result.status, result.reason) == ("budget_exhausted", "tokens")
    assert result.counters["cost"] == pytest.approx((800 * 1 + 300 * 2) / 1e6)
    assert executed == []


@api_params
@pytest.mark.parametrize(
    "policy,status,reason",
    [
        ("default", "done", "final_answer"),
        ("strict", "protocol_error", "invalid_arguments"),
    ],
)
def test_invalid_arguments_follow_the_policy(
    api: Any, server: FakeProvider, policy: str, status: str, reason: str
) -> None:
    args: Any = '{"order_id": 17, "order_id": 18}' if api.name != "anthropic" else {"order_id": 17}
    server.queue(api.calls([("c1", "check_order", args)]), api.text("Sorry."))
    executed: list[dict[str, Any]] = []
    result = runtime(api.adapter(server.url), executed, policy=policy).run("x")
    assert (result.status, result.reason) == (status, reason) and executed == []
    if policy == "default":
        observed = json.loads(next(m for m in result.messages if m["role"] == "tool")["content"])
        assert observed["error"] == "invalid_arguments"


@api_params
def test_async_twin_runs_the_same_loop(api: Any, server: FakeProvider) -> None:
    server.queue(
        Answer(429, {"error": {"message": "slow down"}}),
        api.calls([("call_1", "check_order", {"order_id": "A17"})]),
        api.text("In transit."),
    )
    waits: list[float] = []

    async def asleep(seconds: float) -> None:
        waits.append(seconds)

    executed: list[dict[str, Any]] = []
    model = api.async_adapter(server.url, sleep=asleep, retry=ModelRetry(backoff_s=0.1))
    result = asyncio.run(runtime(model, executed).arun("Where is A17?"))
    assert (result.status, result.answer) == ("done", "In transit.")
    assert executed == [{"order_id": "A17"}] and waits == [0.1] and len(server.received) == 3


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: OpenAIChatModel("", api_key="k"), "model must be a non-empty model name"),
        (
            lambda: OpenAIChatModel("m", api_key="k", prices={"m": (1, 2)}),
            "prices must map model names to Price",
        ),
        (lambda: OpenAIChatModel("m", api_key="k", retry=3), "retry must be a ModelRetry"),
        (lambda: AnthropicModel("m", api_key="k", max_tokens=0), "max_tokens must be a whole"),
        (lambda: ModelRetry(max_attempts=0), "max_attempts must be a whole number >= 1"),
        (lambda: ModelRetry(backoff_s=-1), "backoff_s must be a number >= 0"),
        (lambda: Price(input=-1, output=1), "Price.input must be a number >= 0"),
    ],
)
def test_configuration_errors_say_what_is_wrong(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@api_params
def test_connection_errors_are_retried(api: Any) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    waits: list[float] = []
    model = api.adapter(
        f"http://127.0.0.1:{port}",
        sleep=no_sleep(waits),
        retry=ModelRetry(max_attempts=2, backoff_s=0.25),
    )
    result = runtime(model, []).run("x")
    assert result.detail.startswith(
        f"ModelUnavailableError: gave up after 2 attempts: {api.name}: APIConnectionError"
    )
    assert waits == [0.25]
