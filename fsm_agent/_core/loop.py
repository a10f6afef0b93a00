"""The run loop: a generator that drives one run through the machine, sans I/O.

:func:`steps` fires the table's triggers on a :class:`~fsm_agent._core.state.RunState` and
yields a request (``core/requests.py``) for every effect it needs — ask the model, call a
tool, sleep, read the clock, begin/commit/abort a write's intent, save a checkpoint, emit
trace events — and is sent the answer. It never touches a model, a tool, a clock, a store
or a file itself, so the sync and async drivers (``runtime/drivers.py``) cannot drift
apart, and a test can drive it by hand (``tests/core/``), like h11's connection objects.

One step per working state::

    deciding    AskModel -> ReadClock? -> fire model_replied | model_failed
    validating  admit the batch (pure) -> fire validate
    executing   [BeginIntent] -> [ConsumeApproval] -> fire dispatch -> [AbortIntent]
                -> CallTool -> [CommitIntent | AbortIntent] -> ReadClock
                -> fire tool_returned
    retry_wait  Sleep -> fire retry
    observing   ReadClock -> fire observe

After each transition a ``SaveCheckpoint`` follows where the run's save mode asks for one
(:func:`_wants_save`). A run with a consumer of its events (a trace sink, an interceptor:
``RunConfig.emit``) gets each event the moment it exists: after the ``run_start`` header
and after every transition (which records every other event) the loop yields
``EmitEvents`` with the new events, before any other request, so no request is performed
before its consumers have every event before it. A run without one yields none.

The driver stops a run by throwing :class:`Cancelled` into the generator at the request
it is performing (Ctrl-C, a cancelled task, a tool raising ``GeneratorExit``...): the loop
takes the ``cancel`` edge, so every open call is answered and ``run_end`` is written, then
yields its last save/emit requests and returns; the driver re-raises what stopped it.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

from fsm_agent._core import events, judging
from fsm_agent._core.actions import ACTIONS, BLOCKING
from fsm_agent._core.budget import bounded_text, metered
from fsm_agent._core.canonical import parse_arguments
from fsm_agent._core.decision import (
    NO_DECISION,
    Decision,
    PreparedCall,
    ToolLike,
    admit_calls,
    parse_decision,
)
from fsm_agent._core.engine import CHOICES, fire
from fsm_agent._core.guards import GUARDS, guard_of
from fsm_agent._core.intents import claim_json, record_json
from fsm_agent._core.jsonsafe import clean_text, dumps_safe, make_safe
from fsm_agent._core.requests import (
    READ_CLOCK,
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
    Request,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
)
from fsm_agent._core.select import select
from fsm_agent._core.state import RunState
from fsm_agent._core.table import CALL_STEP, ENDS, STARTS_BATCH, TERMINAL_STATES, Transition

#: Review actions that approve the call (``edit``: with the reviewer's arguments, which
#: the call then carries, so the digest binds the approval to them).
_APPROVING = frozenset({"approve", "edit"})

__all__ = ["SCHEMA", "Cancelled", "Steps", "review", "settled", "start", "steps"]

#: Trace schema identifier written in every ``run_start`` header.
SCHEMA = "fsm-agent.trace/3"

Steps = Generator[Request, Any, None]

_TERMINAL = frozenset(TERMINAL_STATES)


class Cancelled(BaseException):
    """Thrown into :func:`steps` by a driver to stop the run (never raised out of it).

    A cancel from outside the run (the review server, ``fsm-agent runs cancel``) names
    who asked (``by``), when (``at``, ISO-8601 UTC, read by the caller: the core reads no
    clock) and why (``note``): the ``cancel`` transition records them, as a ``review``
    event records its reviewer, and ``check`` throws them in again where it replays it."""

    def __init__(
        self, *, by: str | None = None, at: str | None = None, note: str | None = None
    ) -> None:
        super().__init__()
        self.by, self.at, self.note = by, at, note

    def fields(self) -> dict[str, Any]:
        """What the ``cancel`` transition records of this request (absent, not null,
        when not given)."""
        given = {"by": self.by, "at": self.at, "note": self.note}
        return {name: value for name, value in given.items() if value is not None}


# ── starting and resuming ─────────────────────────────────────────────────────────


def start(s: RunState) -> None:
    """Write the ``run_start`` header of a new run (``seq`` 0) into ``s.events``."""
    header = s.config.header_fields()
    if s.context:  # the trusted facts the rules read: check re-judges with them
        header["context"] = s.context
    _record(s, events.run_start(s.run_id, SCHEMA, header, make_safe(s.messages)))
    if s.config.redact is not None:
        # Set after the hook, so no hook can hide that it ran: ``check`` compares the
        # payloads of a redacted trace loosely (notes), every other trace strictly.
        s.events[-1] = {**s.events[-1], "redacted": True}


def _record(s: RunState, event: dict[str, Any]) -> None:
    """Append ``event`` to the trace, through the caller's redaction hook if any. A hook
    that fails keeps only the event's type and seq: a secret is never recorded because
    redaction broke."""
    redact = s.config.redact
    if redact is not None:
        try:
            event = redact(event)
        except Exception as exc:
            event = events.redaction_failed(event, _describe_error(exc))
    s.events.append(event)


def settled(s: RunState) -> bool:
    """A run paused for review whose every blocking placeholder has a reviewer's decision."""
    if s.state != "review_required" or not s.reviews:
        return False
    return all(
        call_id in s.reviews for call_id, (_, error) in s.placeholders.items() if error in BLOCKING
    )


def review(s: RunState, request: dict[str, Any]) -> bool:
    """Fire the ``review`` trigger of a paused run with a reviewer's decision: whether the
    table recorded it (``review_fits``). ``request`` is the ``review`` event to write:
    ``action``, ``call_id``, ``tool``, the decision's ``digest``/``reason``/``result``,
    ``reviewer``, ``at`` (ISO-8601 UTC, from the caller: the core reads no clock) and
    ``note``. Pure: the events it adds are in ``s.events``, for the caller to store."""
    s.review_request = request
    try:
        edge = fire(s, "review")
        _after(s, edge)
    finally:
        s.review_request = None
    return edge.action == "record_review"


def steps(s: RunState, *, resumed: bool = False) -> Steps:
    """Drive the run to a terminal state, yielding every effect as a request.

    A new run must have had :func:`start`; a ``resumed`` one comes from
    :meth:`RunState.restore` and first takes its ``resume`` edge if one applies.
    """
    try:
        yield from _begin(s, resumed)
        if s.config.rules is not None and _first_model_call(s):
            yield from _judge_first_model_call(s)
        while s.state not in _TERMINAL:
            state = s.state
            if state == "deciding":
                yield from _decide(s)
            elif state == "executing":
                yield from _execute(s)
            elif state == "retry_wait":
                yield from _wait(s)
            elif (
                _validate(s)
                if state == "validating"
                else _fire(s, "observe")
                if s.config.rules is None
                else _observe(s)  # a run with rules: the next model call is judged first
            ):
                yield from _flush(s)  # validating, observing: pure steps
    except GeneratorExit:
        raise
    except BaseException as exc:
        # Cancelled (the driver stopped us), or raised right here: Ctrl-C can land in
        # any line, and a registrar's function (an idempotency key, a redaction hook)
        # runs inside the loop. Either way the run ends with every call answered.
        yield from _stop(s, exc.fields() if isinstance(exc, Cancelled) else {})
        if not isinstance(exc, Cancelled):
            raise exc  # the very exception that stopped the run, as it was
        return
    if s.config.emit and s.emitted < len(s.events):
        yield _emit(s)


def _begin(s: RunState, resumed: bool) -> Steps:
    if s.config.emit and s.emitted < len(s.events):
        yield _emit(s)  # the header (a restored run's events were emitted when recorded)
    now = yield READ_CLOCK
    s.started += now  # a new run starts at 0; a restored one stores -elapsed
    s.now = now
    if resumed:
        # Where this driving took over (the checkpoint's seq): check restores it there.
        s.inputs.append({"resumed": s.seq})
        yield from _resume(s)
    elif s.config.save != "never":
        yield _save(s, header=True)


def _first_model_call(s: RunState) -> bool:
    """The model is about to be asked for the first time (a new run, or one resumed
    from its header: nothing since was saved) and rules judge that call."""
    rules = s.config.rules
    return (
        s.state == "deciding"
        and s.counters.model_calls == 0
        and rules is not None
        and rules.judges("before_model")
    )


def _judge_first_model_call(s: RunState) -> Steps:
    """Judge the ``before_model`` rules and take ``begin``: its rule rows may stop the
    run before the model is ever asked, as ``observe``'s do before a later call."""
    rules = s.config.rules
    assert rules is not None
    judging.before_model(s, rules)
    if _fire(s, "begin"):
        yield from _flush(s)


def _stop(s: RunState, asked: dict[str, Any]) -> Steps:
    """Take the ``cancel`` edge (unless the run already ended) and emit what is left;
    ``asked``: who asked for it, when and why (``Cancelled.fields``)."""
    if s.config.emit and s.emitted < len(s.events):
        yield _emit(s)  # an edge that raised half-way through (its events so far)
    if s.state not in _TERMINAL:
        s.now = yield READ_CLOCK
        s.cancel_request = asked
        try:
            wants = _fire(s, "cancel")
        finally:
            s.cancel_request = {}
        if s.config.rules is not None and s.reason == "outcome_unknown":
            judging.record_execution(s, returned=False)  # cancelled in flight: it may have run
        if wants:
            yield from _flush(s)
    if s.config.emit and s.emitted < len(s.events):
        yield _emit(s)


def _resume(s: RunState) -> Steps:
    """Take the ``resume`` edge where one applies: a write whose attempt was in flight
    when the process died, or a paused run whose reviews are all in."""
    if s.decision.calls and s.state != "validating":
        _admit(s)  # the rest of the batch, with today's registry
    call = s.call
    in_flight = s.state == "executing" and s.taken.action == "start_attempt"
    if s.state == "executing" and call.index >= 0 and call.idempotency_key is not None:
        # A keyed write's attempt starts without a checkpoint of its own: its pending
        # intent, begun with the checkpoint before dispatch, says it may have started.
        record = yield LoadIntent(call.name, call.idempotency_key)
        s.inputs.append({"load_intent": record_json(record)})
        call.record = record
        ours = record is not None and record.owner == (s.run_id, call.id)
        # If the intent is gone (aborted after a rejection) it must be begun again.
        call.claimed = ours and record is not None and record.status == "pending"
        if ours and not in_flight:
            # Begun, so its attempt was starting: count it as start_attempt would have
            # (the transition itself died with the process that took it).
            ACTIONS["start_attempt"](s, [])
            in_flight = s.attempt_resumed = True
    if in_flight:
        wants = _fire(s, "resume")
        if s.config.rules is not None and s.taken.action in ("stop", "answer_stored"):
            judging.record_execution(s, returned=False)  # it ran before the process died
        if wants:
            yield from _flush(s)
    elif settled(s):
        yield from _commit_reconciled(s)
        if _fire(s, "resume"):
            yield from _flush(s)


def _commit_reconciled(s: RunState) -> Steps:
    """A reconciled write's observed result becomes its idempotency record, so the same
    request later replays it instead of running again. A pending intent with the same
    arguments (this call's, or another run's that never reported) is committed as it is:
    the reviewer found that write happened."""
    for call in s.decision.calls:
        review = s.reviews.get(call.id)
        if not review or review["action"] != "reconcile" or call.idempotency_key is None:
            continue
        key, result = call.idempotency_key, review.get("result")
        found = yield LoadIntent(call.name, key)
        s.inputs.append({"load_intent": record_json(found)})
        if found is None:
            claim: IntentClaim = yield BeginIntent(_intent(s, call), take_over=False)
            s.inputs.append({"begin_intent": claim_json(claim)})
            if claim.owned:
                yield CommitIntent(call.name, key, (s.run_id, call.id), result)
        elif found.status == "pending" and found.args_digest == call.args_digest:
            yield CommitIntent(call.name, key, found.owner, result)


# ── one step per working state ────────────────────────────────────────────────────


def _decide(s: RunState) -> Steps:
    reply = yield AskModel(list(s.messages), s.config.tool_specs)
    s.now = yield READ_CLOCK
    s.counters.model_calls += 1
    if isinstance(reply, BaseException):
        s.model_error = _describe_error(reply)
        s.seq += 1
        _record(s, events.decision_failed(s.seq, s.model_error))
        if _fire(s, "model_failed"):
            yield from _flush(s)
        return
    text, data, changed = dumps_safe(reply)
    s.reply_bytes = len(data)
    if s.reply_bytes > s.config.budget.max_reply_bytes:
        yield from _oversized_reply(s, reply)
        return
    d = s.decision = parse_decision(reply)
    ids = s.call_ids
    if ids is not None:  # (the runtime's repeated-calls warning reads this)
        for call in d.calls:
            if call.id in ids:
                s.call_id_repeated = True
            ids.add(call.id)
    s.seq += 1
    # ``malformed``: why it was refused. The recorded copy is JSON-safe, so a reply
    # refused for a non-JSON value may read as well-formed (the checker needs the verdict).
    # A well-formed reply is recorded as its normalised message (fresh dicts already,
    # and what the history holds).
    recorded = d.message if d.malformed is None else _refused_reply(reply)
    event = events.decision(s.seq, recorded, d.malformed)
    # (An ASCII reply, as most are, holds no lone surrogate: nothing to look for.)
    if changed or not text.isascii():
        _note_lossy_arguments(d, event)
    if s.config.redact is None:
        s.events.append(event)  # what _record does without a hook, minus a call
    else:
        _record(s, event)
    if isinstance(reply, dict):
        usage = reply.get("usage")
        if usage is None:  # what metered(None) reads: neither counted (most scripted replies)
            s.tokens_unknown = s.cost_unknown = True
        else:
            _count_usage(s, usage)
    s.batch_appended = False
    s.answered = set()  # ids need only be unique within a batch
    if _fire(s, "model_replied"):
        yield from _flush(s)


def _note_lossy_arguments(d: Decision, event: dict[str, Any]) -> None:
    """Arguments with lone surrogates (shown as U+FFFD) go on the decision event as their
    UTF-8 bytes, in hex: what the checker needs to see them refused."""
    lossy = {
        c.id: c.raw_arguments.encode("utf-8", "surrogatepass").hex()
        for c in d.calls
        if not c.raw_arguments.isascii() and clean_text(c.raw_arguments) is not c.raw_arguments
    }
    if lossy:
        event["raw_arguments"] = lossy


#: The fields of a reply's ``usage`` that ``core/budget.py``'s ``metered`` reads.
_USAGE_KEYS = (
    "input_tokens", "prompt_tokens", "output_tokens", "completion_tokens", "total_tokens",
    "cost",
)  # fmt: skip


def _oversized_reply(s: RunState, reply: Any) -> Steps:
    """A reply over ``max_reply_bytes`` is recorded by its size (and usage, which the
    counters still take), never whole: the trace keeps lines ``check`` can read, and the
    run stops ``budget_exhausted/reply_size`` with nothing of it parsed or run."""
    s.decision = NO_DECISION
    s.seq += 1
    usage = reply.get("usage") if isinstance(reply, dict) else None
    if isinstance(usage, dict):  # only what the counters read: the rest may be the bulk
        usage = {k: make_safe(usage[k]) for k in _USAGE_KEYS if k in usage}
    _record(s, events.decision_oversized(s.seq, s.reply_bytes, usage))
    _count_usage(s, usage)
    s.batch_appended = False
    s.answered = set()
    if _fire(s, "model_replied"):
        yield from _flush(s)


def _validate(s: RunState) -> bool:
    d = s.decision
    if d.malformed is None and d.missing_id is None:
        _admit(s)
        if not d.calls and s.config.rules is not None:
            judging.answer(s, s.config.rules)
    return _fire(s, "validate")


def _attempt_arguments(attempt: int, arguments: dict[str, Any], raw: str) -> dict[str, Any]:
    """An attempt's own copy of a call's arguments: a tool may mutate what it is given.
    A flat object is copied; one holding objects or lists, and a retry's, is read afresh
    from the exact text that was validated and digested. So what the call keeps (the
    rules' ``calls``, a checkpoint) is what ``check`` replays, never what an attempt left
    behind."""
    if attempt == 1:
        for value in arguments.values():
            kind = type(value)
            if kind is dict or kind is list:
                return parse_arguments(raw)
        return dict(arguments)
    return parse_arguments(raw)


#: No rule decided (``RunState.ruled``).
_NONE_RULED: frozenset[str] = frozenset()


def _observe(s: RunState) -> bool:
    rules = s.config.rules
    assert rules is not None
    if "before_model" in rules.phases:
        judging.before_model(s, rules)
    else:  # (its reset, without the call: once per round)
        s.ruled = _NONE_RULED
    return _fire(s, "observe")


def _tool_returned(s: RunState) -> bool:
    """Fire ``tool_returned``; a run with rules judges the result first and, once the
    call is answered (not retried), adds it to the executed calls rules read."""
    rules = s.config.rules
    assert rules is not None
    if "after_tool" in rules.phases:
        judging.after_tool(s, rules)
    else:  # (its reset, without the call: once per call)
        s.ruled, s.ahead = _NONE_RULED, None
    wants = _fire(s, "tool_returned")
    if (
        rules.reads_calls  # (else nothing is kept: record_execution's first test)
        and s.taken.action != "schedule_retry"
        and s.outcome.kind != "not_started"
    ):
        judging.record_execution(s)  # answered, or stopped with an unknown outcome: it ran
    return wants


def _wait(s: RunState) -> Steps:
    yield Sleep(s.config.retry.backoff(s.attempt))
    s.now = yield READ_CLOCK
    if _fire(s, "retry"):
        yield from _flush(s)


def _execute(s: RunState) -> Steps:
    call = s.call
    fresh = False
    if call.idempotency_key is not None and call.refusal is None:
        if call.claimed:  # ours already (a retry, a resumed dispatch)
            call.record = None
        else:
            # The checkpoint before dispatch rides in the intent's transaction: a resume
            # that finds this pending intent knows the write may have started (D1, R11).
            pending = _save(s) if s.config.save != "never" else None
            claim: IntentClaim = yield BeginIntent(
                _intent(s, call), take_over=call.dedup, save=pending
            )
            s.inputs.append({"begin_intent": claim_json(claim)})
            call.claimed = claim.owned
            fresh = claim.owned and claim.found is None
            call.record = None if claim.owned else claim.found
    if call.approval is not None and call.approval != s.approvals.get(call.id):
        yield from _consume(s, call)
    # (``s.now`` is the reading after the last I/O: only pure steps came since.)
    if _fire(s, "dispatch"):
        yield from _flush(s)
    edge = s.taken
    if edge.action != "start_attempt":
        if fresh and call.idempotency_key is not None:  # begun for nothing: give it back
            yield AbortIntent(call.name, call.idempotency_key, (s.run_id, call.id))
            call.claimed = False
        return
    tool = call.tool
    assert tool is not None and call.arguments is not None  # admitted calls have both
    # In flight from the call until tool_returned is taken: a cancel in between (even
    # while its result is being stored) may not say the write did not happen.
    s.in_flight = True
    arguments = _attempt_arguments(s.attempt, call.arguments, call.raw_arguments)
    timeout = tool.timeout_s if s.config.budget.max_wall_clock_s is None else _timeout(s, tool)
    outcome: ToolOutcome = yield CallTool(call.id, call.name, arguments, timeout)
    s.outcome = outcome
    key = call.idempotency_key
    if key is not None:
        # The attempt's checkpoint goes in with its result (or with the intent's end):
        # after a crash, a committed record and an attempt in flight are read together.
        # No checkpoint needed here: after a crash, the record tells a resume what happened
        # (committed: the result answers the call; gone: nothing ran; pending: unknown).
        owner = (s.run_id, call.id)
        if outcome.kind == "ok":
            yield CommitIntent(call.name, key, owner, make_safe(outcome.value))
        elif outcome.kind in ("rejected", "not_started"):  # definitely nothing happened
            yield AbortIntent(call.name, key, owner)
            call.claimed = False
    s.now = yield READ_CLOCK
    s.in_flight = False
    if _fire(s, "tool_returned") if s.config.rules is None else _tool_returned(s):
        yield from _flush(s)


def _consume(s: RunState, call: PreparedCall) -> Steps:
    """Spend a use of the call's limited approval, only if the call is about to start:
    a use is spent on a call that runs, never on one a budget, a deadline or an
    idempotency record stops (their guards come first in the table). The store's answer
    is recorded on the ``dispatch`` transition; a refusal takes ``approval_refused``."""
    approval = call.approval
    assert approval is not None
    limit = s.config.approvals.limit(approval)
    if limit is None:  # unlimited, or a reviewer's approval of this very call
        return
    edge = select(s.state, "dispatch", lambda name: guard_of(name)(s), s.config.machine)
    if edge is None or edge.action != "start_attempt":
        return
    granted = yield ConsumeApproval(approval, limit, s.run_id, call.id)
    if granted is True:
        s.approvals[call.id] = approval
        s.approval_use = "granted"
    else:
        call.approval, call.needs_approval = None, True
        s.approval_use = "refused"


# ── firing, saving, emitting ──────────────────────────────────────────────────────


def _fire(s: RunState, trigger: str) -> bool:
    """Take the edge of ``trigger``, run its action, record it; whether requests follow
    it (:func:`_flush`: its events to emit, a checkpoint to save). A plain function, not
    a generator: this is the hot path, five times per tool round, and most edges of a
    run without consumers are followed by nothing.

    :func:`~fsm_agent._core.engine.fire` inlined (one call less per edge): the compiled
    walk of the run's state is looked up directly; a machine not fired yet, or a state
    ``trigger`` has no edge from, goes through ``fire`` itself."""
    config = s.config
    try:
        choice = CHOICES[config.machine.hash][trigger][s.state]
    except KeyError:
        edge = fire(s, trigger)
    else:
        log: dict[str, bool] = {}
        s.guard_log = log
        taken = choice(s, GUARDS, log)
        assert taken is not None, "every group ends with an unguarded edge"
        edge = s.taken = taken
        s.state = edge.dest
    _after(s, edge)
    if config.emit:
        return True
    # Only edges where _wants_save may say yes ask it: none at no checkpoint point, nor a
    # read's call steps, nor a batch's start outside ``replies`` mode (most of a round's).
    point = edge.save_point
    if not point or config.save == "never":
        return False
    if point == CALL_STEP:
        return s.call.effect == "write" and _wants_save(s, edge)
    return (point != STARTS_BATCH or config.save == "replies") and _wants_save(s, edge)


def _flush(s: RunState) -> Steps:
    """What follows the edge just taken: its events to their consumers, then the
    checkpoint, if this run saves one there. The checkpoint is built only after the
    emit was performed: a driver that stops the run at the emit loses no saved event."""
    config = s.config
    if config.emit and s.emitted < len(s.events):
        yield _emit(s)
    if config.save != "never" and _wants_save(s, s.taken):
        yield _save(s, behind=_behind(s, s.taken))


def _wants_save(s: RunState, edge: Transition) -> bool:
    """Whether to save a checkpoint after ``edge``: where losing the transitions
    since the last save would matter, before anything outside the machine happens that
    it would hide (D1).

    * at every end and on resume;
    * in ``replies`` mode when a batch is accepted (its reply cost tokens, and a resume
      must see the same call ids to find their intents) — unless the batch holds a
      write: its intent's transaction, or its attempt's checkpoint, carries it;
    * when a write's attempt starts and when it returned, unless an idempotency record
      covers it: a keyed write's intent (begun with the checkpoint before dispatch) marks
      it in flight, and its committed record holds its result.

    Everything in between is pure or a read: a crash there resumes from the last save
    and takes the same edges again, re-running at most a read or a model call.
    """
    # (Read off the edge, not its index: the run's machine may be any table.)
    point = edge.save_point
    if not point:
        return False
    if point == ENDS:
        return True
    if point == CALL_STEP:
        call = s.call
        return call.effect == "write" and call.idempotency_key is None
    if s.config.save == "replies":  # STARTS_BATCH
        # Nothing outside the machine depends on the reply until a write: a read may
        # run again after a crash. So the reply's checkpoint rides with the first write
        # of the batch (its intent, or its attempt's checkpoint), one commit instead of
        # two; a batch without a write saves here (issue 25: the fewest waits a round).
        return not any(c.effect == "write" and c.refusal is None for c in s.decision.calls)
    return False


def _after(s: RunState, edge: Transition) -> None:
    """Run the edge's action and record the transition (and its payloads, and
    ``run_end`` at a terminal state) in ``s.events``."""
    # The transition event's required fields (``events.Transitioned``), in its order; the
    # optional ones it has follow, then ``seq`` (its payloads' seqs follow it). Built here,
    # not by a helper: this is the one place it is written, five times per tool round.
    event: dict[str, Any] = {"type": "transition", "trigger": edge.trigger, "source": edge.source,
             "dest": edge.dest, "guards": s.guard_log, "t": s.now - s.started}  # fmt: skip
    if s.inputs:  # what the world answered since the last transition (replayed by check)
        event["inputs"], s.inputs = s.inputs, []
    payloads: list[dict[str, Any]] = []
    action = edge.action
    if action is not None:
        ACTIONS[action](s, payloads)
    call = s.call
    if call.index >= 0:
        event["call_id"] = call.id
        event["tool"] = call.name
        event["attempt"] = s.attempt
        if call.approval is not None and (
            action == "start_attempt" or (edge.trigger == "resume" and s.attempt_resumed)
        ):
            event["approval"] = call.approval
        if s.approval_use is not None:  # the store's answer to ConsumeApproval, replayable
            event["approval_use"], s.approval_use = s.approval_use, None
        if edge.trigger == "tool_returned":
            # What the tool did (the call_* and is_retryable guards read it), and why it
            # failed (and so why a retry follows): the checker recomputes from these.
            outcome = s.outcome
            event["outcome"] = outcome.kind
            if outcome.error:
                event["error"] = outcome.error
    if edge.reason is not None:
        event["reason"], event["detail"] = edge.reason, s.detail
    if s.config.redact is not None or s.cancel_request:
        _record_all(s, edge, event, payloads)
    else:
        # Without a redaction hook an event is appended as it is: a list method, not a
        # call of _record per event (five to seven per tool round).
        seq = event["seq"] = s.seq + 1
        append = s.events.append
        append(event)
        for payload in payloads:
            seq = payload["seq"] = seq + 1
            append(payload)
        s.seq = seq
    if edge.ends_run:  # (not a review: the run stays paused)
        s.seq += 1
        _record(s, events.run_end(s.seq, s.status, s.reason, s.detail, s.answer,
                                  s.counters.as_dict()))  # fmt: skip


def _record_all(
    s: RunState, edge: Transition, event: dict[str, Any], payloads: list[dict[str, Any]]
) -> None:
    """Record a transition and its payloads through the redaction hook (if any), the
    cancel request's fields on the ``cancel`` edge it fired."""
    if edge.trigger == "cancel" and s.cancel_request:
        event.update(s.cancel_request)
    seq = s.seq = event["seq"] = s.seq + 1
    _record(s, event)
    for payload in payloads:
        seq = s.seq = payload["seq"] = seq + 1
        _record(s, payload)


def _behind(s: RunState, edge: Transition) -> bool:
    """Whether the checkpoint after ``edge`` may ride with the run's next statement:
    a batch of reads accepted (a read may run again, the model be asked again), a
    keyless write returned (its attempt's checkpoint says it may have happened: a crash
    before this one lands resumes to ``outcome_unknown``, never to a second run), a
    resume that goes on (a crash before anything else lands resumes from the same
    checkpoint, to the same edge: nothing ran since)."""
    if edge.dest in _TERMINAL:
        return False
    return edge.action == "start_batch" or edge.trigger in ("tool_returned", "resume")


def _save(s: RunState, *, header: bool = False, behind: bool = False) -> SaveCheckpoint:
    messages = s.messages
    rows = list(enumerate(messages[s.saved_messages :], s.saved_messages))
    rows += [(i, messages[i]) for i in s.rewritten if i < s.saved_messages]
    s.rewritten.clear()
    s.saved_messages = len(messages)
    events = s.events[s.saved_events :]
    s.saved_events = len(s.events)
    head = s.config.header_fields() if header else None
    return SaveCheckpoint(events, s.snapshot(), rows, head, behind, s.state in _TERMINAL)


def _emit(s: RunState) -> EmitEvents:
    """The events written since the last emit (for a run with a trace sink)."""
    events = s.events[s.emitted :]
    s.emitted = len(s.events)
    return EmitEvents(events)


# ── helpers ───────────────────────────────────────────────────────────────────────


def _admit(s: RunState) -> None:
    cfg = s.config
    current = s.call if s.call.index >= 0 else None
    facts = (
        None
        if current is None
        else (current.effect, current.dedup, current.idempotency_key, current.args_digest)
    )

    def approval(call_id: str, args_digest: str) -> str | None:
        """The approval that covers this call: one it holds already (a use it spent, a
        reviewer's approval it was admitted with), a reviewer's approval of this very
        call, or a configured one. Nothing outside the run changes: a limited approval's
        use is spent only when the call is about to start (:func:`_consume`)."""
        got = s.approvals.get(call_id)
        if got is None:
            review = s.reviews.get(call_id) or {}
            if review.get("action") in _APPROVING and review.get("digest") == args_digest:
                # Kept with the run: the reviews go once applied, and a later resume
                # (this driver died) must still find the call approved.
                got = s.approvals[call_id] = f"review:{call_id}"
            else:
                got = cfg.approvals.find(args_digest)
        return got

    admit_calls(s.decision, cfg.tools, cfg.allowed, approval)
    if cfg.rules is not None and s.decision.duplicate_id is None:
        judging.before_tool(s, cfg.rules)
    for call in s.decision.calls:  # the registrar's keys: code, so recorded for check
        if call.args_digest and call.tool is not None and call.tool.idempotency_key is not None:
            key = call.idempotency_key
            s.inputs.append({"idempotency_key": key} if key is not None else
                            {"idempotency_key": None, "detail": call.refusal_detail})  # fmt: skip
    if current is not None and facts is not None and facts[0] is not None:
        # A restored call keeps the facts it was checkpointed with (R11).
        current.effect, current.dedup, current.idempotency_key, current.args_digest = facts


def _intent(s: RunState, call: Any) -> IdempotencyRecord:
    return IdempotencyRecord(
        call.name,
        call.idempotency_key,
        call.args_digest,
        "pending",
        s.run_id,
        call.id,
        effect=call.effect or "write",
        dedup=call.dedup,
    )


def _timeout(s: RunState, tool: ToolLike) -> float | None:
    """The call's timeout within a wall-clock budget: what is left, or less."""
    tool_timeout = tool.timeout_s
    limit = s.config.budget.max_wall_clock_s
    if limit is None:
        return tool_timeout
    left = max(limit - (s.now - s.started), 0.0)
    return left if tool_timeout is None else min(tool_timeout, left)


def _describe_error(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises
        text = f"{type(exc).__name__}: <unprintable>"
    return clean_text(bounded_text(text))


def _refused_reply(reply: Any) -> Any:
    """A refused reply as the trace records it: exactly as it came, JSON-safe (R12) and a
    copy, so a model that reuses or mutates the dict it returned cannot change what was
    recorded."""
    text, _, _ = dumps_safe(reply)
    return json.loads(text)


def _count_usage(s: RunState, usage: Any) -> None:
    """Add a reply's usage; an unmetered reply marks the run ``tokens_unknown`` or
    ``cost_unknown`` (see :func:`~fsm_agent._core.budget.metered`)."""
    if usage is None:  # what metered(None) reads: neither counted (most scripted replies)
        s.tokens_unknown = s.cost_unknown = True
        return
    m, c = metered(usage), s.counters
    if m.tokens is None:
        s.tokens_unknown = True
    else:
        c.input_tokens += m.input_tokens
        c.output_tokens += m.output_tokens
        c.tokens += m.tokens
    if m.cost is None:
        s.cost_unknown = True
    else:
        c.cost += m.cost
