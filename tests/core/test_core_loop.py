"""The loop driven by hand, h11-style: no Runtime, no driver, no I/O.

Each test builds a :class:`RunState`, starts :func:`steps`, and answers every request
itself, asserting the exact sequence of requests the loop makes for one scenario. This
is the request protocol of ``core/requests.py`` as the drivers see it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any

import pytest

from fsm_agent import ToolRegistry
from fsm_agent._core.approvals import ApprovalBook
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.intents import IdempotencyRecord, IntentClaim
from fsm_agent._core.loop import SCHEMA, Cancelled, Steps, start, steps
from fsm_agent._core.requests import (
    AbortIntent,
    AskModel,
    BeginIntent,
    CallTool,
    CommitIntent,
    EmitEvents,
    LoadIntent,
    ReadClock,
    Request,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
)
from fsm_agent._core.state import RunConfig, RunState, SaveMode
from fsm_agent._errors import TransientToolError

TOOLS = ToolRegistry()
TOOLS.register(
    lambda key: {"key": key},
    name="lookup",
    effect="read",
    schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)
TOOLS.register(
    lambda key: {"ticket": key},
    name="ticket",
    effect="write",
    idempotency_key=lambda args: args["key"],
    schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def decide(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


ANSWER = {"role": "assistant", "content": "Done."}


def new_state(*, save: SaveMode = "never", emit: bool = False, **budget: Any) -> RunState:
    config = RunConfig(
        budget=Budget(**budget),
        retry=RetryPolicy(max_attempts=2, backoff_s=0.5),
        policy="default",
        allowed=frozenset({"lookup", "ticket"}),
        tools=TOOLS.get,
        tool_specs=[t.spec() for t in TOOLS],
        approvals=ApprovalBook(),
        save=save,
        emit=emit,
    )
    s = RunState(run_id="r1", config=config, messages=[{"role": "user", "content": "hi"}])
    start(s)
    return s


Answer = Callable[[Request], Any]


def drive(gen: Generator[Request, Any, None], answer: Answer) -> list[Request]:
    """Answer every request with ``answer``; return the requests in order."""
    seen: list[Request] = []
    request = next(gen)
    while True:
        seen.append(request)
        try:
            request = gen.send(answer(request))
        except StopIteration:
            return seen


def scripted(
    replies: list[Any],
    tool: Callable[[CallTool], ToolOutcome] | None = None,
    claims: Callable[[BeginIntent], IntentClaim] | None = None,
) -> Answer:
    """Answers like a driver would: the model's replies in turn, tools by ``tool``
    (default: run the registered function), a clock that ticks 1 s per reading."""
    replies = list(replies)
    clock = [0.0]

    def answer(request: Request) -> Any:
        if isinstance(request, ReadClock):
            clock[0] += 1.0
            return clock[0]
        if isinstance(request, AskModel):
            return replies.pop(0)
        if isinstance(request, CallTool):
            if tool is not None:
                return tool(request)
            tool_fn: Any = TOOLS[request.tool].fn  # a request names its tool
            return ToolOutcome("ok", tool_fn(**request.arguments))
        if isinstance(request, BeginIntent):
            return claims(request) if claims else IntentClaim(True, None)
        return None  # Emit, Save, Commit, Abort, Sleep, LoadIntent (no record)

    return answer


def kinds(requests: list[Request]) -> list[str]:
    return [type(r).__name__ for r in requests]


def test_a_read_then_an_answer_with_nothing_to_save_or_emit() -> None:
    s = new_state()
    requests = drive(steps(s), scripted([decide(call("c1", "lookup", key="A")), ANSWER]))
    assert kinds(requests) == [
        "ReadClock",  # the run's start
        "AskModel",
        "ReadClock",  # the reply and when it came
        "CallTool",
        "ReadClock",  # the read and when it returned
        "AskModel",
        "ReadClock",
    ]
    assert (s.state, s.reason, s.answer) == ("done", "final_answer", "Done.")
    ask = requests[1]
    assert isinstance(ask, AskModel) and ask.messages == [{"role": "user", "content": "hi"}]
    tool = requests[3]
    assert isinstance(tool, CallTool) and tool.arguments == {"key": "A"} and tool.timeout_s is None
    assert [e["type"] for e in s.events] == [
        "run_start",
        "decision",
        "transition",
        "transition",
        "transition",
        "transition",
        "observation",
        "transition",
        "decision",
        "transition",
        "transition",
        "run_end",
    ]
    assert s.events[0]["schema"] == SCHEMA and [e["seq"] for e in s.events] == list(range(12))


def test_a_run_with_a_consumer_emits_each_event_right_after_the_edge_that_recorded_it() -> None:
    s = new_state(emit=True)
    requests = drive(steps(s), scripted([decide(call("c1", "lookup", key="A")), ANSWER]))
    emits = [[e["type"] for e in r.events] if isinstance(r, EmitEvents) else type(r).__name__
             for r in requests]  # fmt: skip
    assert emits == [
        ["run_start"],
        "ReadClock",
        "AskModel",
        "ReadClock",
        ["decision", "transition"],  # model_replied
        ["transition"],  # validate
        ["transition"],  # dispatch
        "CallTool",
        "ReadClock",
        ["transition", "observation"],  # tool_returned
        ["transition"],  # observe
        "AskModel",
        "ReadClock",
        ["decision", "transition"],
        ["transition", "run_end"],
    ]
    emitted = [e for r in requests if isinstance(r, EmitEvents) for e in r.events]
    assert emitted == s.events  # every event exactly once, in order


def drive_checking_emits(s: RunState, gen: Steps, answer: Answer) -> list[Request]:
    """:func:`drive`, asserting at each request but ``EmitEvents`` that every event
    recorded so far was emitted: a consumer has each event before the next request."""

    def checked(request: Request) -> Any:
        if not isinstance(request, EmitEvents):
            late = [e["type"] for e in s.events[s.emitted :]]
            assert not late, f"{type(request).__name__} before {late} were emitted"
        return answer(request)

    return drive(gen, checked)


@pytest.mark.parametrize("save", ["never", "writes", "replies"])
def test_no_request_is_made_while_an_event_is_unemitted(save: SaveMode) -> None:
    # A read that fails once (sleep, retry), a keyed write (intent, commit), an answer.
    outcomes = iter([ToolOutcome("transient", error="busy")])

    def tool(request: CallTool) -> ToolOutcome:
        return next(outcomes, ToolOutcome("ok", {"done": request.tool}))

    s = new_state(emit=True, save=save)
    replies = [decide(call("c1", "lookup", key="A"), call("w1", "ticket", key="K")), ANSWER]
    requests = drive_checking_emits(s, steps(s), scripted(replies, tool))
    assert "Sleep" in kinds(requests) and s.state == "done"
    if save != "never":
        assert {"SaveCheckpoint", "BeginIntent", "CommitIntent"} <= set(kinds(requests))
    assert [e for r in requests if isinstance(r, EmitEvents) for e in r.events] == s.events


def test_a_cancelled_run_emits_its_end_before_its_last_save() -> None:
    s = new_state(emit=True, save="writes")
    gen = steps(s)
    request = next(gen)
    while not isinstance(request, AskModel):
        request = gen.send(None if not isinstance(request, ReadClock) else 1.0)
    after = drive_checking_emits(s, _thrown(gen), scripted([]))
    assert kinds(after)[-2:] == ["EmitEvents", "SaveCheckpoint"]
    assert s.events[-1]["type"] == "run_end" and s.emitted == len(s.events)


def _thrown(gen: Steps) -> Steps:
    """``gen`` with ``Cancelled`` thrown in at the request it is suspended at."""
    request = gen.throw(Cancelled())
    while True:
        try:
            request = gen.send((yield request))
        except StopIteration:
            return


def test_a_durable_write_begins_its_intent_with_its_checkpoint_then_runs_then_commits() -> None:
    s = new_state(save="replies")
    requests = drive(steps(s), scripted([decide(call("w1", "ticket", key="K")), ANSWER]))
    assert kinds(requests) == [
        "ReadClock",
        "SaveCheckpoint",  # the run is created
        "AskModel",
        "ReadClock",  # the batch starts with a keyed write: no save of its own...
        "BeginIntent",  # ...its intent and the checkpoint before dispatch: one transaction
        "CallTool",
        "CommitIntent",
        "ReadClock",  # the result is under its key: no save
        "AskModel",
        "ReadClock",
        "SaveCheckpoint",  # the end
    ]
    create = requests[1]
    assert isinstance(create, SaveCheckpoint) and create.header is not None
    begin = requests[4]
    assert isinstance(begin, BeginIntent) and not begin.take_over and begin.save is not None
    assert begin.save.snapshot["body"]["state"] == "executing"  # just before dispatch
    assert (begin.record.tool, begin.record.key, begin.record.owner) == (
        "ticket",
        "K",
        ("r1", "w1"),
    )
    commit = requests[6]
    assert isinstance(commit, CommitIntent) and commit.result == {"ticket": "K"}
    saved = [e for r in requests for e in _saved_events(r)]
    assert saved == s.events  # the store gets every event exactly once
    assert s.state == "done"


def test_a_read_batch_is_saved_when_accepted() -> None:
    s = new_state(save="replies")
    requests = drive(steps(s), scripted([decide(call("c1", "lookup", key="A")), ANSWER]))
    assert kinds(requests)[:5] == ["ReadClock", "SaveCheckpoint", "AskModel", "ReadClock",
                                   "SaveCheckpoint"]  # fmt: skip
    accepted = requests[4]
    assert isinstance(accepted, SaveCheckpoint)
    assert accepted.snapshot["body"]["state"] == "executing"


def _saved_events(request: Request) -> list[dict[str, Any]]:
    if isinstance(request, SaveCheckpoint):
        return request.events
    save = getattr(request, "save", None)  # riding with an intent operation
    return save.events if isinstance(save, SaveCheckpoint) else []


def test_a_key_held_by_a_committed_write_is_replayed_without_calling_the_tool() -> None:
    def claims(request: BeginIntent) -> IntentClaim:
        digest = request.record.args_digest  # the same arguments, committed by run r0
        done = IdempotencyRecord("ticket", "K", digest, "committed", "r0", "w0", {"ticket": "old"})
        return IntentClaim(False, done)

    s = new_state()
    requests = drive(
        steps(s), scripted([decide(call("w1", "ticket", key="K")), ANSWER], claims=claims)
    )
    assert "CallTool" not in kinds(requests)
    assert s.counters.replays == 1 and json.loads(s.messages[2]["content"])["replayed"] is True


def test_an_intent_begun_for_nothing_is_given_back() -> None:
    # The wall clock runs out between the intent and the attempt: the intent is aborted.
    s = new_state(max_wall_clock_s=0.5)
    requests = drive(steps(s), scripted([decide(call("w1", "ticket", key="K"))]))
    assert kinds(requests)[-2:] == ["BeginIntent", "AbortIntent"]
    abort = requests[-1]
    assert isinstance(abort, AbortIntent) and abort.owner == ("r1", "w1")
    assert (s.state, s.reason) == ("budget_exhausted", "wall_clock")


def test_a_transient_read_sleeps_then_calls_again() -> None:
    outcomes = [
        ToolOutcome("transient", error="TransientToolError: busy"),
        ToolOutcome("ok", {"key": "A"}),
    ]
    s = new_state()
    requests = drive(
        steps(s),
        scripted([decide(call("c1", "lookup", key="A")), ANSWER], tool=lambda r: outcomes.pop(0)),
    )
    assert kinds(requests)[3:8] == ["CallTool", "ReadClock", "Sleep", "ReadClock", "CallTool"]
    sleep = requests[5]
    assert isinstance(sleep, Sleep) and sleep.seconds == 0.5
    assert s.counters.retries == 1 and s.state == "done"
    assert TransientToolError.__name__ in next(
        e["error"] for e in s.events if e.get("dest") == "retry_wait"
    )


def test_a_model_error_ends_the_run_and_a_durable_one_saves_it() -> None:
    s = new_state(save="writes")
    requests = drive(steps(s), scripted([ConnectionError("down")]))
    assert kinds(requests) == [
        "ReadClock",
        "SaveCheckpoint",
        "AskModel",
        "ReadClock",
        "SaveCheckpoint",
    ]
    assert (s.state, s.reason, s.detail) == (
        "protocol_error",
        "model_error",
        "ConnectionError: down",
    )


def test_a_driver_that_stops_mid_write_gets_a_closed_run_for_review() -> None:
    s = new_state(emit=True)
    gen = steps(s)
    request = next(gen)
    answer = scripted([decide(call("w1", "ticket", key="K"), call("c2", "lookup", key="A"))])
    while not isinstance(request, CallTool):
        request = gen.send(answer(request))
    # The driver could not finish the call (Ctrl-C, a cancelled task): it throws Cancelled.
    after = [gen.throw(Cancelled())]
    after += drive_rest(gen, answer)
    assert kinds(after) == ["ReadClock", "EmitEvents"]
    assert (s.state, s.reason) == ("review_required", "outcome_unknown")
    answers = {
        m["tool_call_id"]: json.loads(m["content"])["error"]
        for m in s.messages
        if m["role"] == "tool"
    }
    assert answers == {"w1": "outcome_unknown", "c2": "skipped_pending_review"}
    assert s.events[-1]["type"] == "run_end"


def drive_rest(gen: Generator[Request, Any, None], answer: Answer) -> list[Request]:
    seen: list[Request] = []
    request = None
    try:
        while True:
            request = gen.send(answer(request) if request is not None else 1.0)
            seen.append(request)
    except StopIteration:
        return seen


def test_an_exception_raised_inside_the_loop_closes_the_run_then_propagates() -> None:
    tools = ToolRegistry()

    def interrupted_key(arguments: dict[str, Any]) -> str:
        raise KeyboardInterrupt  # a registrar's function runs inside the loop

    tools.register(
        lambda key: key,
        name="ticket",
        effect="write",
        idempotency_key=interrupted_key,
        schema={"type": "object"},
        allow_extra_fields=True,
    )
    s = new_state()
    s.config = RunConfig(
        budget=Budget(),
        retry=RetryPolicy(),
        policy="default",
        allowed=frozenset({"ticket"}),
        tools=tools.get,
        tool_specs=[],
    )
    with pytest.raises(KeyboardInterrupt):
        drive(steps(s), scripted([decide(call("w1", "ticket", key="K"))]))
    assert (s.state, s.reason) == ("cancelled", "cancelled")
    assert s.events[-1]["type"] == "run_end"


def test_a_resumed_write_that_was_in_flight_reads_its_record_and_stops() -> None:
    s = new_state(save="replies")
    gen = steps(s)
    saves: list[SaveCheckpoint] = []
    answer = scripted([decide(call("w1", "ticket", key="K"))])
    request = next(gen)
    while not isinstance(request, CallTool):  # the process dies while the write runs
        if isinstance(request, SaveCheckpoint):
            saves.append(request)
        if isinstance(request, BeginIntent) and request.save is not None:
            saves.append(request.save)  # what the store committed with the intent
        request = gen.send(answer(request))
    gen.close()
    last = saves[-1]
    resumed = RunState.restore(
        last.snapshot,
        run_id="r1",
        config=s.config,
        messages=list(s.messages),
        events=list(s.events),
    )
    pending = IdempotencyRecord("ticket", "K", "d", "pending", "r1", "w1")
    requests = drive(
        steps(resumed, resumed=True), lambda r: pending if isinstance(r, LoadIntent) else answer(r)
    )
    assert kinds(requests) == ["ReadClock", "LoadIntent", "SaveCheckpoint"]
    assert (resumed.state, resumed.reason) == ("review_required", "outcome_unknown")
