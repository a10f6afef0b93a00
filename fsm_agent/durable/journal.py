"""Durable runs: checkpoints and crash-safe resume (SPEC §5).

The trace is the log. A :class:`Journal` saves a run to its store: after a transition,
the events the run emitted since the last save, together with a checkpoint (the small
context the loop needs to go on, plus the history rows added or replaced), in one store
transaction. It does so after the transitions that follow or precede something outside
the machine (a model reply, a write's attempt with its idempotency intent, the write's
result) and at every end; the pure transitions between them, and reads, ride with the
next save (see :meth:`Journal.checkpoint`). A process killed at any point therefore
leaves the store at the state after some whole transition, the events stored are
exactly the trace up to it, and resuming from there repeats nothing but model calls and
reads.

Resuming (:func:`prepare_resume`) rebuilds a :class:`~fsm_agent.run.Run` from the last
checkpoint and hands it back to the runtime's usual drivers. Two cases need a decision
before the loop goes on, and both are edges of the table (trigger ``resume``):

* the last saved transition started a write's attempt (the process died while it ran):
  a write whose outcome nothing records stops in ``review_required/outcome_unknown`` and
  is never run again; one whose idempotency record holds its result is answered with
  it; one whose downstream deduplicates is dispatched again;
* the run is paused for review and reviewers have settled every blocking call
  (:func:`fsm_agent.review.record_review`): the placeholders of the paused batch are
  replaced, skipped calls run afresh, and the loop continues.

Only one process drives a run at a time: running, resuming and reviewing claim the run
in the store, and a live claim held elsewhere raises :class:`~fsm_agent.store.RunBusy`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from fsm_agent.core.budget import Budget, RetryPolicy
from fsm_agent.core.decision import admit_calls, parse_decision
from fsm_agent.core.loop import _EMPTY, Run
from fsm_agent.core.requests import Request, ToolOutcome
from fsm_agent.core.table import MACHINE_HASH, TERMINAL_STATES, TRANSITIONS
from fsm_agent.durable.review import settled
from fsm_agent.durable.store import (
    Checkpoint,
    IdempotencyRecord,
    Store,
    StoredRun,
    StoreError,
    owner_token,
)
from fsm_agent.trace.io import TraceSink

if TYPE_CHECKING:
    from fsm_agent.runtime.runtime import Runtime

__all__ = ["Journal", "attach", "prepare_resume", "supports_runs"]

_TERMINAL = frozenset(TERMINAL_STATES)


def supports_runs(store: Any) -> bool:
    """Whether ``store`` keeps runs (stores may keep idempotency records only)."""
    return getattr(store, "keeps_runs", True) and all(
        callable(getattr(store, name, None))
        for name in ("create_run", "save", "load_run", "claim", "release")
    )


# ── checkpoints ───────────────────────────────────────────────────────────────────


def snapshot(run: Run) -> dict[str, Any]:
    """The context a run needs to continue (messages and events are stored apart)."""
    t = run.taken
    return {
        "state": run.state,
        "seq": run.seq,
        "status": run.status,
        "reason": run.reason,
        "detail": run.detail,
        "answer": run.answer,
        "model_error": run.model_error,
        "counters": run.counters.as_dict(),
        "elapsed": run.now - run.started,
        "decision": None if run.decision is _EMPTY else run.decision.message,
        "batch_appended": run.batch_appended,
        "index": run.index,
        "call_index": run.call.index,
        "attempt": run.attempt,
        "outcome": [run.outcome.kind, run.outcome.error],
        "cost_unknown": run.cost_unknown,
        "answered": list(run.answered),
        "placeholders": run.placeholders,
        "taken": [t.trigger, t.source, t.dest, t.action],
        "reviews": run.reviews,
    }


class Journal:
    """Saves a run to its store: the events the run emitted since the last save (read
    from ``run.events``, after any redaction) with the checkpoint after a transition, in
    one transaction. The runtime closes it like a trace sink, which releases the claim."""

    def __init__(
        self, store: Store, run: Run, owner: str, saved_messages: int, saved_events: int
    ) -> None:
        self.store, self.owner, self.run_id = store, owner, run.run_id
        # A store that does not outlive the process skips the commits after model
        # replies: it only has to protect writes and what a reviewer acts on.
        every = bool(getattr(store, "checkpoint_every_transition", True))
        self.always = _ALWAYS_SAVED if every else _ALWAYS_SAVED_IN_PROCESS
        self.replies = every
        self.saved, self.saved_events = saved_messages, saved_events
        self.inner: TraceSink | None = None  # the caller's own sink, closed with this

    def write(self, event: dict[str, Any]) -> None:
        """Events reach the store through ``run.events``; nothing to do per event."""

    def close(self) -> None:
        try:
            if self.inner is not None:
                self.inner.close()
        finally:
            self.store.release(self.run_id, self.owner)

    def checkpoint(self, run: Run) -> None:
        """Save the transition just taken (``Run.fire`` calls this after each one).

        A transaction is committed only where losing the transitions since the last one
        would matter, before anything outside the machine happens that it would hide:

        * after a model reply (it cost tokens), unless no I/O comes before the next
          commit anyway (a final answer, or a batch that starts with a write);
        * when a write's attempt starts (with its idempotency intent) and when it
          returned, unless its committed idempotency record already holds the result;
        * at every end, and on resume.

        Everything in between is pure or a read: a crash there resumes from the last
        commit and takes the same edges again, re-running at most a read or a model call.
        """
        edge = id(run.taken)
        if edge in self.always:
            pass
        elif edge in _SAVED_FOR_WRITES:
            call = run.call
            if call.effect != "write" or (
                run.taken.trigger == "tool_returned"
                and run.outcome.kind == "ok"
                and call.idempotency_key is not None
            ):
                return  # a read, or a write whose record holds its result (steps() wrote it)
        elif edge in _SAVED_AFTER_REPLIES and self.replies:
            calls = run.decision.calls
            first = run.registry.get(calls[0].name) if calls else None
            if not calls or (first is not None and first.effect == "write"):
                return  # the next commit comes before any I/O
        else:
            return
        checkpoint = Checkpoint(snapshot(run), self._messages(run))
        call = run.call
        if run.taken.action == "start_attempt" and call.idempotency_key is not None:
            # The write's intent goes in with the checkpoint that starts it: one commit.
            checkpoint.intents.append(
                IdempotencyRecord(
                    call.name,
                    call.idempotency_key,
                    call.args_digest,
                    "pending",
                    run.run_id,
                    call.id,
                )
            )
        events = run.events
        self.store.save(run.run_id, self.owner, events[self.saved_events :], checkpoint)
        self.saved_events = len(events)

    def _messages(self, run: Run) -> list[tuple[int, dict[str, Any]]]:
        messages, saved = run.messages, self.saved
        rows = [(i, messages[i]) for i in range(saved, len(messages))]
        rows += [(i, messages[i]) for i in run.rewritten if i < saved]
        run.rewritten.clear()
        self.saved = len(messages)
        return rows


#: Edges after which ``Journal.checkpoint`` always commits (a store that outlives the
#: process, one that does not), may commit after a model reply, or may commit when the
#: current call is a write (by identity: this is checked on every transition).
_ALWAYS_SAVED = frozenset(
    id(t) for t in TRANSITIONS if t.trigger in ("model_failed", "resume") or t.dest in _TERMINAL
)
_ALWAYS_SAVED_IN_PROCESS = frozenset(
    id(t) for t in TRANSITIONS if t.trigger == "resume" or t.dest in _TERMINAL
)
_SAVED_AFTER_REPLIES = frozenset(id(t) for t in TRANSITIONS if t.trigger == "model_replied")
_SAVED_FOR_WRITES = frozenset(
    id(t) for t in TRANSITIONS if t.action == "start_attempt" or t.trigger == "tool_returned"
)


def attach(runtime: Runtime, run: Run, sink: TraceSink | None) -> TraceSink | None:
    """Make a new run durable in the runtime's store; returns what the runtime closes
    when the run ends (the journal, which also closes ``sink``)."""
    store = runtime.store
    if not supports_runs(store):
        return sink
    journal = Journal(store, run, owner_token(), 0, len(run.events))
    journal.inner = sink
    # The header is stored apart from the (possibly redacted) run_start event: resume
    # needs the exact budget, retry policy, policy and allow-list the run started with.
    header = {
        "machine_hash": MACHINE_HASH,
        "budget": run.budget.to_dict(),
        "retry": run.retry.to_dict(),
        "policy": run.policy,
        "allowed_tools": sorted(run.allowed),
    }
    try:
        store.create_run(
            run.run_id,
            header,
            journal.owner,
            list(run.events),
            Checkpoint(snapshot(run), journal._messages(run)),
        )
    except BaseException:
        if sink is not None:  # the runtime never sees it, so it would never close it
            sink.close()
        raise
    run.checkpoint = journal.checkpoint
    return journal


# ── resume ────────────────────────────────────────────────────────────────────────


def _restore(runtime: Runtime, stored: StoredRun) -> Run:
    try:
        return _rebuild(runtime, stored)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise StoreError(
            f"run {stored.run_id!r}: unreadable checkpoint ({type(exc).__name__}: {exc})"
        ) from None


def _rebuild(runtime: Runtime, stored: StoredRun) -> Run:
    header, ctx = stored.header, stored.ctx
    # The resuming caller may narrow the allow-list, never widen it.
    allowed = frozenset(header["allowed_tools"]) & runtime.allowed_tools
    approved = runtime._approved | {d for _, _, d in stored.approvals}
    run = Run(
        run_id=stored.run_id,
        messages=stored.messages,
        registry=runtime.tools,
        allowed=allowed,
        approved=approved,
        tool_specs=[t.spec() for t in runtime.tools if t.name in allowed],
        budget=Budget(**header["budget"]),
        retry=RetryPolicy(**header["retry"]),
        policy=header["policy"],
        store=runtime.store,
        clock=runtime.clock,
        redact=runtime.redact,
    )
    run.events = stored.events
    run.state, run.seq = ctx["state"], ctx["seq"]
    run.status, run.reason, run.detail = ctx["status"], ctx["reason"], ctx["detail"]
    run.answer, run.model_error = ctx["answer"], ctx["model_error"]
    for name, value in ctx["counters"].items():
        setattr(run.counters, name, value)
    # Wall-clock budgets count the time the run was alive, not the time it lay stored.
    run.now = runtime.clock()
    run.started = run.now - ctx["elapsed"]
    if ctx["decision"] is not None:
        run.decision = parse_decision(ctx["decision"])
        if run.state != "validating" and run.decision.calls:  # validating admits itself
            admit_calls(run.decision, run.registry, run.allowed, run.approved)
    run.batch_appended, run.index, run.attempt = (
        ctx["batch_appended"],
        ctx["index"],
        ctx["attempt"],
    )
    if ctx["call_index"] >= 0:
        run.call = run.decision.calls[ctx["call_index"]]
    run.outcome = ToolOutcome(ctx["outcome"][0], error=ctx["outcome"][1])
    run.cost_unknown = ctx["cost_unknown"]
    run.answered = set(ctx["answered"])
    run.placeholders = dict(ctx["placeholders"])
    run.reviews = dict(ctx["reviews"])
    taken = tuple(ctx["taken"])
    for t in TRANSITIONS:
        if (t.trigger, t.source, t.dest, t.action) == taken:
            run.taken = t
            break
    else:  # guessing here could mean running a write twice: refuse instead
        raise ValueError(
            f"its last transition {taken} is not an edge of this machine "
            f"(recorded by machine {header.get('machine_hash')}, this is "
            f"{MACHINE_HASH})"
        )
    return run


def _in_flight(run: Run) -> bool:
    """The last saved transition started a tool attempt whose end was never saved."""
    return run.state == "executing" and run.taken.action == "start_attempt"


def prepare_resume(runtime: Runtime, run_id: str) -> tuple[Run, Journal]:
    """Claim a stored run, rebuild it, and take the ``resume`` edge if one applies.

    The caller drives ``run.steps()`` when the run is not terminal, then closes the
    journal (which releases the claim).
    """
    store = runtime.store
    if not supports_runs(store):
        raise StoreError(
            f"{type(store).__name__} does not keep runs; use a MemoryStore or SqliteStore"
        )
    owner = owner_token()
    store.claim(run_id, owner)
    try:
        stored = store.load_run(run_id)
        run = _restore(runtime, stored)
        journal = Journal(store, run, owner, len(stored.messages), len(stored.events))
        run.checkpoint = journal.checkpoint
        if _in_flight(run):
            call = run.call
            if call.idempotency_key is not None:
                call.record = store.get_idempotency(call.name, call.idempotency_key)
            run.now = run.clock()
            run.fire("resume")
        elif run.state == "review_required" and settled(run):
            _commit_reconciled(run)
            run.now = run.clock()
            run.fire("resume")
    except BaseException:
        store.release(run_id, owner)
        raise
    return run, journal


def _commit_reconciled(run: Run) -> None:
    """A reconciled write's observed result becomes its idempotency record, so the same
    request later replays it instead of running again."""
    store = run.store
    for call in run.decision.calls:
        review = run.reviews.get(call.id)
        if not review or review["action"] != "reconcile" or call.idempotency_key is None:
            continue
        record = store.get_idempotency(call.name, call.idempotency_key)
        if record is not None and record.status == "committed":
            continue
        if record is None:
            store.begin_idempotency(
                IdempotencyRecord(
                    call.name,
                    call.idempotency_key,
                    call.args_digest,
                    "pending",
                    run.run_id,
                    call.id,
                )
            )
        store.commit_idempotency(call.name, call.idempotency_key, review.get("result"))


def steps(run: Run) -> Generator[Request, Any, None]:
    """The run's loop, or nothing when it is already terminal."""
    if run.state not in _TERMINAL:
        yield from run.steps()
