"""Runtime.stream / Runtime.astream: live typed events, observation only, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from conftest import Backend, FakeClock, assert_valid_run, call, calls, make_runtime, say

from fsm_agent import RetryPolicy, Runtime
from fsm_agent._core.events import Event, TextDelta, ToolArgsDelta
from fsm_agent._trace.checker import check_events
from fsm_agent.models import StreamingScriptedModel


def _script() -> list[Any]:
    return [
        calls(call("c1", "lookup", order_id="A17"), content="Let me look that up."),
        say("A17 is in transit, arriving Thursday."),
    ]


def _runtime(script: list[Any], backend: Backend | None = None, **kw: Any) -> Runtime:
    chunk = kw.pop("chunk", 4)
    runtime = make_runtime(script, backend, **kw)
    runtime.model = StreamingScriptedModel(script, chunk=chunk)
    return runtime


def _lifecycle(events: list[Event]) -> list[dict[str, Any]]:
    return [e.to_json() for e in events if not e.type.endswith("_delta")]


def test_stream_yields_deltas_and_every_lifecycle_event_in_seq_order() -> None:
    backend = Backend()
    runtime = _runtime(_script(), backend)
    with runtime.stream("Where is A17?") as run:
        events = list(run)
    result = run.result
    assert result.status == "done"
    assert_valid_run(result)
    # every recorded event, in order, and nothing else but deltas
    assert _lifecycle(events) == result.events
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Let me look that up.A17 is in transit, arriving Thursday."
    args = "".join(e.fragment for e in events if isinstance(e, ToolArgsDelta))
    assert args == '{"order_id": "A17"}'
    assert {e.call_id for e in events if isinstance(e, ToolArgsDelta)} == {"c1"}
    assert all(e.run_id == result.run_id for e in events)


def test_streaming_only_observes_the_run_is_the_same_as_run() -> None:
    streamed = _runtime(_script())
    with streamed.stream("Where is A17?", run_id="r") as run:
        list(run)
    plain = make_runtime(_script()).run("Where is A17?", run_id="r")

    def strip(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: unstreamed(v) for k, v in e.items() if k not in ("t",)} for e in events]

    def unstreamed(value: Any) -> Any:  # what streaming adds: the blocks' summaries
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != "streamed"}
        return value

    decisions = [e for e in run.result.events if e["type"] == "decision"]
    assert all(d["message"]["streamed"] for d in decisions)
    assert strip(run.result.events) == strip(plain.events)
    assert [unstreamed(m) for m in run.result.messages] == plain.messages


def test_no_tool_starts_before_the_whole_message_arrived() -> None:
    seen: list[str] = []
    backend = Backend()
    lookup = backend.lookup

    def watched(order_id: str) -> dict[str, Any]:
        seen.append("tool")
        return lookup(order_id)

    backend.lookup = watched  # type: ignore[method-assign]
    runtime = _runtime(_script(), backend, chunk=1)
    with runtime.stream("Where is A17?") as run:
        order = []
        for e in run:
            order.append(e.type)
            if e.type == "observation":
                assert seen == ["tool"]
    first_decision = order.index("decision")
    assert "tool_args_delta" not in order[first_decision : order.index("observation")]
    assert order[:first_decision].count("tool_args_delta") == len('{"order_id": "A17"}')


def test_a_cut_stream_is_a_failed_model_call_and_nothing_of_it_runs() -> None:
    backend = Backend()
    script = [calls(call("c1", "write", request_id="R-1", title="t"))]
    runtime = make_runtime(script, backend, retry=RetryPolicy(max_attempts=1))
    runtime.model = StreamingScriptedModel(script, cut_after=3)
    with runtime.stream("file it") as run:
        events = list(run)
    result = run.result
    assert backend.writes == []
    assert result.status == "protocol_error" and result.reason == "model_error"
    assert "cut" in result.detail
    assert sum(e.type == "tool_args_delta" for e in events) == 3
    assert_valid_run(result)


@pytest.mark.parametrize("leave_after", ["text_delta", "decision", "observation"])
def test_leaving_the_block_early_ends_the_run_cancelled(leave_after: str) -> None:
    runtime = _runtime(_script())
    # capacity 1: the driver is at most an event ahead of the consumer (with room for a
    # whole run it may well finish before the consumer leaves: then it ended `done`)
    with runtime.stream("Where is A17?", capacity=1) as run:
        for e in run:
            if e.type == leave_after:
                break
    result = run.result
    assert result.status == "cancelled"
    assert_valid_run(result)  # no dangling call, a trace that checks
    assert check_events(result.events) == []
    assert not any(
        m.get("role") == "assistant" and m.get("content") == "A17 is in transit, arriving Thursday."
        for m in result.messages
    )


def test_cancel_from_another_thread_while_the_consumer_waits() -> None:
    gate = threading.Event()
    backend = Backend()
    lookup = backend.lookup

    def slow(order_id: str) -> dict[str, Any]:
        gate.wait(5)
        return lookup(order_id)

    backend.lookup = slow  # type: ignore[method-assign]
    runtime = _runtime(_script(), backend)
    with runtime.stream("Where is A17?") as run:
        for e in run:
            if e.type == "decision":
                run.cancel()
                gate.set()
    assert run.result.status == "cancelled"
    assert_valid_run(run.result)


def test_a_cancelled_streamed_run_is_stored_and_can_be_resumed() -> None:
    runtime = _runtime(_script())
    with runtime.stream("Where is A17?", run_id="s1", capacity=1) as run:
        for e in run:
            if e.type == "decision":
                break
    assert run.result.status == "cancelled"
    again = runtime.resume("s1")
    assert again.status == "cancelled"
    assert again.events == run.result.events


def test_a_slow_consumer_slows_the_run_and_memory_stays_bounded() -> None:
    long = "x" * 4000
    script = [say(long)]
    runtime = _runtime(script, chunk=1)
    with runtime.stream("go", capacity=8) as run:
        got = []
        for e in run:
            got.append(e)
            if len(got) < 20:
                time.sleep(0.002)
    assert run.result.status == "done"
    assert "".join(e.text for e in got if isinstance(e, TextDelta)) == long
    assert run.high_water <= 8 + 8  # capacity + one transition's events
    assert run.coalesced > 0  # 4000 deltas did not all wait: they merged under pressure
    assert _lifecycle(got) == run.result.events  # lifecycle events never dropped


def test_a_model_error_inside_the_run_is_not_raised_from_the_block() -> None:
    runtime = make_runtime([RuntimeError("boom")])
    with runtime.stream("go") as run:
        types = [e.type for e in run]
    assert run.result.status == "protocol_error"
    assert types[0] == "run_start" and types[-1] == "run_end"


def test_result_before_the_end_says_when_it_is_there() -> None:
    runtime = _runtime(_script())
    with runtime.stream("go", capacity=1) as run:
        with pytest.raises(RuntimeError, match="once the run ended"):
            _ = run.result
        list(run)


def test_bad_capacity_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="capacity must be a whole number >= 1"):
        _runtime(_script()).stream("go", capacity=0)


# ── async ─────────────────────────────────────────────────────────────────────────


def test_astream_yields_the_same_events_as_stream() -> None:
    with _runtime(_script()).stream("Where is A17?", run_id="a") as run:
        sync_events = [e.to_json() for e in run]

    async def go() -> tuple[list[dict[str, Any]], Any]:
        async with _runtime(_script()).astream("Where is A17?", run_id="a") as arun:
            events = [e.to_json() async for e in arun]
        return events, arun.result

    events, result = asyncio.run(go())

    def strip(es: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k != "t"} for e in es]

    assert strip(events) == strip(sync_events)
    assert result.status == "done"
    assert_valid_run(result)


def test_cancelling_the_consuming_task_ends_the_run_cancelled() -> None:
    gate = asyncio.Event()
    tools_ran: list[str] = []

    async def go() -> Any:
        runtime = _runtime(_script())
        runtime.tools.get("lookup")  # registered by make_runtime
        holder: dict[str, Any] = {}

        async def consume() -> None:
            async with runtime.astream("Where is A17?", capacity=1) as arun:
                holder["run"] = arun
                async for e in arun:
                    if e.type == "decision":
                        gate.set()
                        await asyncio.sleep(10)

        task = asyncio.create_task(consume())
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return holder["run"].result

    result = asyncio.run(go())
    assert result.status == "cancelled"
    assert tools_ran == []
    assert_valid_run(result)


def test_astream_leaving_early_and_cancel() -> None:
    async def go() -> Any:
        async with _runtime(_script()).astream("Where is A17?", capacity=1) as arun:
            async for e in arun:
                if e.type == "text_delta":
                    break
        return arun.result

    result = asyncio.run(go())
    assert result.status == "cancelled"
    assert_valid_run(result)


def test_clock_is_untouched_by_streaming() -> None:
    clock = FakeClock()
    runtime = _runtime(_script(), clock=clock)
    with runtime.stream("go") as run:
        list(run)
    assert run.result.counters == make_runtime(_script(), clock=FakeClock()).run("go").counters
