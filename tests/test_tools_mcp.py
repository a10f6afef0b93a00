"""MCP tools from a real stdio server (tests/mcp_shop_server.py), driven by ``arun``.

The server logs every call it receives, so the tests show that our strict validation
runs first: a ``"3"`` for an integer, or an unknown field, never reaches it (the MCP
server itself would have coerced and dropped them and executed the call).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from fake_provider import FakeProvider
from provider_shapes import ChatApi

from fsm_agent import Budget, Runtime, ScriptedModel, ToolRegistry
from fsm_agent.models import AsyncOpenAIChatModel
from fsm_agent.tools._mcp import (
    McpBridge,
    McpServerStartError,
    list_mcp_tools,
    register_mcp_tools,
    stdio_client,
    suggested_effects,
)

SERVER = str(Path(__file__).with_name("mcp_shop_server.py"))


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def calls(*c: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(c)}


def logged(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


def test_mcp_tools_with_a_real_adapter(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    chat = ChatApi()

    async def scenario() -> None:
        async with stdio_client(sys.executable, SERVER, env={"CALL_LOG": str(log)}) as client:
            infos = await list_mcp_tools(client)
            assert suggested_effects(infos) == {"get_stock": "read", "place_order": "write"}
            tools = ToolRegistry()
            with pytest.raises(
                ValueError,
                match=r"no effect given for place_order \(server "
                r"hints not read-only\)",
            ):
                await register_mcp_tools(tools, client, effects={"get_stock": "read"})
            with pytest.raises(ValueError, match="does not list get_stok"):
                await register_mcp_tools(tools, client, effects={"get_stok": "read"})
            with pytest.raises(ValueError, match=r"not valid tool names .*shop\.get_stock"):
                await register_mcp_tools(
                    tools,
                    client,
                    prefix="shop.",
                    effects={"get_stock": "read", "place_order": "write"},
                )
            await register_mcp_tools(
                tools, client, prefix="shop_", effects={"get_stock": "read", "place_order": "write"}
            )
            assert tools["shop_get_stock"].effect == "read"
            assert tools["shop_place_order"].schema["additionalProperties"] is False

            with FakeProvider() as server:
                server.queue(
                    chat.calls(
                        [("c1", "shop_get_stock", {"sku": "A1", "quantity": "3", "rush": True})]
                    ),
                    chat.calls(
                        [
                            ("c2", "shop_get_stock", {"sku": "A1", "quantity": 3}),
                            ("c3", "shop_place_order", {"sku": "A1", "quantity": 3}),
                        ]
                    ),
                    chat.text("Ordered 3 x A1."),
                )
                model = AsyncOpenAIChatModel(
                    "gpt-4o-mini",
                    client=openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test"),
                )
                runtime = Runtime(
                    model=model,
                    tools=tools,
                    allowed_tools={"shop_get_stock", "shop_place_order"},
                    budget=Budget(max_wall_clock_s=30),
                )
                with pytest.raises(ValueError, match=r"use 'await runtime\.arun"):
                    runtime.run("Order 3 x A1 if in stock.")
                result = await runtime.arun("Order 3 x A1 if in stock.")
                sent_tools = server.received[0].body["tools"]

            assert (result.status, result.answer) == ("done", "Ordered 3 x A1.")
            first, stock, order = results(result.messages)
            assert first["error"] == "invalid_arguments"
            assert "quantity" in first["detail"] and "rush" in first["detail"]
            assert stock["value"] == {"sku": "A1", "in_stock": True}
            assert order["value"] == {"result": "order 1 placed: 3 x A1"}
            assert {t["function"]["name"] for t in sent_tools} == {
                "shop_get_stock",
                "shop_place_order",
            }

    asyncio.run(scenario())
    assert logged(log) == [  # the "3" and the unknown field never reached the server
        {"tool": "get_stock", "arguments": {"sku": "A1", "quantity": 3}},
        {"tool": "place_order", "arguments": {"sku": "A1", "quantity": 3}},
    ]


def test_strict_policy_and_write_errors(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    effects: Any = {"get_stock": "read", "place_order": "write"}

    async def scenario() -> None:
        async with stdio_client(sys.executable, SERVER, env={"CALL_LOG": str(log)}) as client:
            tools = ToolRegistry()
            await register_mcp_tools(tools, client, effects=effects)
            allowed = {"get_stock", "place_order"}

            strict = Runtime(
                model=ScriptedModel(
                    [calls(call("c1", "get_stock", {"sku": "A1", "quantity": "3"}))]
                ),
                tools=tools,
                allowed_tools=allowed,
                policy="strict",
            )
            result = await strict.arun("x")
            assert (result.status, result.reason) == ("protocol_error", "invalid_arguments")
            assert logged(log) == []

            # An isError from a write may have taken effect: stop for review, run nothing more.
            lost = Runtime(
                model=ScriptedModel(
                    [
                        calls(
                            call("c1", "place_order", {"sku": "B2", "quantity": 500}),
                            call("c2", "get_stock", {"sku": "B2", "quantity": 1}),
                        )
                    ]
                ),
                tools=tools,
                allowed_tools=allowed,
            )
            result = await lost.arun("x")
            assert (result.status, result.reason) == ("review_required", "outcome_unknown")
            assert "warehouse timed out" in result.detail
            assert [r["error"] for r in results(result.messages)] == [
                "outcome_unknown",
                "skipped_pending_review",
            ]

            # The registrar may declare a tool's errors definite rejections instead.
            declared = ToolRegistry()
            await register_mcp_tools(
                declared,
                client,
                effects=effects,
                rejected_on_error={"place_order"},
                only=["place_order"],
            )
            rejected = Runtime(
                model=ScriptedModel(
                    [
                        calls(call("c1", "place_order", {"sku": "B2", "quantity": 500})),
                        {"role": "assistant", "content": "The order was refused."},
                    ]
                ),
                tools=declared,
                allowed_tools={"place_order"},
            )
            result = await rejected.arun("x")
            assert (result.status, result.answer) == ("done", "The order was refused.")
            assert results(result.messages)[0]["error"] == "rejected"

    asyncio.run(scenario())
    assert [c["arguments"]["quantity"] for c in logged(log)] == [500, 500]


def test_bridge_lets_sync_run_call_mcp_tools(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    with McpBridge(stdio_client(sys.executable, SERVER, env={"CALL_LOG": str(log)})) as server:
        assert [i.name for i in server.list_tools()] == ["get_stock", "place_order"]
        tools = ToolRegistry()
        server.register(tools, effects={"get_stock": "read"}, only=["get_stock"])
        runtime = Runtime(
            model=ScriptedModel(
                [
                    calls(call("c1", "get_stock", {"sku": "A1", "quantity": "3"})),
                    calls(call("c2", "get_stock", {"sku": "A1", "quantity": 9})),
                    {"role": "assistant", "content": "Not enough stock."},
                ]
            ),
            tools=tools,
            allowed_tools={"get_stock"},
        )
        result = runtime.run("Is A1 in stock?")
    assert (result.status, result.answer) == ("done", "Not enough stock.")
    first, second = results(result.messages)
    assert first["error"] == "invalid_arguments"
    assert second["value"] == {"sku": "A1", "in_stock": False}
    assert logged(log) == [{"tool": "get_stock", "arguments": {"sku": "A1", "quantity": 9}}]
    with pytest.raises(RuntimeError, match="not open"):
        server.list_tools()


def test_bridge_reports_a_server_that_cannot_start(tmp_path: Path) -> None:
    with (
        pytest.raises(McpServerStartError, match="no-such-server"),
        McpBridge(stdio_client(str(tmp_path / "no-such-server"))),
    ):
        pass
