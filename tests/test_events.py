"""Typed events: every recorded event reads back as its class and writes back exactly,
the committed JSON Schema is the one the classes generate, and every event the demo and
the per-edge suite record validates against it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fsm_agent._cli.demo import SCENARIOS
from fsm_agent._cli.regen import EVENTS_SCHEMA
from fsm_agent._core.events import (
    EVENT_TYPES,
    UNSET,
    Decided,
    EventError,
    Observed,
    Reviewed,
    RunEnded,
    RunStarted,
    TextDelta,
    Transitioned,
    UnknownEvent,
    event_from_json,
    json_schema,
    json_schema_text,
    typed,
)
from fsm_agent.testing._suite import SUITE

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def demo_lines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every line of every demo trace (with its chain fields)."""
    folder = tmp_path_factory.mktemp("demo")
    for scenario in SCENARIOS.values():
        scenario.run(trace_dir=folder)
    lines = [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]
    assert {e["type"] for e in lines} >= {"run_start", "decision", "transition", "run_end"}
    return lines


@pytest.fixture(scope="module")
def suite_events() -> list[dict[str, Any]]:
    """Every event every run of the per-edge suite recorded (reviews included)."""
    return [e for s in SUITE for r in s.run().results for e in r.events]


def test_the_committed_schema_is_the_generated_one() -> None:
    committed = (DOCS / EVENTS_SCHEMA).read_text(encoding="utf-8")
    assert committed == json_schema_text(), "run `make diagrams` and commit what it writes"


def test_every_demo_trace_line_validates_and_round_trips(demo_lines: list[dict[str, Any]]) -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    for line in demo_lines:
        errors = [e.message for e in validator.iter_errors(line)]
        assert not errors, (line["type"], line["seq"], errors)
        event = event_from_json(line)
        assert type(event) is EVENT_TYPES[line["type"]]
        assert event.run_id == line["run"] and event.seq == line["seq"]
        assert event.to_json() == {k: v for k, v in line.items() if k not in ("run", "chain")}


def test_every_event_of_the_suite_validates_and_round_trips(
    suite_events: list[dict[str, Any]],
) -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    assert {"review", "observation", "run_end"} <= {e["type"] for e in suite_events}
    for data in suite_events:
        assert not list(validator.iter_errors(data)), data
        assert event_from_json(data, run_id="r").to_json() == data


def test_the_schema_refuses_what_from_json_refuses() -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    bad = {"type": "transition", "seq": 3, "trigger": "observe", "source": "observing"}
    assert not validator.is_valid(bad)
    with pytest.raises(EventError, match="'transition' event seq 3: field 'dest' is missing"):
        event_from_json(bad)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "an event must be a JSON object, got list"),
        ({"seq": 1}, "an event needs a 'type' field"),
        ({"type": "nap", "seq": 1}, "unknown event type 'nap' (one of: run_start, decision"),
        ({"type": "run_end", "seq": "7"}, "field 'seq' must be an integer, got str '7'"),
        (
            {"type": "observation", "seq": 2, "call_id": "c1", "tool": "t", "result": {},
             "synthetic": "no"},
            "'observation' event seq 2: field 'synthetic' must be true or false, got str 'no'",
        ),
        (
            {"type": "transition", "seq": 4, "trigger": "validate", "source": "validating",
             "dest": "executing", "guards": {"batch_valid": 1}, "t": 0.0},
            "field 'guards' must be an object of true/false values",
        ),
    ],
)  # fmt: skip
def test_a_bad_dict_is_a_precise_error(data: Any, message: str) -> None:
    with pytest.raises(EventError) as caught:
        event_from_json(data)
    assert message in str(caught.value)


def test_from_json_of_the_wrong_class_says_which_type_it_needs() -> None:
    with pytest.raises(EventError, match=r"Observed\.from_json needs type 'observation'"):
        Observed.from_json({"type": "decision", "seq": 1, "message": None})


def test_fields_a_newer_version_adds_are_kept_and_written_back() -> None:
    data = {"type": "review", "seq": 9, "action": "deny", "call_id": "c1", "tool": "pay",
            "reason": "no", "reviewer": None, "ticket": "OPS-7", "x_app": {"k": 1}}  # fmt: skip
    event = Reviewed.from_json(data, run_id="r1")
    assert event.extra == {"ticket": "OPS-7", "x_app": {"k": 1}} and event.result is UNSET
    assert event.reviewer is None and event.note is None  # recorded null / absent
    assert event.to_json() == data


def test_a_null_that_is_recorded_stays_distinct_from_an_absent_field() -> None:
    reconciled = {"type": "review", "seq": 5, "action": "reconcile", "call_id": "c1",
                  "tool": "t", "result": None}  # fmt: skip
    assert Reviewed.from_json(reconciled).to_json() == reconciled
    failed = {"type": "decision", "seq": 1, "error": "RuntimeError: down"}
    event = Decided.from_json(failed)
    assert event.message is UNSET and event.to_json() == failed
    assert Decided.from_json({"type": "decision", "seq": 1, "message": None}).message is None


def test_events_are_frozen_and_carry_type_seq_and_run_id() -> None:
    event = RunEnded(seq=3, run_id="r", status="done", reason="final_answer", detail="",
                     answer="ok", counters={})  # fmt: skip
    assert (event.type, event.seq, event.run_id) == ("run_end", 3, "r")
    with pytest.raises(AttributeError):
        event.seq = 4  # type: ignore[misc]
    delta = TextDelta(seq=4, run_id="r", index=0, text="Hel")
    assert delta.to_json() == {"type": "text_delta", "seq": 4, "index": 0, "text": "Hel"}
    assert RunStarted.TYPE == "run_start" and Transitioned.TYPE == "transition"


def test_a_consumer_gets_an_unknown_event_for_what_no_class_reads() -> None:
    redacted = {"type": "transition", "seq": 3, "redaction_failed": "ValueError: boom"}
    event = typed(redacted, "r1")
    assert isinstance(event, UnknownEvent)
    assert (event.type, event.seq, event.run_id) == ("transition", 3, "r1")
    assert event.to_json() == redacted
    validator = jsonschema.Draft202012Validator(json_schema())
    assert validator.is_valid(redacted)  # the recorded form of a failed redaction


def test_the_keyed_reading_builds_the_event_the_dataclass_builds(
    demo_lines: list[dict[str, Any]], suite_events: list[dict[str, Any]]
) -> None:
    # from_json reads a dict that fits key by key and fills the frozen instance at once
    # (the interceptors' hot path); the ordered reading through __init__ is the reference.
    from fsm_agent._core.events import _parse

    for data in [*demo_lines, *suite_events]:
        cls = EVENT_TYPES[data["type"]]
        fast = event_from_json(data, run_id="r")
        reference = cls(**_parse(cls, data, "r"))
        assert fast == reference and vars(fast) == vars(reference), data
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.seq = 1  # type: ignore[misc]


def test_a_built_event_is_typed_unchecked_as_the_checked_reading_types_it(
    suite_events: list[dict[str, Any]],
) -> None:
    # Without a redaction hook the interceptors get the engine's dicts typed unchecked
    # (``built``): the same event, field for field, as the checked reading.
    assert {"run_start", "decision", "transition", "observation", "run_end"} <= {
        e["type"] for e in suite_events
    }
    for data in suite_events:
        fast, checked = typed(data, "r", built=True), typed(data, "r")
        assert type(fast) is type(checked) and vars(fast) == vars(checked), data
    odd = {**suite_events[1], "added_by_a_newer_version": 1}  # not a builder's: checked
    assert typed(odd, "r", built=True).extra == {"added_by_a_newer_version": 1}
