"""Check by replay: the recorded inputs are fed to the engine's own loop, and what it
writes must be what the trace records (``fsm-agent.trace/3``).

:class:`Replay` rebuilds the run's :class:`~fsm_agent._core.state.RunState` from the
``run_start`` header (budget, retry, policy, allow-list, the tools' declared facts and
final argument schemas, the configured approvals) and drives the same
:func:`~fsm_agent._core.loop.steps` the runtime drives, answering every request from the
trace instead of the world (Temporal's ``Replayer`` is the model):

=====================  ==============================================================
request                answered with
=====================  ==============================================================
``AskModel``           the ``decision`` event's ``message`` (or its ``error``)
``ReadClock``          the next transition's ``t``
``CallTool``           the ``tool_returned`` transition's ``outcome`` and ``error``, and
                       the value its ``observation`` feeds back
``BeginIntent``,       the next transition's ``inputs`` (``begin_intent``,
``LoadIntent``         ``load_intent``), in order
``ConsumeApproval``    the ``dispatch`` transition's ``approval_use``
``Sleep``, others      nothing (they return nothing); a ``cancel`` transition next means
                       the driver stopped the run there (at the emit after an edge, or at
                       the request: ``Cancelled`` with the transition's ``by``, ``at``,
                       ``note``), a ``resumed`` input that a later driving took over
=====================  ==============================================================

A review is fired as the table's ``review`` trigger with the recorded decision
(``core.loop.review``, what the store does), and a resumed driving restores the replayed
state from the checkpoint its ``resumed`` input names, as the runtime does. Every event the
loop writes is compared with the recorded one field by field; the first difference in an
event is reported with its seq, the field, what the engine writes and what the trace
records. A guard, field or event the engine does not write is a violation; an input the
trace does not hold is a violation, never a pass. The loop decides, so a rule changed in
the engine changes what ``check`` accepts with no change here.

Memory stays constant: recorded events wait only until the engine reaches them (a few),
and the replayed history is dropped as the run goes (nothing the loop decides reads it).

What a replay skips where it cannot change the outcome, to check at the walker's speed:
a run without rules is replayed without an emit after every edge (the points where a
driver may stop a run: the loop is made to emit after each only while a recorded
``cancel``, a resume or a batch too large for the lookahead is ahead), and without
saving checkpoints (a snapshot of the whole state each; a resume from one earlier than
the state replayed raises :class:`Rewind`, and the checker replays the trace again,
keeping them). ``tests/test_replay_quiet.py`` holds both to the violations, word for
word, of the replay that emits after every edge and keeps every checkpoint.
"""

from __future__ import annotations

import ast
import json
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fsm_agent._core.approvals import ApprovalBook
from fsm_agent._core.budget import MAX_ERROR_CHARS
from fsm_agent._core.canonical import ArgumentsError, digest, parse_arguments
from fsm_agent._core.content import MAX_DEPTH as _MEDIA_DEPTH
from fsm_agent._core.content import File, Image
from fsm_agent._core.decision import Refused, parse_decision
from fsm_agent._core.formats import arguments_validator
from fsm_agent._core.intents import claim_from_json, record_from_json
from fsm_agent._core.jsonsafe import dumps_safe
from fsm_agent._core.judging import rules_machine
from fsm_agent._core.loop import Cancelled, review, steps
from fsm_agent._core.requests import (
    READ_CLOCK,
    AbortIntent,
    AskModel,
    BeginIntent,
    CallTool,
    CommitIntent,
    ConsumeApproval,
    EmitEvents,
    LoadIntent,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
)
from fsm_agent._core.state import RunConfig, RunState
from fsm_agent._core.streamed import fold_problems
from fsm_agent._core.table import DEFAULT_MACHINE, Machine
from fsm_agent._errors import ConfigError
from fsm_agent._rules import RuleSet, ToolInfo
from fsm_agent._rules.canonical import EARLIER_DIGESTS, INPUTS_DIGEST
from fsm_agent._rules.canonical import digest as rule_digest
from fsm_agent._trace.model import Settings
from fsm_agent._trace.walk import Write

__all__ = ["MAX_AHEAD", "Rebuilt", "Replay", "Rewind", "recorded_rules"]

#: Recorded events held while the engine has not reached them; past this the trace is
#: not replayable (memory stays bounded whatever a hostile trace holds).
MAX_AHEAD = 10_000
_KINDS = frozenset({"ok", "rejected", "transient", "timeout", "error", "not_started"})
#: Fields whose difference means the engine and the trace went different ways: replay
#: stops there (everything after would differ too).
_DIVERGING = ("type", "trigger", "source", "dest", "call_id", "tool")
_WAIT = object()  # the answer needs recorded events not read yet
#: Payload differences of a redacted trace its note shows (the others are counted).
_SHOWN = 5
#: Transitions read ahead before the loop is sent an answer: the pure steps that follow
#: one (model_replied, then validate, which uses approvals) take their inputs from the
#: transitions they write.
_READY = 3
#: Whether a run without rules is replayed without an emit after every edge where it
#: can be (:attr:`Replay.quiet`); off, every edge is followed by one (the reference the
#: quiet replay is tested against).
QUIET = True
#: The same while the loop runs without an emit after every edge (``Replay.quiet``):
#: it then takes every pure edge up to its next request in one go, at most two per call
#: of a batch of :data:`_QUIET_BATCH` calls and a few more, so a ``cancel`` (which needs
#: those emits) is read before the loop could pass the point where it landed.
_LOOK = 32
#: The largest batch replayed without an emit after every edge (see :data:`_LOOK`).
_QUIET_BATCH = 12
#: Messages of the replayed history kept before it is dropped (see ``Replay._after_send``).
_HISTORY = 16
#: Transitions read past that before the loop is driven again (fewer calls of it).
_SLACK = 16
#: "Every line from here on" for :attr:`Replay.loud_until`.
_EVER = 1 << 62


class ReplayTool:
    """A registered tool as the header records it: what admission reads."""

    __slots__ = (
        "dedup",
        "effect",
        "idempotency_key",
        "name",
        "requires_approval",
        "timeout_s",
        "validator",
    )

    def __init__(self, name: str, facts: Mapping[str, Any], replay: Replay) -> None:
        self.name = name
        self.effect = str(facts.get("effect"))
        self.dedup = facts.get("dedup") is True
        self.requires_approval = facts.get("requires_approval") is True
        self.timeout_s = None
        self.idempotency_key: Callable[[dict[str, Any]], Any] | None = None
        if facts.get("idempotent") is True:
            self.idempotency_key = replay.recorded_key
        schema = facts.get("schema")
        if not isinstance(schema, dict):
            raise ValueError(f"tool {name!r} has no argument schema (schema)")
        try:
            self.validator = _Remembering(arguments_validator(schema))
        except Exception as exc:  # a forged schema: SchemaError, or worse
            raise ValueError(f"tool {name!r}'s schema is not usable: {exc}") from None


class _Remembering:
    """A validator that remembers its verdicts: a long trace repeats few argument shapes
    and validation is most of the cost of replaying a call (bounded: a hostile trace
    varies arguments freely)."""

    __slots__ = ("seen", "validator")

    def __init__(self, validator: Any) -> None:
        self.validator = validator
        self.seen: dict[str, list[Any]] = {}

    def iter_errors(self, arguments: Any) -> list[Any]:
        try:
            key = _sorted_key(arguments)
        except (TypeError, ValueError, RecursionError):
            return list(self.validator.iter_errors(arguments))
        errors = self.seen.get(key)
        if errors is None:
            errors = list(self.validator.iter_errors(arguments))
            if len(self.seen) < 4096:
                self.seen[key] = errors
        return errors


def _sorted_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False)


def _sorted_encoder() -> Callable[[Any], str] | None:
    """``json.dumps(value, sort_keys=True, allow_nan=False)`` without building an encoder
    per call (one per replayed call: half the cost of the cache's key), or ``None``
    without the C accelerator. No cycle check: parsed arguments have no cycles, and a
    value that recursed would raise ``RecursionError`` (not remembered)."""
    try:
        from json.encoder import c_make_encoder  # type: ignore[attr-defined]
        from json.encoder import encode_basestring_ascii as c_ascii
    except ImportError:  # pragma: no cover - CPython has them
        return None
    if c_make_encoder is None:
        return None
    encode = c_make_encoder(
        None, json.JSONEncoder().default, c_ascii, None, ": ", ", ", True, False, False
    )
    join = "".join

    def dumps(value: Any) -> str:
        return join(encode(value, 0))

    return dumps


_sorted_key: Callable[[Any], str] = _sorted_encoder() or _sorted_json


class _RecordedBook(ApprovalBook):
    """The configured approvals as the header records them (digests and ``max_uses``):
    which covers a call, and how many uses it has in all. The uses spent are the
    store's answers (``approval_use`` on ``dispatch``)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.ids = {digest: f"config:{digest[:16]}" for digest in settings.approvals}
        self.limits = {self.ids[d]: n for d, n in settings.approvals.items() if n is not None}

    def find(self, args_digest: str) -> str | None:
        return self.ids.get(args_digest)

    def limit(self, approval_id: str) -> int | None:
        return self.limits.get(approval_id)

    @property
    def limited(self) -> bool:
        return bool(self.limits)


#: ``(rule id, phase, facts) -> whether it held``: what an opaque rule's stand-in answers.
StandIn = Callable[[str, str, Any], bool]


def recorded_rules(
    head: Mapping[str, Any], stand_in: StandIn | None = None
) -> tuple[RuleSet | None, Machine]:
    """The rules a header records, rebuilt, and the machine they ran in (the default one
    plus their rows, covering the recorded rules' hash): :class:`ConfigError` if they
    cannot be rebuilt. An opaque rule (a Python ``when``) is rebuilt with a stand-in
    calling ``stand_in(rule id, facts)`` (default: never holds), since ``check`` cannot
    run the application's code."""
    rebuilt = Rebuilt.of(head)
    if stand_in is not None:
        rebuilt.asker.ask = stand_in
    return rebuilt.rules, rebuilt.machine


class _Asker:
    """Where the rebuilt opaque rules' stand-ins send their question: a replay sets
    :attr:`ask` once it exists, so the checker's header and the replay share one
    rebuilt rule set (built once per trace, not once by each)."""

    __slots__ = ("ask",)

    def __init__(self) -> None:
        self.ask: StandIn = lambda rule_id, phase, facts: False

    def __call__(self, rule_id: str, phase: str, facts: Any) -> bool:
        return self.ask(rule_id, phase, facts)


@dataclass(frozen=True)
class Rebuilt:
    """A header's rules rebuilt (``None`` without rules), their machine, and where
    their opaque stand-ins ask."""

    rules: RuleSet | None
    machine: Machine
    asker: _Asker

    @classmethod
    def of(cls, head: Mapping[str, Any]) -> Rebuilt:
        """Rebuild; :class:`ConfigError` (or the reading's error) if they cannot be."""
        asker = _Asker()
        data = head.get("rules")
        if data is None:
            return cls(None, DEFAULT_MACHINE, asker)
        if not isinstance(data, Mapping) or not isinstance(data.get("rules"), list):
            raise ConfigError("the header's rules are not a recorded rule set")
        facts = head.get("tools")
        tools = {
            str(name): ToolInfo(str(f.get("effect")), f.get("schema"))
            for name, f in (facts.items() if isinstance(facts, Mapping) else ())
            if isinstance(f, Mapping)
        }
        stand_ins: dict[str, Callable[[Any], Any]] = {}
        for item in data["rules"]:
            when = item.get("when") if isinstance(item, Mapping) else None
            if isinstance(when, Mapping) and isinstance(when.get("digest"), str):
                rule_id, phase = str(item.get("id")), str(item.get("on"))
                stand_ins[when["digest"]] = _stand_in(asker, rule_id, phase, when.get("python"))
        rules = RuleSet.from_json(data, tools, callables=stand_ins)
        return cls(rules, rules_machine(rules, rules_hash=rule_digest(dict(data))), asker)


def _stand_in(ask: StandIn, rule_id: str, phase: str, name: Any) -> Callable[[Any], Any]:
    """An opaque rule's stand-in, named as the recorded callable (a verdict's default
    detail names it), answering as ``ask`` says."""

    def stand_in(facts: Any) -> bool:
        return ask(rule_id, phase, facts)

    module, _, qualname = str(name).partition(".")
    stand_in.__module__, stand_in.__qualname__ = module, qualname or module
    return stand_in


def _config(
    head: Mapping[str, Any], replay: Replay, rebuilt: Rebuilt | None, saving: bool
) -> tuple[RunConfig | None, list[str]]:
    """The run's configuration as the header records it, emitting after every edge (the
    points where a driver may stop the run), or the header's problems."""
    settings = Settings(head)
    problems = list(settings.problems)
    try:
        if rebuilt is None:
            rebuilt = Rebuilt.of(head)
        rebuilt.asker.ask = replay.recorded_verdict
        rules, machine = rebuilt.rules, rebuilt.machine
    except (ConfigError, ValueError, TypeError, KeyError) as exc:
        problems.append(f"rules cannot be rebuilt ({exc})")
        rules, machine = None, DEFAULT_MACHINE
    tools: dict[str, ReplayTool] = {}
    for name, facts in settings.tools.items():
        try:
            tools[name] = ReplayTool(name, facts, replay)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        return None, problems
    config = RunConfig(
        budget=settings.budget,
        retry=settings.retry,
        policy="strict" if settings.strict else "default",
        allowed=settings.allowed,
        tools=tools.get,
        tool_specs=[],
        approvals=_RecordedBook(settings),
        # Every point a live run of either save mode checkpoints at: a resume restores one
        # (only when it is asked to: a checkpoint costs a snapshot of the whole state).
        save="replies" if saving else "never",
        # An emit after every edge: the points where a driver may stop the run.
        emit=True,
        machine=machine,
        rules=rules,
    )
    return config, []


class Replay:
    """Feed it the trace's events in order (:meth:`feed`, or :meth:`feed_many` in
    chunks), then :meth:`finish`. ``fail(line, message)`` receives each violation."""

    # (More attributes than an instance dict shares its keys for: slots keep every
    # ``self.x`` of the per-event path a fixed offset.)
    __slots__ = (
        "_fail",
        "_note_to",
        "big",
        "calls",
        "cancelled",
        "config",
        "dead",
        "executed",
        "facts",
        "fed",
        "finished",
        "fresh",
        "gen",
        "input_item",
        "input_line",
        "input_used",
        "last_trigger",
        "line",
        "loud_until",
        "matched",
        "noted",
        "pending",
        "problem",
        "quiet",
        "redacted",
        "request",
        "restarted",
        "rewritten",
        "rewritten_count",
        "s",
        "saving",
        "since_save",
        "snapshot",
        "transitions",
        "uses",
        "wake",
        "writes",
    )

    def __init__(
        self,
        head: Mapping[str, Any],
        fail: Callable[[int, str], None],
        *,
        writes: list[Write] | None = None,
        note: Callable[[str], None] | None = None,
        rebuilt: Rebuilt | None = None,
        saving: bool = True,
    ) -> None:
        """``rebuilt``: the header's rules already rebuilt (:meth:`Rebuilt.of`), which
        this replay then judges with instead of rebuilding them."""
        self._fail = fail
        #: Whether the loop saves its checkpoints (a resume restores one). Without, a
        #: resume from a checkpoint before the state replayed so far raises
        #: :class:`Rewind`: the caller replays the trace again, saving.
        self.saving = saving
        self._note_to = note
        #: The header says a redaction hook rewrote the events (``Runtime(redact=...)``):
        #: a payload that differs from what the engine writes is a note, not a violation.
        self.redacted = head.get("redacted") is True
        self.rewritten: list[str] = []  # the payload differences of a redacted trace
        self.rewritten_count = 0
        self.writes = writes
        self.pending: deque[tuple[int, dict[str, Any]]] = deque()
        self.dead = False
        self.matched = 0  # events the engine wrote that were compared
        self.line = 1
        self.fed = 1  # the last line fed
        self.finished = False
        self.fresh = True  # the next ReadClock is a run's first (answered 0)
        self.cancelled = False
        self.restarted = 0  # line of the resume the replay last restarted for
        self.input_line = 0
        self.input_used: dict[str, int] = {}
        self.input_item: dict[str, Any] = {}  # the last input taken, whole
        self.snapshot: dict[str, Any] | None = None  # the last checkpoint saved
        self.since_save: list[tuple[int, dict[str, Any]]] = []  # events compared since
        self.problem: str | None = None  # an input the engine took that the trace refuses
        self.last_trigger = ""
        self.calls: Any = None  # the last decision's recorded tool calls
        self.executed: dict[tuple[str, str], int] = {}
        self.uses: dict[str, set[str]] = {}  # approval id -> calls the trace spent it on
        tools = head.get("tools")
        self.facts: Mapping[str, Any] = tools if isinstance(tools, Mapping) else {}
        self.noted = _noted(self.facts)
        self.transitions = 0  # transitions in ``pending``
        self.loud_until = 0  # the last line up to which the loop emits after every edge
        self.big = False  # the last decision fed holds more than _QUIET_BATCH calls
        self.wake = 0  # the transitions pending that the loop waits for
        config, problems = _config(head, self, rebuilt, saving)
        if config is None:
            fail(1, "the header " + "; ".join(problems) + ": the run cannot be replayed")
            self.dead = True
            return
        self._begin(head, config, note)

    def _begin(
        self, head: Mapping[str, Any], config: RunConfig, note: Callable[[str], None] | None
    ) -> None:
        """The replayed run's state as the header starts it, and its loop at its first
        request."""
        self.config = config
        # Emitting after every edge is what lets the replay stop the loop where a driver
        # stopped the run, and what a rule's recorded verdict is read ahead for; it costs
        # a round trip per edge. A run without rules is replayed without it ("quiet")
        # except while a recorded cancel or a batch too large for the lookahead is ahead.
        self.quiet = (
            config if config.rules is not None or not QUIET else replace(config, emit=False)
        )
        run_id = head.get("run_id")
        self.s = RunState(
            run_id=run_id if isinstance(run_id, str) else "", config=config, messages=[]
        )
        self.s.seq = 0
        context = head.get("context")
        self.s.context = dict(context) if isinstance(context, Mapping) else {}
        if config.rules is not None and note is not None:
            for rule_id in config.rules.opaque_rules:
                note(f"rule {rule_id!r} is a Python callable: check cannot re-evaluate it, "
                     "so its verdicts are taken as the trace records them")  # fmt: skip
        self.gen = steps(self.s)
        self.request: Any = next(self.gen)

    # ── the feed ──────────────────────────────────────────────────────────────────

    def feed(self, line: int, event: dict[str, Any]) -> None:
        """The next recorded event, as read (the chain's fields are dropped)."""
        event.pop("chain", None)
        event.pop("run", None)
        self.feed_many([(line, event)])

    def feed_many(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        """The next recorded events, in order, each ``(line, event)`` without the chain's
        fields (the checker's loop hands them over in chunks). The loop is run whenever
        the transitions it waits for are in."""
        if self.dead or not events:
            return
        pending = self.pending
        append = pending.append
        # (Locals for the per-event loop; stored back before the loop runs, which
        # takes transitions off ``pending``.)
        transitions, wake = self.transitions, self.wake
        for item in events:
            append(item)
            event = item[1]
            kind = event.get("type")
            if kind == "transition":
                transitions += 1
                # Where a driver stopped the run, or a resume took over, the replay meets
                # it at a request: the loop then makes one after every edge.
                if event.get("trigger") == "cancel" or (
                    "inputs" in event and _resumed(event) is not None
                ):
                    self.loud_until = max(self.loud_until, item[0])
                if transitions >= wake:
                    self.fed, self.transitions, self.wake = item[0], transitions, 0
                    self._run(final=False)
                    if self.dead:
                        return
                    transitions, wake = self.transitions, self.wake
            elif kind == "decision":
                self._batch_ahead(item[0], event)
        self.transitions, self.wake = transitions, wake
        self.fed = item[0]
        if len(pending) > MAX_AHEAD:  # (checked once a chunk: pending stays bounded)
            line = pending[MAX_AHEAD][0]
            self.stop(line, f"{MAX_AHEAD} events recorded that the engine never reaches")

    def _batch_ahead(self, line: int, event: dict[str, Any]) -> None:
        """A decision read ahead: a batch too large to replay quietly makes the loop
        emit after every edge until the next decision (or the end)."""
        if self.big:
            self.loud_until, self.big = max(self.loud_until, line), False
        message = event.get("message")
        calls = message.get("tool_calls") if type(message) is dict else None
        if type(calls) is list and len(calls) > _QUIET_BATCH:
            self.loud_until, self.big = _EVER, True

    def skip(self, line: int, *, numbered: bool) -> None:
        """A line that holds no event (reported already): the events the engine writes
        cannot be compared past it."""
        if not self.dead:
            self.dead = True
            self.pending.clear()

    def finish(self, line: int) -> None:
        self._end(line)
        self._report_rewritten()

    def _end(self, line: int) -> None:
        if self.dead:
            return
        self._run(final=True)
        if self.dead:
            return
        s = self.s
        if self.pending:
            at, e = self.pending[0]
            self.fail(at, f"{_describe(e)}, which the engine does not write here")
        elif len(s.events) > self.matched:
            e = s.events[self.matched]
            if e.get("type") == "run_end":
                self.fail(line, f"the trace ends in state {s.state} without run_end")
            else:
                self.fail(line, f"the trace ends here; the engine writes next {_describe(e)}")
        elif not self.finished:
            self.fail(line, f"the trace ends in state {s.state} without run_end")

    def fail(self, line: int, message: str) -> None:
        self._fail(line, message)

    def _payload(self, line: int, message: str) -> None:
        """A payload field that differs from what the engine writes: a violation, or in
        a redacted trace a difference the hook may have made (kept for one note)."""
        if not self.redacted:
            self.fail(line, message)
            return
        self.rewritten_count += 1
        if len(self.rewritten) < _SHOWN:
            self.rewritten.append(f"line {line}: {message}")

    def _report_rewritten(self) -> None:
        if not self.rewritten_count:
            return
        more = self.rewritten_count - len(self.rewritten)
        text = (
            f"the run was recorded through a redaction hook (redacted in the header): "
            f"{self.rewritten_count} payload field(s) differ from what the engine writes, "
            "taken as the hook's rewriting, not as violations: " + "; ".join(self.rewritten)
        ) + (f"; and {more} more" if more > 0 else "")
        self.rewritten, self.rewritten_count = [], 0
        if self._note_to is not None:
            self._note_to(text)

    def stop(self, line: int, message: str) -> None:
        """A violation after which the trace cannot be replayed any further."""
        self.fail(line, message + " (not replayed past here)")
        self.dead = True
        self.pending.clear()

    def refuse(self, message: str) -> None:
        """An input the engine was given that the trace's own facts rule out."""
        self.problem = self.problem or message

    # ── driving the loop ──────────────────────────────────────────────────────────

    def _run(self, *, final: bool) -> None:  # noqa: C901 - the per-request loop, kept flat
        pending = self.pending
        while not self.dead:
            s = self.s
            if s.events and not self._compare():
                return
            if self.finished:
                if not self._after_end(final):
                    return
                continue
            head = pending[0] if pending else None
            if head is not None and head[0] > self.loud_until:
                s.config, ready = self.quiet, _LOOK
            else:
                s.config, ready = self.config, _READY
            if not final and self.transitions < ready:
                # An input a pure step takes (an approval use) may be further on; woken
                # again some events later, not at every one.
                self.wake = ready + _SLACK
                return
            request = self.request
            if (
                head is not None
                and (nxt := head[1]).get("type") == "transition"
                and "inputs" not in nxt
                and nxt.get("trigger") != "cancel"
            ):  # a plain transition next: the clock read before it, or the call it
                # reports (most requests), answered here as _answer answers them
                if request is READ_CLOCK and type(t := nxt.get("t")) is float and not self.fresh:
                    answer: Any = t + s.started
                elif type(request) is CallTool:
                    answer = self._outcome(0, nxt, final)
                else:
                    answer = self._answer(final)
            else:
                answer = self._answer(final)
            if answer is _WAIT:
                return
            # (The answer sent here, not by a call of _send: once per request.)
            try:
                if type(answer) is Cancelled:
                    self.cancelled = True
                    self.request = self.gen.throw(answer)
                else:
                    self.request = self.gen.send(answer)
            except StopIteration:
                self.finished = True
            except Exception as exc:  # the engine itself stopped on what the trace holds
                self._raised(exc)
                continue
            if self.problem is not None or len(self.s.messages) > _HISTORY:
                self._after_send()

    def _raised(self, exc: Exception) -> None:
        if self.s.events:  # the edges taken before it first (see take_input)
            self._compare()
            if self.dead:
                return
        self.stop(self.line, f"the engine raised {type(exc).__name__}: {exc} replaying this trace")

    def _after_send(self) -> None:
        """An input the engine took that the trace refuses, reported; the history that
        grew dropped."""
        if self.problem is not None:
            problem, self.problem = self.problem, None
            self.fail(self._input_line(), problem)
        s = self.s
        if len(s.messages) > _HISTORY and not s.placeholders:
            # Nothing the loop decides reads the history; kept short, it costs a copy of
            # a few items at each model call and each checkpoint.
            s.messages.clear()
            s.saved_messages = 0
            s.rewritten.clear()

    def _cancel_here(self) -> bool:
        """Whether the driver stopped the run right after the edge just taken (Ctrl-C, a
        cancelled task, an injected fault): the next recorded event is a ``cancel`` from
        the state the run is in, before the store or a tool was asked anything more. (A
        cancel during a tool call or after a store's answer lands at that request.)"""
        if self.cancelled or not self.pending:
            return False
        e = self.pending[0][1]
        if e.get("trigger") != "cancel" or e.get("source") != self.s.state or "inputs" in e:
            return False
        guards = e.get("guards")
        return not (isinstance(guards, dict) and guards.get("write_in_flight") is True)

    def _compare(self) -> bool:
        """Compare what the engine wrote with what the trace records, as far as both
        go; False when the engine's events wait for recorded ones not read yet."""
        produced = self.s.events
        if not produced:
            return True
        pending = self.pending
        # (Locals for the per-event loop: every recorded event passes here once; the
        # counters and cursors are stored back on the way out.)
        popleft, since, saving = pending.popleft, self.since_save, self.saving
        matched, count = self.matched, len(produced)
        noted = self.noted
        taken = 0  # transitions taken off ``pending``
        last: dict[str, Any] | None = None  # the last transition compared
        done = True
        line = self.line
        while matched < count:
            if not pending:
                done = False
                break
            line, recorded = item = popleft()
            mine = produced[matched]
            matched += 1
            if recorded == mine:
                kind = mine["type"]  # (every event the engine writes has one)
            else:
                kind = recorded.get("type")
                edge = kind == "transition"  # taken off ``pending`` with the others
                self._mismatch(line, matched, taken + edge, recorded, mine)
                taken = -edge  # (the count starts again after it; it is added below)
                if self.dead:
                    return False
            if kind == "transition":
                taken += 1
                last = recorded
            elif kind in noted:
                if last is not None:  # (what an observation's note reads)
                    self.last_trigger = last.get("trigger") or ""
                self._note(line, recorded)
            if saving and len(since) < MAX_AHEAD:
                since.append(item)
        self.line = line
        self.transitions -= taken
        if last is not None:
            self.last_trigger = last.get("trigger") or ""
        if not done:
            self.matched = matched
            return False
        produced.clear()
        self.matched = 0
        self.s.emitted = self.s.saved_events = 0
        return True

    def _mismatch(
        self, line: int, matched: int, taken: int, recorded: dict[str, Any], mine: dict[str, Any]
    ) -> None:
        """An event the engine writes that differs from the recorded one: the cursors of
        :meth:`_compare` stored (``taken``: the transitions it took off ``pending``), then
        the difference reported."""
        self.line, self.matched, self.transitions = line, matched, self.transitions - taken
        self._diff(line, recorded, mine)

    def _saved(self, save: SaveCheckpoint) -> None:
        """A checkpoint the live run may have saved here: a resume may restore it."""
        self.snapshot = save.snapshot
        self.since_save = []

    def _diff(self, line: int, recorded: dict[str, Any], mine: dict[str, Any]) -> None:
        seq = mine.get("seq")
        if recorded.get("seq") != seq:
            self.stop(
                line,
                f"seq is {_js(recorded.get('seq'))}, expected {seq} (events missing, "
                f"duplicated or reordered): the engine writes {_describe(mine)} "
                f"here; the trace records {_describe(recorded)}",
            )
            return
        if self._diverged(line, seq, recorded, mine):
            return
        for name in sorted(set(recorded) | set(mine)):
            # Guards are the engine's own outcomes, not payload: strict, redacted or not.
            differ = self.fail if name == "guards" else self._payload
            if name not in mine:
                differ(
                    line,
                    f"seq {seq}: the trace records {name} {_js(recorded[name])}, which "
                    "the engine does not write",
                )
            elif name not in recorded:
                differ(
                    line,
                    f"seq {seq}: {name}: the engine writes {_js(mine[name])}; the "
                    "trace records none",
                )
            elif name == "guards":
                self._diff_guards(line, seq, recorded[name], mine[name])
            elif name == "t" and _close(recorded[name], mine[name]):
                continue
            elif name == "result" and "oversized" in mine and recorded[name] != mine[name]:
                # One message, not one per field: the stand-in is all the run kept.
                self._payload(
                    line,
                    f"seq {seq}: an oversized answer must be the stand-in "
                    f"{_js(mine[name])} (the run kept it by its size only); the trace "
                    f"records {_js(recorded[name])}",
                )
            elif type(mine[name]) is dict and type(recorded[name]) is dict and name != "message":
                self._diff_fields(line, f"seq {seq}: {name}.", recorded[name], mine[name])
            elif recorded[name] != mine[name]:
                hint = " (events missing, duplicated or reordered)" if name == "seq" else ""
                self._payload(
                    line,
                    f"seq {seq}: {name}: the engine writes {_js(mine[name])}; the "
                    f"trace records {_js(recorded[name])}{hint}",
                )

    def _diverged(
        self, line: int, seq: Any, recorded: dict[str, Any], mine: dict[str, Any]
    ) -> bool:
        """Stop where the engine and the trace went different ways, or where the trace's
        rule event is of the earlier digest form (every one after would differ too)."""
        for name in _DIVERGING:
            if recorded.get(name) != mine.get(name):
                why = _guard_changes(recorded.get("guards"), mine.get("guards"))
                self.stop(
                    line,
                    f"seq {seq}: the engine writes {_describe(mine)} here{why}; the "
                    f"trace records {_describe(recorded)}",
                )
                return True
        old, new = recorded.get("inputs_digest"), mine.get("inputs_digest")
        if not _earlier_digest(old, new):
            return False
        self.stop(
            line,
            f"seq {seq}: inputs_digest {_js(old)} is in the digest form of an earlier "
            "development build ('sha256:...': the inputs as one JSON document; "
            "'v2:sha256:...': calls as a chain of their digests); this fsm-agent writes "
            f"and checks form 3 ('{INPUTS_DIGEST}...', docs/concepts/traces.md): the trace "
            "cannot be checked here; record the run again",
        )
        return True

    def _diff_fields(
        self, line: int, where: str, recorded: dict[str, Any], mine: dict[str, Any]
    ) -> None:
        for name in sorted(set(recorded) | set(mine), key=str):
            if name not in mine:
                self._payload(
                    line,
                    f"{where}{name}: the trace records {_js(recorded[name])}, which "
                    "the engine does not write",
                )
            elif name not in recorded:
                self._payload(
                    line,
                    f"{where}{name}: the engine writes {_js(mine[name])}; the trace records none",
                )
            elif recorded[name] != mine[name]:
                self._payload(
                    line,
                    f"{where}{name}: the engine writes {_js(mine[name])}; the trace "
                    f"records {_js(recorded[name])}",
                )

    def _diff_guards(self, line: int, seq: Any, recorded: Any, mine: dict[str, bool]) -> None:
        if not isinstance(recorded, dict):
            self.fail(
                line, f"seq {seq}: guards: the trace records {_js(recorded)}, not guard outcomes"
            )
            return
        for name in mine:
            if name not in recorded:
                self.fail(
                    line,
                    f"seq {seq}: guard {name}: the engine evaluates it ({_js(mine[name])}); "
                    "the trace does not record it",
                )
            elif recorded[name] != mine[name]:
                self.fail(
                    line,
                    f"seq {seq}: guard {name}: the engine gives {_js(mine[name])}; "
                    f"the trace records {_js(recorded[name])}",
                )
        for name in recorded:
            if name not in mine:
                self.fail(
                    line,
                    f"seq {seq}: guard {name}: the trace records it ({_js(recorded[name])}); "
                    "the engine does not evaluate it here",
                )

    # ── answers ───────────────────────────────────────────────────────────────────

    def _ahead(self, final: bool) -> Any:
        """(index in pending, event) of the next recorded transition after what the
        engine wrote so far, ``_WAIT``, or None at the end of the trace."""
        pending = self.pending
        for i in range(len(self.s.events) - self.matched, len(pending)):
            if pending[i][1].get("type") == "transition":
                return i, pending[i][1]
        return None if final else _WAIT

    def _resumed_at_start(self, final: bool) -> bool:
        """Whether a resume took over the run from its header's checkpoint (a worker
        driving a submitted run): restarted here, at the first clock reading, since a
        replay that keeps no checkpoints makes no request at the header's (where one that
        keeps them restarts: the state is the same)."""
        ahead = self._ahead(final)
        if type(ahead) is not tuple:
            return False
        at, nxt = ahead
        if _resumed(nxt) is None or any(
            self.pending[i][1].get("type") == "review" for i in range(at)
        ):
            return False
        self._restart(self.pending[at][0], nxt)
        return True

    def _answer(self, final: bool) -> Any:  # noqa: C901 - one branch per request kind
        request = self.request
        if request is READ_CLOCK and self.fresh:
            if not self.saving and not self.restarted and self._resumed_at_start(final):
                return _WAIT if self.dead else self._answer(final)
            self.fresh = False
            return 0.0
        # (Everything the loop wrote was compared: the next recorded event is the first
        # pending, most often the transition itself.)
        pending = self.pending
        if pending and (nxt := pending[0][1]).get("type") == "transition":
            at = 0
        else:
            ahead = self._ahead(final)
            if ahead is _WAIT:
                return _WAIT
            if ahead is None and isinstance(
                request, (SaveCheckpoint, EmitEvents, CommitIntent, AbortIntent, Sleep)
            ):  # answered with nothing: no input to read ahead for
                if isinstance(request, SaveCheckpoint):
                    self._saved(request)
                return None
            if ahead is None:
                message = f"the trace ends while the engine waits for {_request(request)}"
                self.stop(self.fed, message)
                return _WAIT
            at, nxt = ahead
        if (
            "inputs" in nxt
            and _resumed(nxt) is not None
            and self.pending[at][0] != self.restarted
            and not any(self.pending[i][1].get("type") == "review" for i in range(at))
        ):  # (reviews come first: the run ends, is reviewed, then resumes)
            self._restart(self.pending[at][0], nxt)  # the process died; a resume followed
            return _WAIT if self.dead else self._answer(final)
        kind = type(request)
        if kind is SaveCheckpoint:
            self._saved(request)
            return None
        if kind is EmitEvents:  # after every edge: where a driver may stop it
            return _cancelled(self.pending[0][1]) if self._cancel_here() else None
        if nxt.get("trigger") == "cancel" and not self.cancelled and kind is not AskModel:
            return _cancelled(nxt)
        if request is READ_CLOCK:
            t = nxt.get("t")
            if type(t) is not float and type(t) is not int:
                self.stop(
                    self.pending[at][0],
                    f"seq {nxt.get('seq')}: t {_js(t)} is not a clock reading: the "
                    "run's clock cannot be replayed",
                )
                return _WAIT
            return t + self.s.started
        if kind is AskModel:
            return self._reply(at, nxt, final)
        if kind is CallTool:
            return self._outcome(at, nxt, final)
        if isinstance(request, BeginIntent):
            if request.save is not None:
                self._saved(request.save)
            claim = self.take_input(
                "begin_intent", f"begin the intent of call {request.record.call_id!r}"
            )
            try:
                return _WAIT if claim is _WAIT else claim_from_json(claim)
            except ValueError as exc:
                self.stop(self._input_line(), f"the recorded intent claim is not one: {exc}")
                return _WAIT
        if isinstance(request, LoadIntent):
            record = self.take_input("load_intent", f"load the record of {request.tool!r}")
            try:
                return _WAIT if record is _WAIT else record_from_json(record)
            except ValueError as exc:
                self.stop(self._input_line(), f"the recorded idempotency record is not one: {exc}")
                return _WAIT
        if isinstance(request, ConsumeApproval):
            return self._use(at, nxt, request)
        if isinstance(request, Sleep):
            return None
        return None  # CommitIntent, AbortIntent (and saves, emits: none in a replay)

    def _reply(self, at: int, nxt: dict[str, Any], final: bool) -> Any:
        offset = len(self.s.events) - self.matched
        line, head = self.pending[offset]
        if head.get("type") != "decision":
            if nxt.get("trigger") == "cancel" and head is nxt:
                return _cancelled(nxt)
            self.stop(
                line,
                f"the engine asks the model here; the trace records {_describe(head)}, "
                "not a decision",
            )
            return _WAIT
        if "oversized" in head and "message" not in head:
            return self._sized_reply(line, head)
        if "message" not in head:
            error = head.get("error")
            if isinstance(error, str):
                error = _unbounded(error)
                if error is None:
                    self.stop(
                        line,
                        f"seq {head.get('seq')}: the model's error is recorded cut by more "
                        f"than {_MAX_SIZED} characters: this check does not replay it",
                    )
                    return _WAIT
            return _failure(error)
        message = head["message"]
        raw = head.get("raw_arguments")
        if isinstance(raw, dict) and isinstance(message, dict):
            message = _with_raw_arguments(message, raw)
        verdict = head.get("malformed")
        if (
            isinstance(verdict, str)
            and isinstance(message, dict)
            and parse_decision(message).malformed is None
        ):
            return Refused(message, verdict)  # refused for what its copy no longer shows
        return message

    def _sized_reply(self, line: int, head: dict[str, Any]) -> Any:
        """A reply recorded by its size (over ``max_reply_bytes``) and usage: one of that
        size with that usage, which the engine measures and refuses the same way."""
        usage = head.get("usage")
        shape: dict[str, Any] = {"role": "assistant", "content": ""}
        if isinstance(usage, dict):
            shape["usage"] = usage
        reply = _sized(head.get("oversized"), shape, "content")
        if reply is None:
            self.stop(
                line,
                f"seq {head.get('seq')}: oversized {_js(head.get('oversized'))} "
                "is not a reply size this check replays",
            )
            return _WAIT
        return {**shape, "content": reply}

    def _outcome(self, at: int, nxt: dict[str, Any], final: bool) -> Any:
        line = self.pending[at][0]
        if nxt.get("trigger") != "tool_returned":
            return ToolOutcome("ok")  # the diff at the next transition says what is wrong
        kind, error = nxt.get("outcome"), nxt.get("error", "")
        if kind not in _KINDS or not isinstance(error, str):
            self.stop(
                line,
                f"seq {nxt.get('seq')}: outcome {_js(kind)} / error {_js(error)} "
                "is not a tool outcome: the call cannot be replayed",
            )
            return _WAIT
        value = None
        if kind == "ok":
            if at + 1 >= len(self.pending):
                return None if final else _WAIT
            after = self.pending[at + 1][1]
            result = after.get("result")
            if after.get("type") == "observation" and "oversized" in after:
                # Recorded by its size only: a value of that size takes the same path.
                value = _sized(after.get("oversized"), {"ok": True, "value": ""}, "value")
                if value is None:
                    self.stop(
                        self.pending[at + 1][0],
                        f"seq {after.get('seq')}: oversized {_js(after.get('oversized'))} "
                        "is not a result size this check replays",
                    )
                    return _WAIT
            elif at and (withheld := self._withheld(at)):
                value = withheld[0]  # an after_tool rule denied it: the rule event has it
            elif after.get("type") == "observation" and isinstance(result, dict):
                if result.get("error") == "output_too_large":  # an ok call's stand-in
                    self.stop(
                        self.pending[at + 1][0],
                        f"seq {after.get('seq')}: the result is the stand-in of one kept "
                        "by its size, and the observation records no oversized (that "
                        "size): the call cannot be replayed",
                    )
                    return _WAIT
                value = result.get("value")
                if "media_bytes" in after:
                    # The media the run handed on: stand-ins of their recorded sizes,
                    # which the engine splits off, counts and numbers again.
                    value = _with_media(value, self.config.budget.max_media_bytes)
        return ToolOutcome(kind, value, error)

    def _withheld(self, at: int) -> tuple[Any] | None:
        """The result an ``after_tool`` rule withheld from the model, as its ``rule``
        event (just before the ``tool_returned`` at ``at``) records it."""
        if at < 1:
            return None
        e = self.pending[at - 1][1]
        if e.get("type") == "rule" and e.get("phase") == "after_tool" and "result" in e:
            return (e["result"],)
        return None

    def _use(self, at: int, nxt: dict[str, Any], request: ConsumeApproval) -> Any:
        """The store's answer to spending a use of a limited approval: ``approval_use``
        on the dispatch transition, within ``max_uses`` in this trace (other runs' uses
        are the store's to count: ``check --db``)."""
        use = nxt.get("approval_use")
        if use not in ("granted", "refused"):
            self.stop(
                self.pending[at][0],
                f"seq {nxt.get('seq')}: the engine spends a use of approval "
                f"{request.approval_id!r} "
                f"for call {request.call_id!r} here; the trace records no approval_use",
            )
            return _WAIT
        if use == "granted":
            uses = self.uses.setdefault(request.approval_id, set())
            uses.add(request.call_id)
            if len(uses) > request.max_uses:
                self.fail(
                    self.pending[at][0],
                    f"seq {nxt.get('seq')}: approval {request.approval_id!r} covers "
                    f"{request.max_uses} call(s); this trace spends it on {len(uses)}",
                )
        return use == "granted"

    def take_input(self, kind: str, what: str) -> Any:
        """The next recorded answer of ``kind`` among the next transition's ``inputs``
        (each kind in the order the loop took them), or ``_WAIT`` (the replay stops)
        when the trace holds none."""
        if self.s.events:
            # Asked in the middle of a quiet answer: the edges taken before it are compared
            # first, as when each is followed by an emit (their difference comes first).
            self._compare()
            if self.dead:
                return _WAIT
        ahead = self._ahead(final=True)
        if ahead is None:
            self.stop(self.fed, f"the engine asks the world to {what}; the trace ends first")
            return _WAIT
        at, nxt = ahead
        line = self.pending[at][0]
        if line != self.input_line:
            self.input_line, self.input_used = line, {}
        inputs = nxt.get("inputs")
        used = self.input_used.get(kind, 0)
        seen = 0
        for item in inputs if isinstance(inputs, list) else ():
            if isinstance(item, dict) and kind in item:
                if seen == used:
                    self.input_used[kind] = used + 1
                    self.input_item = item
                    return item[kind]
                seen += 1
        self.stop(
            line,
            f"seq {nxt.get('seq')}: the engine asks the world to {what} before "
            f"this transition; the trace records no such answer ({kind} {used + 1} "
            "in inputs)",
        )
        return _WAIT

    def recorded_verdict(self, rule_id: str, phase: str, facts: Any) -> bool:
        """An opaque rule's verdict as recorded: whether the next recorded ``rule`` event
        of its phase and call names it (the replay cannot run the application's code; the
        executions an opaque ``limit`` counts cannot be replayed either, and its verdict
        is then compared as the engine reaches it)."""
        call_id = getattr(facts, "call_id", None)
        for _, event in self.pending:
            if event.get("type") == "rule" and (event.get("phase"), event.get("call_id")) == (
                phase,
                call_id,
            ):
                return bool(event.get("rule") == rule_id)
        return False

    def recorded_key(self, arguments: dict[str, Any]) -> str:
        """A keyed tool's idempotency key: the registrar's function is code, so the
        loop records the key it derived (``idempotency_key`` inputs)."""
        key = self.take_input("idempotency_key", "derive an idempotency key")
        if isinstance(key, str):
            return key
        # The registrar's function raised: the refusal says what it raised, the same way.
        detail = self.input_item.get("detail") if key is None else None
        prefix = "idempotency key could not be derived: "
        text: Any = None
        if isinstance(detail, str) and detail.startswith(prefix):
            try:
                text = ast.literal_eval(detail[len(prefix) :])
            except (ValueError, SyntaxError):
                text = None
        raise _NoKey(text if isinstance(text, str) else "the recorded run derived no key")

    def _input_line(self) -> int:
        return self.input_line or self.line

    # ── after the end: reviews and resumes ────────────────────────────────────────

    def _after_end(self, final: bool) -> bool:
        if not self.pending:
            return False
        line, e = self.pending[0]
        kind = e.get("type")
        if kind == "transition" and e.get("trigger") == "review":
            # The decision is the event its action writes next (the request it fired with).
            if len(self.pending) < 2 and not final:
                return False
            after = self.pending[1][1] if len(self.pending) > 1 else {}
            if after.get("type") == "review":
                self._review(line, after)
                return True
        if kind == "review":  # a decision no review transition wrote
            self.pending.popleft()
            self.fail(
                line, f"a review event no review transition wrote (the run is in {self.s.state})"
            )
            self.s.seq += 1
            return True
        if kind == "transition":
            self.transitions -= 1
        ahead = self._ahead(final=True)
        if ahead is not None:
            at, nxt = ahead
            if _resumed(nxt) is not None and self.pending[at][0] != self.restarted:
                if kind == "transition":
                    self.transitions += 1  # (it stays in pending)
                self._restart(self.pending[at][0], nxt)
                return True
        self.pending.popleft()
        self.fail(line, f"{_describe(e)} after the run ended in {self.s.state}")
        return True

    def _review(self, line: int, e: dict[str, Any]) -> None:
        """A reviewer's decision, fired as the table's ``review`` trigger with the
        recorded ``review`` event as its request (``core.loop.review``, what the store
        does): the engine writes the transition and the event, compared as any."""
        request = {k: v for k, v in e.items() if k != "seq"}
        try:
            review(self.s, request)
        except Exception as exc:  # what the trace holds must not crash the check
            self.stop(line, f"the engine raised {type(exc).__name__}: {exc} replaying a review")
            return
        if not self._compare():
            return

    def _restart(self, line: int, nxt: dict[str, Any]) -> None:
        """A later driving resumed the run from its checkpoint (``resumed`` names its
        seq): the replayed state at that checkpoint, restored as ``Runtime.resume``
        restores it; the events written since are the resumed driving's to write."""
        s = self.s
        self.restarted = line
        seq = _resumed(nxt)
        if seq == s.seq:
            snapshot = s.snapshot()
        elif self.snapshot is not None and self.snapshot["body"]["seq"] == seq:
            snapshot = self.snapshot
            for item in reversed(self.since_save):  # to be written again, by the resume
                self.pending.appendleft(item)
                if item[1].get("type") == "transition":
                    self.transitions += 1
        elif not self.saving:
            raise Rewind  # the checkpoint was not kept: replayed again, keeping them
        else:
            self.stop(
                line,
                f"seq {nxt.get('seq')}: the run resumed from its checkpoint at "
                f"seq {_js(seq)}, where the replayed run saved none",
            )
            return
        self.since_save = []
        if not self.finished:
            self.gen.close()
        try:
            restored = RunState.restore(
                snapshot, run_id=s.run_id, config=self.config, messages=s.messages, events=[]
            )
        except Exception as exc:
            self.stop(line, f"the replayed run cannot be restored for its resume: {exc}")
            return
        self.s = restored
        self.matched = 0
        self.finished = self.cancelled = False
        self.fresh = True
        self.gen = steps(restored, resumed=True)
        self.request = next(self.gen)

    # ── what stays outside the engine: one execution per key, the store's writes ──

    def _note(self, line: int, e: dict[str, Any]) -> None:
        kind = e.get("type")
        if kind == "transition":
            self.last_trigger = e.get("trigger") or ""
        elif kind == "decision":
            message = e.get("message")
            self.calls = message.get("tool_calls") if isinstance(message, dict) else None
            for problem in fold_problems(message):  # a streamed reply: its deltas fold to it
                self._payload(line, f"decision: {problem}")
        elif kind == "observation" and e.get("synthetic") is False:
            result = e.get("result")
            tool = e.get("tool")
            facts = self.facts.get(tool) if isinstance(tool, str) else None
            if (
                isinstance(result, dict)
                and result.get("ok") is True
                and isinstance(facts, Mapping)
                and facts.get("idempotent") is True
            ):
                self._write(line, e, result, facts)

    def _write(
        self, line: int, e: dict[str, Any], result: dict[str, Any], facts: Mapping[str, Any]
    ) -> None:
        call_id, tool = str(e.get("call_id")), str(e.get("tool"))
        if result.get("replayed") is True:
            how = "replayed"
        elif result.get("reconciled") is True:
            how = "reconciled"
        else:
            how = "stored" if self.last_trigger == "dispatch" else "executed"
        bound = self._digest(call_id, tool)
        if how == "executed" and facts.get("effect") == "write" and bound is not None:
            first = self.executed.setdefault((tool, bound), line)
            if first != line:
                self.fail(
                    line,
                    f"write {tool!r} executed twice with the same arguments under "
                    f"one idempotency key (first at line {first})",
                )
        if self.writes is not None:
            value = result.get("value") if how in ("replayed", "reconciled") else None
            self.writes.append(Write(line, call_id, tool, how, bound, value))

    def _digest(self, call_id: str, tool: str) -> str | None:
        for call in self.calls if isinstance(self.calls, list) else ():
            if isinstance(call, dict) and call.get("id") == call_id:
                fn = call.get("function") or {}
                text = fn.get("arguments") if isinstance(fn, dict) else None
                if not isinstance(text, str):
                    return None
                try:
                    return digest(tool, parse_arguments(text))
                except (ArgumentsError, RecursionError, TypeError, ValueError):
                    return None
        return None


#: The largest size a reply or result recorded by its size is replayed at (its stand-in is
#: built in memory; a trace's line limit bounds what any run records whole).
_MAX_SIZED = 256 * 1024 * 1024


def _sized(size: Any, shape: dict[str, Any], key: str) -> str | None:
    """A string for ``shape[key]`` that makes ``shape``'s JSON exactly ``size`` bytes
    (how the loop measures a reply or a result), or None if no such string exists."""
    if type(size) is not int or not 0 <= size <= _MAX_SIZED:
        return None
    pad = size - len(dumps_safe(shape)[1])
    return "x" * pad if pad >= 0 else None


#: A message ``bounded_text`` cut: its first ``MAX_ERROR_CHARS`` characters, then how
#: many more there were.
_CUT = re.compile(rf"(.{{{MAX_ERROR_CHARS}}})\.\.\. \(([0-9]{{1,12}}) more characters\)", re.S)


def _unbounded(text: str) -> str | None:
    """A stand-in for the message a recorded ``bounded_text`` was cut from: its kept
    characters and as many more as it says were left out, so the loop cuts it to the
    very text recorded (None: more left out than this check rebuilds)."""
    match = _CUT.fullmatch(text)
    if match is None:
        return text
    more = int(match.group(2))
    if more > _MAX_SIZED:
        return None
    # Not cut by bounded_text if it says fewer than one more: then it is the message.
    return match.group(1) + "x" * more if more > 0 else text


_PLACEHOLDER_KEYS = {
    "image": frozenset({"type", "media_type", "bytes", "part"}),
    "file": frozenset({"type", "media_type", "bytes", "part", "name"}),
}


def _with_media(value: Any, limit: int) -> Any:
    """``value`` with each placeholder of a media part the run handed on (it has a
    ``part``) replaced by an :class:`Image` or :class:`File` of its recorded size and
    type, at most ``limit`` bytes in all (past that they stay placeholders, which the
    engine does not count: the difference is reported). An omitted media's placeholder
    stays as it is: it is what the engine writes for it, and it counts no bytes."""
    left = limit
    buffers: dict[int, bytes] = {}  # one zero buffer per size: stand-ins share it

    def stand_in(v: dict[str, Any]) -> Any:
        nonlocal left
        kind, size = v.get("type"), v.get("bytes")
        keys = _PLACEHOLDER_KEYS.get(kind) if isinstance(kind, str) else None
        if keys is None or not set(v) <= keys:
            return v
        media_type, name = v.get("media_type"), v.get("name")
        if type(v.get("part")) is not int or type(size) is not int or not 0 <= size <= left:
            return v
        if not isinstance(media_type, str) or not (name is None or isinstance(name, str)):
            return v
        data = buffers.setdefault(size, bytes(size))
        try:
            media: Any = (
                Image(data, media_type) if kind == "image" else File(data, media_type, name)
            )
        except ConfigError:
            return v  # not a placeholder the engine writes
        left -= size
        return media

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, dict) and "part" in v:
            return stand_in(v)
        if depth >= _MEDIA_DEPTH:
            return v
        if isinstance(v, dict):
            return {k: walk(x, depth + 1) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        return v

    return walk(value, 0)


def _with_raw_arguments(message: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The reply as the model sent it: the arguments its record shows cleaned (lone
    surrogates as U+FFFD) put back from ``raw_arguments`` (their UTF-8 bytes in hex,
    lone surrogates kept: JSON would join a pair of them into one character)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    out = []
    for call in calls:
        text = raw.get(str(call.get("id"))) if isinstance(call, dict) else None
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(text, str) and isinstance(fn, dict):
            try:
                arguments: Any = bytes.fromhex(text).decode("utf-8", "surrogatepass")
            except ValueError:
                arguments = None
            if isinstance(arguments, str):
                call = {**call, "function": {**fn, "arguments": arguments}}
        out.append(call)
    return {**message, "tool_calls": out}


def _cancelled(e: Mapping[str, Any]) -> Cancelled:
    """The stop a recorded ``cancel`` transition took, with who asked for it, when and
    why as recorded (the engine writes them again, compared as any field)."""
    return Cancelled(by=e.get("by"), at=e.get("at"), note=e.get("note"))


def _resumed(e: dict[str, Any]) -> Any:
    """The checkpoint seq a transition says a resumed driving took over at, or None."""
    inputs = e.get("inputs")
    if type(inputs) is list and inputs and type(inputs[0]) is dict:
        return inputs[0].get("resumed")
    return None


class _NoKey(Exception):
    pass


class Rewind(Exception):
    """A replay without checkpoints met a resume from one: replay it again, saving them
    (``Replay(saving=True)``)."""


def _failure(error: Any) -> BaseException:
    """The model's exception as the loop describes it (``Type: message``)."""
    text = error if isinstance(error, str) else repr(error)
    name, _, message = text.partition(": ")
    failure: type[Exception] = type(name or "Exception", (Exception,), {})
    return failure(message)


def _guard_changes(recorded: Any, mine: Any) -> str:
    """`` (guard X: true, recorded false; ...)``: why the engine took another edge."""
    if not isinstance(recorded, dict) or not isinstance(mine, dict):
        return ""
    changes = [
        f"guard {name} {_js(value)}, recorded {_js(recorded[name]) if name in recorded else 'none'}"
        for name, value in mine.items()
        if recorded.get(name) != value
    ]
    return f" ({'; '.join(changes)})" if changes else ""


def _close(a: Any, b: Any) -> bool:
    """Clock readings equal up to the float error of re-basing a resumed run's clock."""
    numbers = (int, float)
    if not (isinstance(a, numbers) and isinstance(b, numbers)):
        return False
    return abs(a - b) <= 1e-9 * max(1.0, abs(a))


def _request(request: Any) -> str:
    if request is READ_CLOCK:
        return "a clock reading"
    if isinstance(request, AskModel):
        return "a model reply"
    if isinstance(request, CallTool):
        return f"the outcome of call {request.call_id!r} ({request.tool})"
    return type(request).__name__


def _describe(e: Any) -> str:
    if not isinstance(e, dict):
        return f"a JSON {type(e).__name__}"
    kind = e.get("type")
    if kind == "transition":
        return (
            f"transition {e.get('trigger')} {e.get('source')} -> {e.get('dest')}"
            + (f" ({e['reason']})" if e.get("reason") else "")
            + (f" of call {e['call_id']!r}" if e.get("call_id") else "")
        )
    if kind == "observation":
        return f"an observation of call {e.get('call_id')!r}"
    if kind in ("decision", "review", "run_end", "run_start"):
        return f"a {kind} event"
    return f"an event of type {_js(kind)}"


def _js(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _earlier_digest(recorded: Any, mine: Any) -> bool:
    """A rule event's inputs digest in a form earlier development builds wrote (1:
    ``sha256:`` over the inputs as one JSON document; 2: ``v2:sha256:``, ``calls`` as a
    chain of its entries' digests) where this build writes form 3."""
    return (
        isinstance(recorded, str)
        and recorded.startswith(EARLIER_DIGESTS)
        and isinstance(mine, str)
        and mine.startswith(INPUTS_DIGEST)
    )


def _noted(facts: Mapping[str, Any]) -> frozenset[str]:
    """The recorded event types :meth:`Replay._note` reads: decisions, and observations
    only where a tool is idempotent (what it reads of them is for those alone)."""
    idempotent = any(isinstance(f, Mapping) and f.get("idempotent") is True for f in facts.values())
    return frozenset({"decision", "observation"} if idempotent else {"decision"})
