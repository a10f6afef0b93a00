"""Cancelling a stored run from outside its application (the review server's
``POST /api/runs/{id}/cancel``, ``fsm-agent runs cancel``): the table's ``cancel``
trigger, fired by the engine's own loop, exactly as when a driver is stopped (R2).

:func:`ask_cancel` is what both call: a run waiting to be driven is cancelled here, at
once (:func:`cancel_run`); a run a live driver holds, or one stopped in the middle of a
batch, gets a :class:`~fsm_agent._durable.store.CancelRequest` stored with it instead,
which its driver honours — the one driving it now at its next step (the request comes
back with the heartbeat's lease renewal), or the next one to claim it, at once — with the
same ``cancel`` edges and the same ``by``/``at``/``note`` (``runtime/asked.py``).

The run is claimed (``RunBusy`` while a live driver holds it: that driver's own stop
is the way to cancel it there), restored, and driven by the loop with nothing of the
world behind it: the clock and the store answer, and the first request that would ask
the model, run a tool or begin an intent gets :class:`~fsm_agent._core.loop.Cancelled`
thrown in instead, so the loop takes its ``cancel`` edge, answers every open call and
writes ``run_end``. Only a run waiting at ``deciding`` (submitted and never driven, or
checkpointed between rounds) is cancelled here: a run stopped mid-batch needs its
tools to settle the batch (its application resumes it), and a run in
``review_required`` is settled by its reviewers (the table has no ``cancel`` edge out
of a terminal state). Check replays the result like any stopped run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fsm_agent._core.loop import Cancelled, start, steps
from fsm_agent._core.requests import EmitEvents, ReadClock, SaveCheckpoint
from fsm_agent._core.state import RunState
from fsm_agent._core.table import Machine
from fsm_agent._durable import owners
from fsm_agent._durable.resume import restore_state
from fsm_agent._durable.review import _instant, _review_config, _text_or_none
from fsm_agent._durable.store import CancelRequest, Checkpoint, supports_runs
from fsm_agent._errors import ConfigError, ReviewError, RunBusy, StoreError
from fsm_agent._trace.chain import Encoder, continue_chain, trace_key

__all__ = ["NotCancellable", "ask_cancel", "cancel_run"]

_FINISHED = frozenset({"done", "budget_exhausted", "protocol_error", "cancelled"})


class NotCancellable(ReviewError):
    """The run is in a state this cancel does not take (finished, paused for review,
    stopped mid-batch); the message says what to do instead. ``why``: ``ended``,
    ``review`` or ``mid_batch``."""

    def __init__(self, message: str, why: str = "ended") -> None:
        super().__init__(message)
        self.why = why


def ask_cancel(
    store: Any,
    run_id: str,
    *,
    key: bytes | str | None = None,
    machines: Mapping[str, Machine] | None = None,
    by: str | None = None,
    note: str | None = None,
    at: str | None = None,
) -> RunState | CancelRequest:
    """Cancel ``run_id`` now if it waits to be driven (:func:`cancel_run`: returns its
    state, ``cancelled``); if a live driver holds it, or it stopped in the middle of a
    batch, store a :class:`CancelRequest` for its driver and return the request stored
    (the first one: asking again changes nothing). :class:`NotCancellable` for a run that
    has ended or waits for review (also one that ended while this was asked), and what
    :func:`cancel_run` raises otherwise."""
    when = _instant(at, "cancel")
    try:
        return cancel_run(store, run_id, key=key, machines=machines, by=by, note=note, at=when)
    except RunBusy:
        pass  # a live driver holds it: the request is for that driver
    except NotCancellable as exc:
        if exc.why != "mid_batch":
            raise
    keep = getattr(store, "request_cancel", None)
    if keep is None:
        raise StoreError(f"{type(store).__name__} keeps no cancel requests for a run's driver")
    stored: CancelRequest | None = keep(run_id, CancelRequest(when, by, note))
    if stored is None:  # it ended meanwhile
        body = store.load_run(run_id).body
        status = str(body.get("state")) + (f"/{body['reason']}" if body.get("reason") else "")
        raise NotCancellable(f"run {run_id!r} is {status}: it has ended, nothing to cancel")
    return stored


def cancel_run(
    store: Any,
    run_id: str,
    *,
    key: bytes | str | None = None,
    machines: Mapping[str, Machine] | None = None,
    clock: Callable[[], float] = time.monotonic,
    by: str | None = None,
    note: str | None = None,
    at: str | None = None,
) -> RunState:
    """Cancel ``run_id`` through its machine's ``cancel`` trigger and store the result;
    returns the run's state as now stored (``cancelled``). ``key``: the runtime's
    ``trace_key`` (a signed trace is continued under it). ``by`` (who asks), ``note``
    (why) and ``at`` (when, ISO-8601 UTC; default now) are recorded in the ``cancel``
    transition, as a review records its reviewer. Raises ``RunNotFound``, ``RunBusy``,
    :class:`NotCancellable`, ``ReviewError`` (an unusable ``by``/``note``/``at``) or
    ``StoreError``, changing nothing."""
    asked = Cancelled(
        by=_text_or_none("by", by, "cancel"),
        at=_instant(at, "cancel"),
        note=_text_or_none("note", note, "cancel"),
    )
    if not supports_runs(store):
        raise StoreError(f"{type(store).__name__} does not keep runs")
    owner = owners.new_owner()
    owners.hold(owner)
    store.claim(run_id, owner)
    try:
        stored = store.load_run(run_id)
        s = restore_state(stored, _review_config, machines=machines)
        _refuse_unless_waiting(s)
        s.config = replace(s.config, save="writes", header=dict(stored.header))
        if not s.events:  # submitted, never driven: its trace starts here
            adopt = getattr(store, "adopt_run", None)
            if adopt is not None and not adopt(run_id, owner, s.config.header_fields()):
                raise StoreError(f"run {run_id!r}: its trace began meanwhile; cancel it again")
            start(s)
            s.emitted = s.saved_events = 0
        encoder = _encoder(store, s, stored.events[-2:], key)
        for save in _stopped(s, clock, asked):
            lines = None if encoder is None else encoder.lines(save.events)
            store.save(run_id, owner, save.events, Checkpoint(save.snapshot, save.messages, lines))
        return s
    finally:
        owners.let_go(store, run_id, owner)


def _refuse_unless_waiting(s: RunState) -> None:
    status = s.state + (f"/{s.reason}" if s.reason else "")
    if s.state in _FINISHED:
        raise NotCancellable(f"run {s.run_id!r} is {status}: it has ended, nothing to cancel")
    if s.state == "review_required":
        raise NotCancellable(
            f"run {s.run_id!r} is {status}, waiting for review: deny its pending calls "
            "(the model is told why) instead; a paused run ends when its reviewers decide",
            "review",
        )
    if s.state != "deciding":
        raise NotCancellable(
            f"run {s.run_id!r} stopped in {s.state}, in the middle of a batch: resume it "
            "with its application (Runtime.resume or a worker) to settle the batch",
            "mid_batch",
        )


def _stopped(s: RunState, clock: Callable[[], float], asked: Cancelled) -> list[SaveCheckpoint]:
    """Drive the restored run until it would ask the world anything, then stop it there
    (``asked``, as a driver does); the checkpoints the loop asked to save."""
    saves: list[SaveCheckpoint] = []
    loop = steps(s, resumed=True)
    request: Any = next(loop)
    stopping = False
    while True:
        try:
            if isinstance(request, ReadClock):
                request = loop.send(clock())
            elif isinstance(request, EmitEvents):
                request = loop.send(None)
            elif isinstance(request, SaveCheckpoint):
                saves.append(request)
                request = loop.send(None)
            elif stopping:  # (once stopped, the loop asks only for the above)
                raise NotCancellable(f"run {s.run_id!r} asked for {type(request).__name__}")
            else:  # the model, a tool, an intent: the world would be asked
                stopping = True
                request = loop.throw(asked)
        except StopIteration:
            return saves


def _encoder(
    store: Any, s: RunState, tail: list[dict[str, Any]], key: bytes | str | None
) -> Encoder | None:
    """What chains the new events onto the stored ones (for a store keeping lines)."""
    if not getattr(store, "wants_lines", False) or not s.events:
        return None
    try:
        return continue_chain(s.run_id, s.events[0], tail, trace_key(key), 1)
    except ConfigError as exc:
        raise NotCancellable(str(exc)) from None
