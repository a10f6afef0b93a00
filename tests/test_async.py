"""arun() drives the same machine as run(): same path, same events; async parts work."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from conftest import Backend, TransientToolError, assert_valid_run, call, calls, make_runtime, say

from fsm_agent import RetryPolicy, Runtime, ScriptedModel, ToolRegistry
from fsm_agent.tools._registry import Effect


def _strip(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("t", "run_id")} for e in events]


def test_arun_and_run_produce_the_same_trace() -> None:
    def script() -> list[Any]:
        return [
            calls(
                call("c1", "lookup", order_id="A17"),
                call("w1", "write", request_id="R-1", title="t"),
            ),
            calls(call("w2", "write", request_id="R-1", title="t")),
            say("done"),
        ]

    b1, b2 = Backend(), Backend()
    b1.fail_reads.append(TransientToolError("busy"))
    b2.fail_reads.append(TransientToolError("busy"))
    sync = make_runtime(script(), b1).run("go", run_id="same")
    asyn = asyncio.run(make_runtime(script(), b2).arun("go", run_id="same"))
    assert _strip(sync.events) == _strip(asyn.events)
    assert sync.messages == asyn.messages and sync.counters == asyn.counters
    assert_valid_run(asyn)


def test_async_model_and_async_tools() -> None:
    tools = ToolRegistry()
    seen: list[str] = []

    @tools.tool(schema={"type": "object", "properties": {"q": {"type": "string"}}}, effect="read")
    async def search(q: str) -> list[str]:
        await asyncio.sleep(0)
        seen.append(q)
        return [q.upper()]

    script = ScriptedModel(
        [calls(call("c1", "search", q="a"), call("c2", "search", q="b")), say("found")]
    )

    async def model(messages: Any, specs: Any) -> Any:
        await asyncio.sleep(0)
        return script(messages, specs)

    result = asyncio.run(Runtime(model=model, tools=tools, allowed_tools={"search"}).arun("x"))
    assert result.status == "done" and seen == ["a", "b"]
    assert json.loads(result.messages[3]["content"])["value"] == ["B"]


def _slow_tools(
    effect: Effect, delay: float, calls_made: list[str], *, is_async: bool
) -> ToolRegistry:
    tools = ToolRegistry()
    schema = {"type": "object", "properties": {"k": {"type": "string"}}}
    key = (lambda a: a["k"]) if effect == "write" else None
    if is_async:

        async def slow(k: str) -> str:
            calls_made.append(k)
            await asyncio.sleep(delay)
            return k

        tools.register(
            slow, name="slow", effect=effect, schema=schema, timeout_s=0.05, idempotency_key=key
        )
    else:

        def slow_sync(k: str) -> str:
            calls_made.append(k)
            time.sleep(delay)
            return k

        tools.register(
            slow_sync,
            name="slow",
            effect=effect,
            schema=schema,
            timeout_s=0.05,
            idempotency_key=key,
        )
    return tools


@pytest.mark.parametrize("is_async", [True, False])
def test_a_read_that_times_out_is_retried_then_answered(is_async: bool) -> None:
    made: list[str] = []
    rt = Runtime(
        model=ScriptedModel([calls(call("c1", "slow", k="x")), say("gave up")]),
        tools=_slow_tools("read", 0.3, made, is_async=is_async),
        allowed_tools={"slow"},
        retry=RetryPolicy(max_attempts=2, backoff_s=0),
    )
    result = asyncio.run(rt.arun("x")) if is_async else rt.run("x")
    assert_valid_run(result)
    assert made == ["x", "x"] and result.status == "done"
    assert json.loads(result.messages[2]["content"])["error"] == "timeout"


@pytest.mark.parametrize("is_async", [True, False])
def test_a_write_that_times_out_stops_for_review(is_async: bool) -> None:
    made: list[str] = []
    rt = Runtime(
        model=ScriptedModel([calls(call("c1", "slow", k="x"))]),
        tools=_slow_tools("write", 0.3, made, is_async=is_async),
        allowed_tools={"slow"},
        retry=RetryPolicy(max_attempts=3, backoff_s=0),
    )
    result = asyncio.run(rt.arun("x")) if is_async else rt.run("x")
    assert_valid_run(result)
    assert made == ["x"]
    assert (result.status, result.reason) == ("review_required", "outcome_unknown")
    assert "no result within 0.050s" in result.detail


def test_a_deduplicated_write_is_retried_under_the_same_key() -> None:
    tools = ToolRegistry()
    keys: list[str] = []

    def send(request_id: str) -> str:
        keys.append(request_id)
        if len(keys) == 1:
            raise TransientToolError("503")
        return "sent"

    tools.register(
        send,
        name="send",
        effect="write",
        dedup=True,
        idempotency_key=lambda a: a["request_id"],
        schema={"type": "object", "properties": {"request_id": {"type": "string"}}},
    )
    rt = Runtime(
        model=ScriptedModel([calls(call("c1", "send", request_id="R-9")), say("ok")]),
        tools=tools,
        allowed_tools={"send"},
        retry=RetryPolicy(backoff_s=0),
    )
    result = rt.run("x")
    assert result.status == "done" and keys == ["R-9", "R-9"]
    assert result.counters["write_attempts"] == 2 and result.counters["retries"] == 1


def test_cancelling_arun_mid_write_ends_the_trace_in_review() -> None:
    tools = ToolRegistry()
    started = asyncio.Event()
    landed: list[str] = []

    async def send(request_id: str) -> str:
        started.set()
        await asyncio.sleep(10)
        landed.append(request_id)
        return "sent"

    tools.register(
        send,
        name="send",
        effect="write",
        idempotency_key=lambda a: a["request_id"],
        schema={"type": "object", "properties": {"request_id": {"type": "string"}}},
    )
    events: list[dict[str, Any]] = []

    class Sink:
        def write(self, event: dict[str, Any]) -> None:
            events.append(event)

        def close(self) -> None:
            pass

    rt = Runtime(
        model=ScriptedModel(
            [calls(call("c1", "send", request_id="R-1"), call("c2", "send", request_id="R-2"))]
        ),
        tools=tools,
        allowed_tools={"send"},
    )

    async def main() -> None:
        task = asyncio.create_task(rt.arun("go", trace=Sink()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    end = events[-1]
    assert (end["type"], end["status"], end["reason"]) == (
        "run_end",
        "review_required",
        "outcome_unknown",
    )
    answers = [(e["call_id"], e["result"]["error"]) for e in events if e["type"] == "observation"]
    assert answers == [("c1", "outcome_unknown"), ("c2", "skipped_pending_review")]
    record = rt.store.get_intent("send", "R-1")
    assert record is not None and record.status == "pending"  # never redone under R-1
