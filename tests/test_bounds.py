"""Sizes are budgets: a model's reply (``max_reply_bytes``), the media of a tool result
(``max_media_bytes``, counted by ``max_output_bytes``), and one result too large to keep.
Every trace written under any budget is one ``fsm-agent check`` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Budget, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.budget import MAX_RECORD_BYTES
from fsm_agent._core.content import Image
from fsm_agent._errors import ConfigError
from fsm_agent._trace.checker import check_events, check_file
from fsm_agent._trace.io import MAX_LINE

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
PNG = b"\x89PNG\r\n\x1a\n"


def _tools(result: Any) -> tuple[ToolRegistry, list[str]]:
    tools, ran = ToolRegistry(), []

    @tools.tool(schema=SCHEMA, effect="read")
    def look(q: str) -> Any:
        ran.append(q)
        return result

    return tools, ran


def _call(q: str, call_id: str = "c1") -> dict[str, Any]:
    args = json.dumps({"q": q})
    return {"id": call_id, "type": "function", "function": {"name": "look", "arguments": args}}


def _run(tmp_path: Path, result: Any, budget: Budget, *replies: dict[str, Any]) -> Any:
    tools, ran = _tools(result)
    script = list(replies) or [
        {"role": "assistant", "content": None, "tool_calls": [_call("x")]},
        {"role": "assistant", "content": "Seen."},
    ]
    rt = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools={"look"},
        budget=budget,
        trace_dir=tmp_path,
    )
    out = rt.run("look")
    (trace,) = tmp_path.glob("*.jsonl")
    assert check_file(trace) == [], "the run's own trace must check"
    return out, ran, trace


def test_a_reply_over_its_budget_stops_with_nothing_parsed_or_run(tmp_path: Path) -> None:
    huge = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("x" * 3_000_000)],
        "usage": {"prompt_tokens": 5, "completion_tokens": 700_000, "extra": "y" * 1000},
    }
    out, ran, trace = _run(tmp_path, {"ok": 1}, Budget(max_reply_bytes=1_000_000), huge)
    assert (out.status, out.reason) == ("budget_exhausted", "reply_size")
    assert out.detail.startswith("a reply of 3001") and "the limit is 1000000" in out.detail
    assert ran == [] and [m["role"] for m in out.messages] == ["user"]
    assert out.counters["tokens"] == 700_005  # its usage still counts
    assert trace.stat().st_size < 5_000  # recorded by its size, not whole
    decision = next(e for e in out.events if e["type"] == "decision")
    assert decision["oversized"] > 3_000_000 and "extra" not in decision["usage"]


def test_a_reply_at_its_budget_runs(tmp_path: Path) -> None:
    reply = {"role": "assistant", "content": "A" * 500}
    size = len(json.dumps(reply).encode())
    out, _, _ = _run(tmp_path, {}, Budget(max_reply_bytes=size), reply)
    assert (out.status, out.answer) == ("done", "A" * 500)


def test_the_checker_recomputes_the_reply_size_guard(tmp_path: Path) -> None:
    reply = {"role": "assistant", "content": None, "tool_calls": [_call("x" * 5000)]}
    out, _, _ = _run(tmp_path, {}, Budget(max_reply_bytes=1000), reply)
    events = [dict(e) for e in out.events]
    # A trace claiming the stop for a reply that its header's budget allowed is refused.
    events[0] = {**events[0], "budget": {**events[0]["budget"], "max_reply_bytes": 10_000}}
    problems = [v.message for v in check_events(events)]
    assert any("reply_too_large" in p for p in problems), problems


def test_budget_bounds_on_one_record_are_checked() -> None:
    assert MAX_RECORD_BYTES * 4 == MAX_LINE  # room for a line's envelope and quotes
    for name in ("max_reply_bytes", "max_media_bytes"):
        with pytest.raises(ConfigError, match=rf"Budget.{name} must be at most 16777216"):
            Budget(**{name: MAX_RECORD_BYTES + 1})
        with pytest.raises(ConfigError, match=rf"Budget.{name} must be a whole number"):
            Budget(**{name: None})  # type: ignore[arg-type]


def test_media_count_toward_the_output_budget(tmp_path: Path) -> None:
    images = [Image(PNG + bytes(400_000)) for _ in range(3)]
    out, _, trace = _run(tmp_path, {"shots": images}, Budget(max_output_bytes=100_000))
    assert (out.status, out.reason) == ("budget_exhausted", "tool_output")
    assert out.counters["output_bytes"] > 1_200_000
    tool = next(m for m in out.messages if m["role"] == "tool")
    # Alone past the budget: kept by its size, never handed on or stored whole.
    assert json.loads(tool["content"]) == {
        "ok": False,
        "error": "output_too_large",
        "bytes": out.counters["output_bytes"],
    }
    assert trace.stat().st_size < 10_000


def test_media_past_the_per_result_cap_are_left_out(tmp_path: Path) -> None:
    images = [Image(PNG + bytes(300_000)), Image(PNG + bytes(300_000)), Image(PNG)]
    budget = Budget(max_output_bytes=2_000_000, max_media_bytes=400_000)
    out, _, _ = _run(tmp_path, {"shots": images}, budget)
    assert out.status == "done"
    tool = next(m for m in out.messages if m["role"] == "tool")
    text, *parts = tool["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url"]  # the 1st and the 3rd
    shots = json.loads(text["text"])["value"]["shots"]
    assert [s.get("part") for s in shots] == [1, None, 2]
    assert "max_media_bytes (400000)" in shots[1]["omitted"]
    kept = 300_008 + 8
    assert out.counters["output_bytes"] == len(text["text"].encode()) + kept


def test_a_result_too_large_to_keep_is_never_kept_even_without_a_budget(
    tmp_path: Path,
) -> None:
    big = "z" * (MAX_RECORD_BYTES + 10)
    out, _, trace = _run(tmp_path, {"blob": big}, Budget(max_output_bytes=None))
    assert (out.status, out.answer) == ("done", "Seen.")  # no limit: the run goes on
    tool = next(m for m in out.messages if m["role"] == "tool")
    assert json.loads(tool["content"])["error"] == "output_too_large"
    assert trace.stat().st_size < 10_000


def test_an_oversized_answer_must_be_the_stand_in(tmp_path: Path) -> None:
    _, _, trace = _run(tmp_path, {"blob": "z" * 5000}, Budget(max_output_bytes=1000))
    lines = trace.read_bytes().splitlines()
    events = [json.loads(line) for line in lines]
    at = next(i for i, e in enumerate(events) if e.get("oversized"))
    forged = {**events[at], "result": {"ok": True, "value": "small"}}
    events[at] = forged
    problems = [v.message for v in check_events(events)]
    assert any("an oversized answer must be" in p for p in problems), problems


def test_a_huge_error_message_is_recorded_bounded(tmp_path: Path) -> None:
    from fsm_agent._core.budget import MAX_ERROR_CHARS

    tools = ToolRegistry()

    @tools.tool(schema=SCHEMA, effect="read")
    def look(q: str) -> Any:
        raise RuntimeError("e" * 5_000_000)

    def model(messages: list[dict[str, Any]], specs: Any) -> dict[str, Any]:
        if len(messages) > 1:
            raise ConnectionError("m" * 5_000_000)
        return {"role": "assistant", "content": None, "tool_calls": [_call("x")]}

    rt = Runtime(model=model, tools=tools, allowed_tools={"look"}, trace_dir=tmp_path)
    out = rt.run("look")
    assert (out.status, out.reason) == ("protocol_error", "model_error")
    (trace,) = tmp_path.glob("*.jsonl")
    assert check_file(trace) == []
    assert trace.stat().st_size < 10 * MAX_ERROR_CHARS  # each message cut, not whole
    failed = next(e for e in out.events if e.get("outcome") == "error")
    assert failed["error"].endswith(f"... ({5_000_000 + 14 - MAX_ERROR_CHARS} more characters)")


def test_the_largest_records_any_budget_allows_make_a_trace_that_checks(
    tmp_path: Path,
) -> None:
    """A reply and a result each just under 16 MiB of JSON text, of the characters JSON
    escapes most (an argument string is JSON inside JSON: 7 bytes for one): every line
    is under the checker's limit."""
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("\x01" * (MAX_RECORD_BYTES // 7 - 200))],
    }
    blob = "\x01" * (MAX_RECORD_BYTES // 6 - 200)
    budget = Budget(max_reply_bytes=MAX_RECORD_BYTES, max_output_bytes=MAX_RECORD_BYTES)
    out, ran, trace = _run(
        tmp_path, {"blob": blob}, budget, reply, {"role": "assistant", "content": "ok"}
    )
    assert (out.status, out.reason, len(ran)) == ("done", "final_answer", 1), out.detail
    observation = next(e for e in out.events if e["type"] == "observation")
    assert "oversized" not in observation  # kept whole: it is within the budget
    longest = max(len(line) for line in trace.read_bytes().splitlines())
    assert MAX_RECORD_BYTES * 0.9 < longest < MAX_LINE


def test_the_new_event_fields_are_declared(tmp_path: Path) -> None:
    """``decision.oversized``/``usage`` and ``observation.oversized``/``media_bytes`` are
    fields of their typed events and of the events' JSON Schema, not ``extra``."""
    from jsonschema import Draft202012Validator

    from fsm_agent._core.events import event_from_json, json_schema

    validator = Draft202012Validator(json_schema())
    huge = {"role": "assistant", "content": "x" * 5000, "usage": {"total_tokens": 3}}
    out, _, _ = _run(tmp_path / "a", {}, Budget(max_reply_bytes=1000), huge)
    images = {"shots": [Image(PNG + bytes(100))]}
    out2, _, _ = _run(tmp_path / "b", images, Budget())
    out3, _, _ = _run(tmp_path / "c", {"blob": "z" * 5000}, Budget(max_output_bytes=1000))
    for event in [*out.events, *out2.events, *out3.events]:
        typed = event_from_json(event)
        assert typed.to_json() == event
        assert not getattr(typed, "extra", None), event
        assert list(validator.iter_errors(event)) == [], event
    decision = next(e for e in out.events if e["type"] == "decision")
    assert event_from_json(decision).oversized == decision["oversized"]  # type: ignore[attr-defined]
