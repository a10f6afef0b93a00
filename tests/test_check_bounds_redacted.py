"""``check`` replays what the size budgets record (media counted by ``media_bytes``, a
result kept by its size, an error message cut) exactly, so an edit of any of those fields
is a violation; and a trace written through a redaction hook says so in its header, so
``check`` reports its payload differences as a note while every other trace stays strict."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_bounds import PNG, SCHEMA, _call, _run

from fsm_agent import Budget, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.content import Image
from fsm_agent._trace.checker import check_events, check_trace

Events = list[dict[str, Any]]


def _events(trace: Path) -> Events:
    return [json.loads(line) for line in trace.read_bytes().splitlines()]


def _replay_problems(events: Events) -> list[str]:
    """What replay finds (the chain break an edit makes is beside the point here)."""
    return [v.message for v in check_events(events) if "chain" not in v.message]


def _observation(events: Events) -> dict[str, Any]:
    return next(e for e in events if e["type"] == "observation")


@pytest.fixture(scope="module")
def media_trace(tmp_path_factory: pytest.TempPathFactory) -> Events:
    images = [Image(PNG + bytes(3000)), Image(PNG + bytes(3000)), Image(PNG)]
    budget = Budget(max_media_bytes=4000)  # the second is left out
    _, _, trace = _run(tmp_path_factory.mktemp("media"), {"shots": images}, budget)
    events = _events(trace)
    assert _observation(events)["media_bytes"] == 3016
    return events


def _shots(events: Events) -> list[dict[str, Any]]:
    shots: list[dict[str, Any]] = _observation(events)["result"]["value"]["shots"]
    return shots


def _drop_media_bytes(events: Events) -> None:
    del _observation(events)["media_bytes"]


def _more_media_bytes(events: Events) -> None:
    _observation(events)["media_bytes"] += 1


def _bigger_part(events: Events) -> None:
    _shots(events)[0]["bytes"] += 1


def _part_said_omitted(events: Events) -> None:
    first = _shots(events)[0]
    del first["part"]
    first["omitted"] = "the result's media would exceed max_media_bytes (4000)"


def _renumbered_part(events: Events) -> None:
    _shots(events)[2]["part"] = 3


@pytest.mark.parametrize(
    "mutate",
    [_drop_media_bytes, _more_media_bytes, _bigger_part, _part_said_omitted, _renumbered_part],
)
def test_an_edit_of_what_the_media_of_a_result_record_is_a_violation(
    media_trace: Events, mutate: Any
) -> None:
    assert _replay_problems(media_trace) == []
    events = copy.deepcopy(media_trace)
    mutate(events)
    assert _replay_problems(events), mutate.__name__


def test_an_edit_of_a_result_kept_by_its_size_is_a_violation(tmp_path: Path) -> None:
    _, _, trace = _run(tmp_path, {"blob": "z" * 5000}, Budget(max_output_bytes=1000))
    events = _events(trace)
    assert _replay_problems(events) == []
    dropped = copy.deepcopy(events)
    del _observation(dropped)["oversized"]
    assert any("oversized" in p for p in _replay_problems(dropped))
    grown = copy.deepcopy(events)
    _observation(grown)["oversized"] += 1
    _observation(grown)["result"]["bytes"] += 1
    assert _replay_problems(grown)  # the counters and the stop's detail say 5035


def _model_error_trace(tmp_path: Path) -> Events:
    tools = ToolRegistry()

    @tools.tool(schema=SCHEMA, effect="read")
    def look(q: str) -> Any:
        return q

    def model(messages: list[dict[str, Any]], specs: Any) -> dict[str, Any]:
        if len(messages) > 1:
            raise ConnectionError("m" * 100_000)
        return {"role": "assistant", "content": None, "tool_calls": [_call("x")]}

    Runtime(model=model, tools=tools, allowed_tools={"look"}, trace_dir=tmp_path).run("look")
    (trace,) = tmp_path.glob("*.jsonl")
    return _events(trace)


def test_an_edit_of_a_cut_error_message_is_a_violation(tmp_path: Path) -> None:
    events = _model_error_trace(tmp_path)
    assert _replay_problems(events) == []
    failed = next(e for e in events if e["type"] == "decision" and "error" in e)
    assert failed["error"].endswith(" more characters)")
    # The message is the model's (an input): what the run made of it must agree.
    for n, forged in enumerate(
        (
            failed["error"].replace(" more characters)", "0 more characters)"),
            "M" + failed["error"][1:],
            failed["error"][:-40],  # no longer cut: the stop's detail would quote it whole
        )
    ):
        events_ = copy.deepcopy(events)
        next(e for e in events_ if e.get("seq") == failed["seq"])["error"] = forged
        problems = _replay_problems(events_)
        assert any(p.startswith(f"seq {failed['seq'] + 1}: detail") for p in problems), n


# ── a redaction hook ──────────────────────────────────────────────────────────────


def _redacting_run(tmp_path: Path, key: str | None) -> tuple[Any, Path]:
    tools = ToolRegistry()

    @tools.tool(schema=SCHEMA, effect="read")
    def look(q: str) -> Any:
        return {"card": "4111 1111 1111 1111"}

    def redact(event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] == "run_start":  # a hook cannot hide that it ran
            return {k: v for k, v in event.items() if k != "redacted"}
        if event["type"] == "observation":
            return {**event, "result": {**event["result"], "value": "[redacted]"}}
        if event["type"] == "decision":
            return {**event, "secret": "[redacted]"}
        return event

    script: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [_call("x")]},
        {"role": "assistant", "content": "Seen."},
    ]
    rt = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools={"look"},
        trace_dir=tmp_path,
        trace_key=key,
        redact=redact,
    )
    out = rt.run("look")
    (trace,) = tmp_path.glob("*.jsonl")
    return out, trace


def test_a_redacted_trace_checks_with_its_differences_as_a_note(tmp_path: Path) -> None:
    out, trace = _redacting_run(tmp_path, "a key")
    events = _events(trace)
    assert events[0]["redacted"] is True
    assert "4111" not in trace.read_text()
    report = check_trace(trace, key=b"a key")
    assert report.violations == []
    (note,) = [n for n in report.notes if "redaction hook" in n]
    # Both decisions' added field, and the output counted from the redacted result.
    assert "3 payload field(s)" in note and "secret" in note, note
    assert "counters.output_bytes" in note, note
    # Without the header's flag (authenticated by the chain) the comparison is strict.
    strict = [dict(e) for e in out.events]
    del strict[0]["redacted"]
    problems = [v.message for v in check_events(strict)]
    assert any("secret" in p for p in problems), problems


def test_a_redacted_trace_still_fails_on_what_the_engine_decides(tmp_path: Path) -> None:
    out, _ = _redacting_run(tmp_path, None)
    events = [dict(e) for e in out.events]
    assert [v.message for v in check_events(events)] == []
    at = next(i for i, e in enumerate(events) if e.get("trigger") == "tool_returned")
    flipped = copy.deepcopy(events)
    flipped[at]["guards"]["call_succeeded"] = False
    assert any("call_succeeded" in v.message for v in check_events(flipped))
    moved = copy.deepcopy(events)
    moved[at]["dest"] = "done"
    assert any("tool_returned" in v.message for v in check_events(moved))
    renumbered = copy.deepcopy(events)
    renumbered[at]["seq"] += 7
    assert any("seq" in v.message for v in check_events(renumbered))
