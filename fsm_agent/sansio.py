"""The hand-driving API: a run as a pure generator of requests (h11's style).

A run is a :class:`RunState`; :func:`start` writes its header and :func:`steps` drives
it, yielding each effect it needs as a plain-data request (:class:`AskModel`,
:class:`CallTool`, :class:`ReadClock`, ...). The caller performs the request and sends the
answer back; nothing here reads a clock, a file or a socket. The drivers of
:class:`fsm_agent.Runtime` are such callers; ``docs/guides/sans-io.md`` shows one by hand::

    s = RunState(run_id="r1", config=RunConfig(...), messages=[...])
    start(s)
    gen = steps(s)
    request = next(gen)
    while True:
        try:
            request = gen.send(perform(request))
        except StopIteration:
            break

Events are the typed values of the trace (:class:`RunStarted`, :class:`Transitioned`,
...; ``event_from_json`` reads one); machines are values (:class:`Machine`,
:data:`DEFAULT_MACHINE`, :func:`compile_machine`); the rule language is pure values too
(:class:`RuleSet` judges :class:`Facts` into a :class:`Judgement`).
"""

from fsm_agent._core.approvals import Approval, ApprovalBook
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.engine import compile_machine
from fsm_agent._core.events import (
    Decided,
    Event,
    EventError,
    Observed,
    ReasoningDelta,
    Reviewed,
    RuleJudged,
    RunEnded,
    RunStarted,
    TextDelta,
    ToolArgsDelta,
    Transitioned,
    UnknownEvent,
    event_from_json,
    json_schema,
)
from fsm_agent._core.loop import SCHEMA, Cancelled, Steps, review, settled, start, steps
from fsm_agent._core.requests import (
    AbortIntent,
    AskModel,
    BeginIntent,
    CallTool,
    CommitIntent,
    ConsumeApproval,
    EmitEvents,
    IdempotencyRecord,
    IntentClaim,
    LoadIntent,
    ModelAnswer,
    ReadClock,
    Request,
    RequestOf,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
    answers,
    answers_async,
)
from fsm_agent._core.state import Counters, RunConfig, RunState
from fsm_agent._core.table import (
    DEFAULT_MACHINE,
    STATES,
    TERMINAL_STATES,
    Machine,
    Transition,
    transitions_from,
)
from fsm_agent._rules import Facts, Judgement, RuleSet, ToolInfo

__all__ = [
    "DEFAULT_MACHINE",
    "SCHEMA",
    "STATES",
    "TERMINAL_STATES",
    "AbortIntent",
    "Approval",
    "ApprovalBook",
    "AskModel",
    "BeginIntent",
    "Budget",
    "CallTool",
    "Cancelled",
    "CommitIntent",
    "ConsumeApproval",
    "Counters",
    "Decided",
    "EmitEvents",
    "Event",
    "EventError",
    "Facts",
    "IdempotencyRecord",
    "IntentClaim",
    "Judgement",
    "LoadIntent",
    "Machine",
    "ModelAnswer",
    "Observed",
    "ReadClock",
    "ReasoningDelta",
    "Request",
    "RequestOf",
    "RetryPolicy",
    "Reviewed",
    "RuleJudged",
    "RuleSet",
    "RunConfig",
    "RunEnded",
    "RunStarted",
    "RunState",
    "SaveCheckpoint",
    "Sleep",
    "Steps",
    "TextDelta",
    "ToolArgsDelta",
    "ToolInfo",
    "ToolOutcome",
    "Transition",
    "Transitioned",
    "UnknownEvent",
    "answers",
    "answers_async",
    "compile_machine",
    "event_from_json",
    "json_schema",
    "review",
    "settled",
    "start",
    "steps",
    "transitions_from",
]
