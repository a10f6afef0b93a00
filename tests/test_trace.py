"""Traces: JSON Lines that round-trip, carry enough to rebuild the run, and redact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, assert_valid_run, call, calls, make_runtime, say

from fsm_agent import MACHINE_HASH, TraceError, read_trace
from fsm_agent._core.loop import SCHEMA
from fsm_agent._trace.chain import strip_links


def _run(tmp_path: Path, **options: Any) -> Any:
    b = Backend()
    b.fail_writes.append((RuntimeError("lost"), True))
    script = [
        calls(call("c1", "lookup", order_id="A17")),
        calls(
            call("w1", "write", request_id="R-1", title="t"), call("c2", "lookup", order_id="A18")
        ),
    ]
    return make_runtime(script, b, **options).run("go", run_id="r1", trace=tmp_path / "t.jsonl")


def test_the_file_round_trips_every_event(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert_valid_run(result)
    events = read_trace(tmp_path / "t.jsonl")
    # Each line is the event plus its run id and chain link (fsm_agent/_trace/chain.py).
    assert all(e["run"] == "r1" and len(e["chain"]) == 32 for e in events)
    assert strip_links(events) == json.loads(json.dumps(result.events))


def test_the_header_and_the_summary(tmp_path: Path) -> None:
    events = read_trace(_run(tmp_path) and tmp_path / "t.jsonl")
    head, end = events[0], events[-1]
    assert head["type"] == "run_start" and head["schema"] == SCHEMA and head["seq"] == 0
    assert head["machine_hash"] == MACHINE_HASH and head["run_id"] == "r1"
    assert head["policy"] == "default" and head["budget"]["max_tool_rounds"] == 8
    assert head["tools"]["write"] == {
        "effect": "write",
        "requires_approval": False,
        "idempotent": True,
        "dedup": False,
        "timeout_s": None,
        # the final schema admission validates with (objects closed): check replays it
        "schema": {
            "type": "object",
            "required": ["request_id", "title"],
            "properties": {
                "request_id": {"type": "string"},
                "title": {"type": "string", "maxLength": 50},
            },
            "additionalProperties": False,
        },
    }
    assert head["messages"] == [{"role": "user", "content": "go"}]
    assert end["type"] == "run_end" and end["status"] == "review_required"
    assert end["reason"] == "outcome_unknown" and end["counters"]["write_attempts"] == 1


def test_the_history_can_be_rebuilt_from_the_trace_alone(tmp_path: Path) -> None:
    result = _run(tmp_path)
    events = read_trace(tmp_path / "t.jsonl")
    messages = list(events[0]["messages"])
    for e in events:
        if e["type"] == "decision" and isinstance(e.get("message"), dict):
            messages.append({k: v for k, v in e["message"].items() if k != "usage"})
        elif e["type"] == "observation":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": e["call_id"],
                    "content": json.dumps(e["result"], ensure_ascii=False),
                }
            )
    assert messages == result.messages


def test_transition_events_name_guards_calls_and_attempts(tmp_path: Path) -> None:
    events = read_trace(_run(tmp_path) and tmp_path / "t.jsonl")
    unknown = [
        e
        for e in events
        if e["type"] == "transition"
        and e["trigger"] == "tool_returned"
        and e["dest"] == "review_required"
    ]
    assert len(unknown) == 1
    e = unknown[0]
    assert e["call_id"] == "w1" and e["tool"] == "write" and e["attempt"] == 1
    assert list(e["guards"].items()) == [  # every guard that decided, in table order
        ("call_not_started", False),
        ("call_succeeded", False),
        ("call_rejected", False),
        ("is_retryable", False),
        ("is_write", True),
    ]
    assert e["guards"] == {
        "call_not_started": False,
        "call_succeeded": False,
        "call_rejected": False,
        "is_retryable": False,
        "is_write": True,
    }
    assert e["reason"] == "outcome_unknown" and "'write' (w1) may have taken effect" in e["detail"]
    synthetic = [x for x in events if x["type"] == "observation" and x["synthetic"]]
    assert [(x["call_id"], x["result"]["error"]) for x in synthetic] == [
        ("w1", "outcome_unknown"),
        ("c2", "skipped_pending_review"),
    ]


def test_redaction_applies_to_the_file_and_the_result(tmp_path: Path) -> None:
    def redact(event: dict[str, Any]) -> dict[str, Any]:
        redacted: dict[str, Any] = json.loads(json.dumps(event).replace("A17", "[order]"))
        return redacted

    result = _run(tmp_path, redact=redact)
    text = (tmp_path / "t.jsonl").read_text()
    assert "A17" not in text and "[order]" in text
    assert "A17" not in json.dumps(result.events)
    assert any("A17" in json.dumps(m) for m in result.messages)  # the run itself is untouched


def test_trace_dir_writes_one_file_per_run(tmp_path: Path) -> None:
    rt = make_runtime([say("a"), say("b")], trace_dir=tmp_path / "traces")
    first, second = rt.run("x"), rt.run("y")
    files = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert files == sorted([f"{first.run_id}.jsonl", f"{second.run_id}.jsonl"])


@pytest.mark.parametrize(
    "content, line, message",
    [
        ("", 1, "empty trace: no run_start header"),
        ('{"type": "run_start"}\n{"type": "transi', 2, "truncated: the last line has no newline"),
        ('{"type": "run_start"}\nnot json\n', 2, "not JSON"),
        ('{"type": "run_start"}\n[1, 2]\n', 2, "not a trace event (no 'type' field)"),
        ('{"type": "run_start"}\n\n', 2, "empty line"),
    ],
)
def test_broken_trace_files_name_the_file_and_line(
    tmp_path: Path, content: str, line: int, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert info.value.line == line and message in info.value.message
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_binary_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"type": "run_start"}\n\xff\xfe\n')
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(path)
    with pytest.raises(TraceError, match="cannot open"):
        read_trace(tmp_path / "missing.jsonl")
