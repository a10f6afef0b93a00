"""Bytes at the boundary (R12): nothing a model or a tool hands back makes ``run()``
raise, and every trace, store row and history is strict UTF-8 JSON.

Named cases first (each one raised out of ``run()`` or wrote an unreadable trace in
0.1), then Hypothesis over hostile model replies and hostile tool results, through a
file trace and a SQLite store.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_agent import JsonlTrace, MemoryStore, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.history import check_history
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._trace.chain import strip_links
from fsm_agent._trace.checker import check_events, check_file
from fsm_agent.testing._strategies import Unprintable, hostile_replies, hostile_values

WRITE = {"request_id": "R-1", "title": "refund"}


def _no_constant(name: str) -> Any:
    raise AssertionError(f"bare {name} in a trace")


def strict(value: Any) -> None:
    """``value`` is strict UTF-8 JSON: no NaN/Infinity, no lone surrogate."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
    json.loads(text, parse_constant=_no_constant)


def assert_sound(result: Any) -> None:
    assert result.events[-1]["type"] == "run_end"
    assert check_history(result.messages) == []
    strict(result.messages)
    strict(result.events)
    assert check_events(result.events) == []


# ── model-controlled bytes ────────────────────────────────────────────────────────


def test_a_lone_surrogate_in_the_answer_is_replaced_not_raised() -> None:
    result = make_runtime([say("Done \ud800 here")]).run("x")
    assert (result.status, result.answer) == ("done", "Done \ufffd here")
    assert_sound(result)


@pytest.mark.parametrize(
    "arguments",
    [
        '{"order_id": "A\ud800"}',
        '{"order_id": "A\\ud800"}',
        '{"order_id": 1e400}',
        '{"order_id": ' + "7" * 4400 + "}",
        '{"order_id": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
    ids=["surrogate", "surrogate-escape", "1e400", "huge-int", "deep"],
)
def test_unrepresentable_arguments_are_invalid_arguments(arguments: str) -> None:
    b = Backend()
    result = make_runtime([calls(call("c1", "lookup", arguments)), say("ok")], b).run("x")
    assert json.loads(result.messages[2]["content"])["error"] == "invalid_arguments"
    assert b.lookups == [] and result.status == "done"
    assert_sound(result)


def test_1e400_in_an_approved_keyed_write_neither_raises_nor_breaks_resume(tmp_path: Path) -> None:
    b = Backend()
    bad = call("w1", "write", '{"request_id": "R-1", "title": 1e400}')
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = make_runtime([calls(bad), say("ok")], b, store=store, approval=True)
        result = rt.run("x", run_id="r1")
        assert result.status == "done" and b.writes == []
        assert "out of range" in json.loads(result.messages[2]["content"])["detail"]
        assert rt.resume("r1").status == "done"  # the stored run reads back
        assert_sound(result)


def test_huge_and_hostile_usage_counts_as_unmetered() -> None:
    from fsm_agent import Budget

    usage = {"prompt_tokens": 10**5000, "completion_tokens": float("inf"), "cost": float("nan")}
    plain = make_runtime([say("ok", usage=usage)]).run("x")
    assert plain.status == "done" and plain.counters["tokens"] == 0
    capped = make_runtime([say("ok", usage=usage)], budget=Budget(max_tokens=100)).run("x")
    assert (capped.status, capped.reason) == ("budget_exhausted", "usage_unknown")
    assert "no token usage" in capped.detail and capped.usage_unknown
    assert_sound(plain)


def test_a_hostile_reply_through_the_openai_adapter(tmp_path: Path) -> None:
    """End to end: the official SDK parses a lone-surrogate escape out of a real HTTP
    body; the run ends, the history stays sendable."""
    pytest.importorskip("openai")
    from fake_provider import Answer, FakeProvider

    from fsm_agent.models._openai_chat import OpenAIChatModel

    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Order \\ud800 is late"},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    with FakeProvider() as server:
        server.answers.append(
            Answer(body=json.dumps(body).replace("\\\\ud800", "\\ud800").encode())
        )
        model = OpenAIChatModel(model="gpt-4o", base_url=server.url + "/v1", api_key="k")
        tools = ToolRegistry()
        result = Runtime(model=model, tools=tools, allowed_tools=()).run("where?")
    assert result.status == "done" and "\ufffd" in (result.answer or "")
    assert_sound(result)


# ── tool-controlled bytes ─────────────────────────────────────────────────────────


def _tool_runtime(value: Any, **options: Any) -> Runtime:
    tools = ToolRegistry()

    def produce(key: str) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value() if callable(value) and not isinstance(value, type) else value

    tools.register(
        produce,
        name="produce",
        effect="read",
        schema={"type": "object", "properties": {"key": {"type": "string"}}},
    )
    script = [calls(call("c1", "produce", key="x")), say("ok")]
    return Runtime(model=ScriptedModel(script), tools=tools, allowed_tools={"produce"}, **options)


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of the exception raised")


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize(
    "value",
    [
        float("inf"),
        float("nan"),
        {"x": -math.inf},
        10**5000,
        _deep(2000),
        Unprintable(),
        [Unprintable()],
        {1: "int key", (2, 3): "tuple key"},
        b"\xff\xfe bytes",
        object(),
    ],
    ids=[
        "inf",
        "nan",
        "neg-inf",
        "huge-int",
        "deep",
        "unprintable",
        "unprintable-in-list",
        "odd-keys",
        "bytes",
        "object",
    ],
)
def test_hostile_tool_results_are_made_json_safe(tmp_path: Path, value: Any) -> None:
    result = _tool_runtime(value).run("x", trace=tmp_path / "t.jsonl")
    assert result.status == "done"
    assert json.loads(result.messages[2]["content"])["ok"] is True
    assert_sound(result)
    assert check_file(tmp_path / "t.jsonl") == []  # the file parses strictly too


def test_a_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "w") as handle:
        handle.write("x")  # a Latin-1 name: os.listdir() gives "caf\udce9.txt"
    result = _tool_runtime(lambda: os.listdir(folder)).run("x")
    assert "caf\ufffd.txt" in result.messages[2]["content"]
    assert_sound(result)


def test_an_exception_whose_str_raises() -> None:
    result = _tool_runtime(BadStr()).run("x")
    got = json.loads(result.messages[2]["content"])
    assert got["error"] == "tool_failed" and "BadStr" in got["detail"]
    assert_sound(result)


# ── Hypothesis: anything at all ───────────────────────────────────────────────────

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(reply=hostile_replies())
def test_any_hostile_reply_ends_the_run_soundly(reply: Any) -> None:
    b = Backend()
    rt = make_runtime([reply, say("fine")], b, store=MemoryStore())
    result = rt.run("x")
    assert result.status in ("done", "protocol_error", "budget_exhausted")
    assert_sound(result)


@FUZZ
@given(value=hostile_values())
def test_any_hostile_tool_result_ends_the_run_soundly(value: Any) -> None:
    result = _tool_runtime(lambda: value).run("x")
    assert result.status == "done"
    assert_sound(result)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=hostile_values(), reply=hostile_replies())
def test_hostile_bytes_reach_a_sqlite_store_and_a_file_strictly(
    tmp_path_factory: Any, value: Any, reply: Any
) -> None:
    folder = tmp_path_factory.mktemp("hostile")
    with SqliteStore(folder / "runs.db") as store:
        tools = ToolRegistry()
        tools.register(
            lambda key: value,
            name="lookup",
            effect="read",
            schema={"type": "object"},
            allow_extra_fields=True,
        )
        script = [reply, calls(call("c9", "lookup", key="k")), say("ok")]
        rt = Runtime(
            model=ScriptedModel(script), tools=tools, allowed_tools={"lookup"}, store=store
        )
        result = rt.run("x", run_id="r1", trace=JsonlTrace(folder / "t.jsonl"))
        # (stored events are the trace's chained lines: the events plus run id and link)
        stored = strip_links(store.load_run("r1").events)
        assert stored == json.loads(json.dumps(result.events))
    assert check_file(folder / "t.jsonl") == []
    assert_sound(result)


@given(st.just(None))
def test_hypothesis_is_wired(_: None) -> None:  # the fuzz tests above really run examples
    assert FUZZ.max_examples == 150
