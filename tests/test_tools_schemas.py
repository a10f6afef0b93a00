"""JSON Schema as real tools publish it: ``$ref``/``$defs``/``oneOf``/``anyOf`` from an MCP
server built on the mcp SDK (tests/mcp_nested_server.py), ``nullable`` and ``anyOf`` from
recorded real tool definitions (tests/data/providers), and the checked ``format``s."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from provider_corpus import APIS, chat_specs, load

from fsm_agent import Runtime, ScriptedModel, ToolRegistry
from fsm_agent.tools._mcp import register_mcp_tools, stdio_client
from fsm_agent.tools._registry import CHECKED_FORMATS, translate_nullable

SERVER = str(Path(__file__).with_name("mcp_nested_server.py"))


def call(cid: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": "ship", "arguments": json.dumps(args)},
    }


HOME = {"street": "1 Main St", "city": "Oslo"}


def test_defs_refs_oneof_anyof_from_an_mcp_server(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    cases: list[dict[str, Any]] = [
        {"address": HOME, "payment": {"kind": "card", "last4": "1234"}, "gift": None},
        {"address": HOME, "payment": {"kind": "card", "last4": "12a4"}},  # pattern
        {"address": HOME, "payment": {"kind": "invoice", "email": "nobody"}},  # format email
        {"address": {**HOME, "country": "NO"}, "payment": {"kind": "card", "last4": "1234"}},
        {"address": HOME, "payment": {"kind": "card", "last4": "1234", "email": "a@b.c"}},
        {"address": HOME, "payment": {"kind": "invoice", "email": "a@b.c"}, "gift": HOME},
    ]

    async def scenario() -> Any:
        async with stdio_client(sys.executable, SERVER, env={"CALL_LOG": str(log)}) as client:
            tools = ToolRegistry()
            await register_mcp_tools(tools, client, effects={"ship": "write"})
            schema = json.dumps(tools["ship"].schema)
            assert all(k in schema for k in ('"$defs"', '"$ref"', '"oneOf"', '"anyOf"'))
            decisions = [
                {"role": "assistant", "content": None, "tool_calls": [call(f"c{i}", a)]}
                for i, a in enumerate(cases)
            ]
            runtime = Runtime(
                model=ScriptedModel([*decisions, {"role": "assistant", "content": "ok"}]),
                tools=tools,
                allowed_tools={"ship"},
            )
            return await runtime.arun("ship it")

    result = asyncio.run(scenario())
    assert result.status == "done", result.detail
    outcomes = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"]
    assert [o["ok"] for o in outcomes] == [True, False, False, False, False, True]
    assert "not valid under any of the given schemas" in outcomes[1]["detail"]  # oneOf
    assert "not valid under any of the given schemas" in outcomes[2]["detail"]
    assert "country" in outcomes[3]["detail"]
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["payment"]["kind"] for s in sent] == ["card", "invoice"]  # only the valid two


def recorded_schema(name: str) -> dict[str, Any]:
    for api in APIS:
        for e in load(api):
            for spec in chat_specs(e.request.get("tools")):
                if spec["function"]["name"] == name:
                    parameters: dict[str, Any] = spec["function"]["parameters"]
                    return parameters
    raise LookupError(name)


def test_nullable_in_a_real_schema_accepts_null() -> None:
    schema = recorded_schema("insert_level_with_spaces")
    assert schema["properties"]["level"]["nullable"] is True
    tools = ToolRegistry()
    tool = tools.register(lambda **_: None, name="insert", schema=schema, effect="write")
    assert "nullable" not in json.dumps(tool.schema)

    def level_errors(value: Any) -> list[Any]:
        errors = tool.validator.iter_errors({"level": value})
        return [e for e in errors if list(e.absolute_path)[:1] == ["level"]]

    assert level_errors(None) == []
    assert level_errors(3)  # still typed


def test_anyof_in_a_real_mcp_schema() -> None:
    schema = recorded_schema("ask_question")  # DeepWiki's MCP server, as recorded
    tool = ToolRegistry().register(lambda **_: None, name="ask", schema=schema, effect="read")
    ok = [{"repoName": "a/b", "question": "?"}, {"repoName": ["a/b", "c/d"], "question": "?"}]
    assert all(not list(tool.validator.iter_errors(x)) for x in ok)
    assert list(tool.validator.iter_errors({"repoName": 1, "question": "?"}))


@pytest.mark.parametrize(
    "fmt,good,bad",
    [
        ("date-time", "2024-01-15T14:30:25Z", "2024-01-15 14:30"),
        ("date", "2024-02-29", "2023-02-29"),
        ("time", "14:30:25+02:00", "25:00:00Z"),
        ("uri", "https://example.com/a?b=c", "not a uri"),
        ("uri-reference", "../a/b", "\\\\bad"),
        ("hostname", "api.example.com", "-bad-.example"),
        ("email", "a@example.com", "nobody"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567"),
        ("ipv4", "192.0.2.1", "256.0.0.1"),
        ("ipv6", "2001:db8::1", "2001:db8:::1"),
        ("json-pointer", "/a/b", "a/b"),
        ("duration", "P3DT4H", "3 days"),
    ],
)
def test_checked_formats(fmt: str, good: str, bad: str) -> None:
    assert fmt in CHECKED_FORMATS
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}}
    tool = ToolRegistry().register(lambda **_: None, name="t", schema=schema, effect="read")
    assert list(tool.validator.iter_errors({"v": good})) == []
    assert list(tool.validator.iter_errors({"v": bad}))


def test_unchecked_formats_are_annotations() -> None:
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": "regex"}}}
    tool = ToolRegistry().register(lambda **_: None, name="t", schema=schema, effect="read")
    assert list(tool.validator.iter_errors({"v": "(?<x>a)"})) == []  # ECMA-262, not Python


def test_translate_nullable_forms() -> None:
    assert translate_nullable({"type": "string", "nullable": True}) == {"type": ["string", "null"]}
    assert translate_nullable({"enum": ["a"], "type": "string", "nullable": True}) == {
        "enum": ["a", None],
        "type": ["string", "null"],
    }
    assert translate_nullable({"$ref": "#/$defs/A", "nullable": True}) == {
        "anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]
    }
    assert translate_nullable({"type": "string", "nullable": False}) == {"type": "string"}
