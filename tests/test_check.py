"""``fsm-agent check``: real traces pass, every kind of tampering is caught with its line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import (
    Backend,
    TransientToolError,
    call,
    calls,
    make_runtime,
    say,
)

from fsm_agent._cli import main
from fsm_agent._core.requests import IntentClaim
from fsm_agent._core.table import TRANSITIONS
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._trace.chain import encode_events
from fsm_agent._trace.checker import check_events, check_file, select_edge

LOOKUP = call("c1", "lookup", order_id="A17")
TICKET = {"request_id": "R-1", "title": "Damaged parcel"}


def write_trace(path: Path, events: list[dict[str, Any]], key: bytes | None = None) -> Path:
    """The events as the runtime writes them: chained lines (trace/chain.py)."""
    path.write_text("".join(line + "\n" for line in encode_events(events, key=key)), "utf-8")
    return path


def happy() -> list[dict[str, Any]]:
    return make_runtime([calls(LOOKUP), say("A17 is in transit.")]).run("Where?").events


def two_call_batch() -> list[dict[str, Any]]:
    script = [calls(LOOKUP, call("c2", "lookup", order_id="A18")), say("Both found.")]
    return make_runtime(script).run("Where?").events


def messages(violations: list[Any]) -> str:
    return "\n".join(f"{v.line}: {v.message}" for v in violations)


# ── every edge the runtime takes, checked and replayed ─────────────────────────────


# (Every edge's scenario is checked by the checker, and the edges it selects are compared
# with the edges the engine took, in tests/test_testing_scenarios.py.)


def test_a_retry_an_approval_stop_and_a_replayed_write_all_conform() -> None:
    b = Backend()
    b.fail_reads = [TransientToolError("flaky")]
    retry = make_runtime([calls(LOOKUP), say("ok")], b).run("Where?")
    assert retry.counters["retries"] == 1
    approval = make_runtime(
        [calls(call("w1", "write", **TICKET)), say("never")], approval=True
    ).run("Open a ticket")
    assert approval.status == "review_required"
    store = MemoryStore()
    first = make_runtime([calls(call("w1", "write", **TICKET)), say("ok")], store=store)
    second = make_runtime([calls(call("w9", "write", **TICKET)), say("ok")], store=store)
    replayed = [first.run("Open").events, second.run("Open again").events]
    assert replayed[1][-1]["counters"]["replays"] == 1
    for events in (retry.events, approval.events, *replayed):
        assert check_events(events) == [], messages(check_events(events))


# ── tampering ───────────────────────────────────────────────────────────────────────


def test_a_missing_event_breaks_seq_at_its_line() -> None:
    events = happy()
    del events[3]
    found = check_events(events)
    assert found[0].line == 4 and "seq is 4, expected 3" in found[0].message


def test_a_changed_destination_is_not_the_edge_the_guards_select() -> None:
    events = happy()
    i = next(i for i, e in enumerate(events) if e.get("trigger") == "model_replied")
    events[i]["dest"] = "executing"
    found = messages(check_events(events))
    assert (
        f"{i + 1}: seq {i}: the engine writes transition model_replied deciding -> validating "
        "here; the trace records transition model_replied deciding -> executing"
    ) in found


def test_a_trigger_with_no_edge_from_the_state_is_illegal() -> None:
    events = happy()
    i = next(i for i, e in enumerate(events) if e.get("trigger") == "validate")
    events[i]["trigger"] = "observe"
    assert (
        f"{i + 1}: seq {i}: the engine writes transition validate validating -> executing of "
        "call 'c1' here; the trace records transition observe validating -> executing"
    ) in messages(check_events(events))


def test_an_answer_given_twice_and_an_orphan_answer_are_caught() -> None:
    events = happy()
    i = next(i for i, e in enumerate(events) if e["type"] == "observation")
    twice = [*events[: i + 1], dict(events[i]), *events[i + 1 :]]
    for n, e in enumerate(twice):
        e["seq"] = n
    assert (
        f"{i + 2}: seq {i + 1}: the engine writes transition observe observing -> deciding "
        "here; the trace records an observation of call 'c1'"
    ) in messages(check_events(twice))
    orphan = [dict(e) for e in events]
    orphan[i]["call_id"] = "c-nope"
    found = messages(check_events(orphan))
    assert (
        f"{i + 1}: seq {i}: the engine writes an observation of call 'c1' here; the trace "
        "records an observation of call 'c-nope'"
    ) in found


def test_a_call_never_answered_is_reported_before_the_next_decision() -> None:
    events = two_call_batch()
    drop = next(
        i for i, e in enumerate(events) if e["type"] == "observation" and e["call_id"] == "c2"
    )
    kept = [e for i, e in enumerate(events) if i != drop]
    for n, e in enumerate(kept):
        e["seq"] = n
    found = messages(check_events(kept))
    assert (
        f"{drop + 1}: seq {drop}: the engine writes an observation of call 'c2' here; the trace "
        "records transition observe observing -> deciding"
    ) in found


def test_anything_after_run_end_is_a_violation() -> None:
    events = happy()
    end = len(events)
    extra = {
        "type": "transition",
        "trigger": "resume",
        "source": "done",
        "dest": "deciding",
        "guards": {},
        "seq": end,
    }
    found = messages(check_events([*events, extra]))
    # The replayed run resumes (from its checkpoint) and the engine takes no resume edge.
    assert f"{end + 1}: transition resume done -> deciding after the run ended in done" in found


def test_an_observation_after_run_end_is_a_violation() -> None:
    events = happy()
    obs = next(e for e in events if e["type"] == "observation")
    late = {**obs, "seq": len(events)}
    found = messages(check_events([*events, late]))
    assert f"{len(events) + 1}: an observation of call 'c1' after the run ended in done" in found


def test_a_trace_cut_before_run_end_is_reported() -> None:
    events = happy()[:-3]
    found = check_events(events)
    assert found[-1].line == len(events)
    assert "the trace ends while the engine waits for a model reply" in found[-1].message


def test_a_write_executed_twice_under_one_key_is_caught() -> None:
    class ForgetfulStore:
        """A broken store that keeps nothing: the second identical write runs again."""

        blocking = False

        def begin_intent(self, record: Any, *, take_over: bool = False, save: Any = None) -> Any:
            return IntentClaim(True, None)

        def commit_intent(self, tool: str, key: str, owner: Any, result: Any, **_: Any) -> None:
            pass

        def abort_intent(self, tool: str, key: str, owner: Any, **_: Any) -> None:
            pass

        def get_intent(self, tool: str, key: str) -> Any:
            return None

    script = [
        calls(call("w1", "write", **TICKET)),
        calls(call("w2", "write", **TICKET)),
        say("Two tickets?"),
    ]
    backend = Backend()
    result = make_runtime(script, backend, store=ForgetfulStore()).run("Open a ticket")
    assert len(backend.writes) == 2  # the bug the checker must see
    found = messages(check_events(result.events))
    assert "write 'write' executed twice with the same arguments" in found


def test_a_replay_that_also_ran_the_tool_is_caught() -> None:
    events = happy()
    obs = next(e for e in events if e["type"] == "observation")
    obs["result"]["replayed"] = True
    assert "result.replayed: the trace records true, which the engine does not write" in (
        messages(check_events(events))
    )


def test_select_edge_follows_priority_and_recorded_outcomes() -> None:
    wall = select_edge(
        "executing",
        "dispatch",
        "budget_exhausted",
        "wall_clock",
        {"call_admitted": True, "wall_clock_spent": True},
    )
    assert wall is not None and wall.reason == "wall_clock"
    run_now = select_edge(
        "executing",
        "dispatch",
        "executing",
        None,
        {
            "call_admitted": True,
            "wall_clock_spent": False,
            "idempotency_conflict": False,
            "idempotency_pending": False,
            "idempotent_replay": False,
        },
    )
    assert run_now is TRANSITIONS[[t.action for t in TRANSITIONS].index("start_attempt")]


# ── the command ──────────────────────────────────────────────────────────────────────


def test_cli_exit_codes_and_line_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_trace(tmp_path / "good.jsonl", happy())
    assert main(["check", str(good)]) == 0
    assert capsys.readouterr().out.strip() == f"{good}: ok"
    events = happy()
    del events[5]
    bad = write_trace(tmp_path / "bad.jsonl", events)
    assert main(["check", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:6: seq is 6, expected 5" in out
    assert check_file(good) == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", ":1: empty trace"),
        ('{"type": "run_start", "seq": 0}', ":1: truncated"),
        ("this is not json\n", ":1: not JSON"),
        ('{"type": "decision", "seq": 0}\n', ":1: the first event is 'decision'"),
        (
            '{"type": "run_start", "seq": 0, "schema": "fsm-agent.trace/0"}\n',
            ":1: schema 'fsm-agent.trace/0' is not",
        ),
    ],
)
def test_unreadable_traces_exit_2_with_one_line(
    tmp_path: Path, content: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content, encoding="utf-8")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}{expected}"), err
    assert "\n" not in err and "Traceback" not in err


def test_another_machine_hash_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = happy()
    events[0]["machine_hash"] = "sha256:0000000000000000"
    path = write_trace(tmp_path / "old.jsonl", events)
    assert main(["check", str(path)]) == 2
    assert "machine hash 'sha256:0000000000000000' is not this machine's" in (
        capsys.readouterr().err
    )


def test_a_missing_file_and_a_bad_line_in_the_middle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl:0: cannot open" in capsys.readouterr().err
    lines = encode_events(happy())
    lines[4] = lines[4][:20]
    path = tmp_path / "cut.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    good = write_trace(tmp_path / "good.jsonl", happy())
    # A bad line is a violation where it is; the rest of the file and the next file are
    # still checked.
    assert main(["check", str(path), str(good)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:5: not JSON" in out and f"{good}: ok" in out
