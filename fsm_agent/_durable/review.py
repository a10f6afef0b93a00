"""Review of a paused run (D2): approve, edit, deny or reconcile one call.

A decision is the table's ``review`` trigger (``core/loop.py``'s :func:`review`): its
``review_fits`` guard checks it against what the paused call waits for, and the
transition, the ``review`` event (who decided, when, an optional note) and the new
checkpoint are stored in one save. Nothing runs here, so the CLI can record decisions
without the run's model or tools; the next resume (a worker's, or ``Runtime.resume``)
applies them once every blocking call of the paused batch is settled. An approval
authorises exactly that call id, once, for the arguments it was paused with (R8); an
``edit`` approves it with the reviewer's corrected arguments instead, validated here
against the tool's schema as the run's header records it, and bound by their own digest
(the resume admits the call afresh with them, as any call).

A decider that already read the run (the review server's page) passes that read as
``seen``: the decision is judged on it and written only while the run is still that
version, without the claim and the read (one round trip on PostgreSQL, one commit on
SQLite); where the run moved on, it is judged again on the run as stored.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from fsm_agent._core import loop
from fsm_agent._core.actions import BLOCKING, FITS
from fsm_agent._core.approvals import ApprovalBook
from fsm_agent._core.canonical import digest, parse_arguments
from fsm_agent._core.decision import schema_errors
from fsm_agent._core.formats import arguments_validator
from fsm_agent._core.state import RunConfig, RunState
from fsm_agent._core.table import DEFAULT_MACHINE, Machine
from fsm_agent._durable import owners
from fsm_agent._durable.resume import claim_and_load, restore_state
from fsm_agent._durable.store import Checkpoint, StoredRun, supports_runs
from fsm_agent._errors import ArgumentsError, ConfigError, ReviewError, StoreError
from fsm_agent._trace.chain import continue_chain, trace_key

__all__ = ["BLOCKING", "InvalidEdit", "pending_calls", "record", "record_review"]

_DONE = {"approve": "approved", "edit": "approved with edits", "deny": "denied",
         "reconcile": "reconciled"}  # fmt: skip


class InvalidEdit(ReviewError):
    """Corrected arguments the tool cannot take (not a JSON object, or not valid for its
    schema): the reviewer's input is wrong, not the moment (the server answers 422)."""


def _review_config(
    allowed: frozenset[str],
    budget: Any,
    retry: Any,
    policy: Any,
    *,
    machine: Machine = DEFAULT_MACHINE,
) -> RunConfig:
    """A run's settings without its tools: a review reads the paused batch, runs nothing."""
    return RunConfig(
        machine=machine,
        budget=budget,
        retry=retry,
        policy=policy,
        allowed=allowed,
        tools=lambda name: None,
        tool_specs=[],
        approvals=ApprovalBook(),
    )


def paused_state(stored: StoredRun, machines: Mapping[str, Machine] | None = None) -> RunState:
    """The stored run's state, read for review (no tools, nothing admitted), under the
    machine it was paused by (one of ``machines``, by hash; default: the default table)."""
    return restore_state(stored, _review_config, machines=machines)


def pending_calls(stored: StoredRun) -> list[dict[str, Any]]:
    """The paused batch's calls a reviewer may act on, with what blocks each."""
    body = stored.body
    calls = {c.get("id"): c for c in ((body.get("decision") or {}).get("tool_calls") or [])}
    out = []
    for call_id, (_, waiting) in (body.get("placeholders") or {}).items():
        fn = calls.get(call_id, {}).get("function") or {}
        out.append(
            {
                "call_id": call_id,
                "tool": fn.get("name"),
                "arguments": fn.get("arguments"),
                "waiting_for": waiting,
                "review": (body.get("reviews") or {}).get(call_id),
            }
        )
    return out


def record_review(
    store: Any,
    run_id: str,
    call_id: str,
    action: str,
    *,
    reason: str | None = None,
    result: Any = None,
    arguments: Any = None,
    key: bytes | str | None = None,
    reviewer: str | None = None,
    note: str | None = None,
    at: str | None = None,
    machines: Mapping[str, Machine] | None = None,
    seen: StoredRun | None = None,
) -> dict[str, Any]:
    """Record a reviewer's decision on a paused call; returns the ``review`` event.
    ``machines``: the machines the runtime knows, by hash (see ``paused_state``).

    The run's machine decides: the decision fires the table's ``review`` trigger, whose
    ``review_fits`` guard checks it against what the call waits for; the transition and
    the ``review`` event are stored with the new checkpoint in one save, and nothing
    runs (resuming the run is a worker's or ``Runtime.resume``'s job). ``arguments``
    (``edit`` only): the corrected arguments, a JSON object valid for the tool's schema;
    the call then runs with them (and nothing else). ``reviewer`` is
    who decided, ``note`` why (both recorded as given); ``at`` when, ISO-8601 UTC
    (default: now, read here, never in the core). ``key``: the runtime's ``trace_key``,
    needed to append to a signed trace. Anything that does not fit raises
    :class:`ReviewError` and changes nothing.

    ``seen``: the run as the decider last read it (``store.load_run``; the review
    server keeps the version each page showed). The decision is judged on it and
    written only while the run is still that version and nobody holds it: one round
    trip on PostgreSQL, one commit on SQLite. Where it moved on (or the store cannot
    tell versions), the decision is judged again on the run as stored, claimed and read
    first, as without ``seen``: what is recorded is the same either way.
    """
    return record(store, run_id, call_id, action, reason=reason, result=result,
                  arguments=arguments, key=key, reviewer=reviewer, note=note, at=at,
                  machines=machines, seen=seen)[0]  # fmt: skip


def record(
    store: Any,
    run_id: str,
    call_id: str,
    action: str,
    *,
    reason: str | None = None,
    result: Any = None,
    arguments: Any = None,
    key: bytes | str | None = None,
    reviewer: str | None = None,
    note: str | None = None,
    at: str | None = None,
    machines: Mapping[str, Machine] | None = None,
    observe: Callable[[list[dict[str, Any]]], None] | None = None,
    seen: StoredRun | None = None,
) -> tuple[dict[str, Any], RunState]:
    """:func:`record_review`, also returning the run's state as now stored. ``observe``
    is given the events the review's edge recorded, before they are stored (or, for a
    decision that does not fit, refused): a runtime's interceptors see them (twice where
    a decision judged on ``seen`` found the run moved on and was judged again)."""
    _check_action(action, arguments)
    who = _text_or_none("reviewer", reviewer)
    why = _text_or_none("note", note)
    request: dict[str, Any] = {"at": _instant(at)}
    if who is not None:  # (absent, not null, when nobody was named)
        request["reviewer"] = who
    if why is not None:
        request["note"] = why
    decision = _Decision(call_id, action, reason, result, arguments, request, key, machines)
    if not supports_runs(store):
        raise StoreError(f"{type(store).__name__} does not keep runs")
    if seen is not None:
        if seen.run_id != run_id:
            raise ReviewError(
                f"the run seen is {seen.run_id!r}, not {run_id!r}: pass the decided run's "
                "own read (store.load_run(run_id)) as seen="
            )
        done = _on_view(store, seen, decision, observe)
        if done is not None:
            return done
    owner = owners.new_owner()
    owners.hold(owner)
    try:
        stored = claim_and_load(store, run_id, owner)  # (not left claimed if unreadable)
    except BaseException:
        owners.drop(owner)
        raise
    try:
        events, s, checkpoint = decision.judge(store, stored, observe)
        # The decision and the claim's end in one statement where the store can.
        save = getattr(store, "save_and_release", store.save)
        save(run_id, owner, events, checkpoint)
        return events[-1], s
    finally:
        owners.let_go(store, run_id, owner)


class _Decision(NamedTuple):
    """A decision as asked, judged on a version of the run by :meth:`judge`."""

    call_id: str
    action: str
    reason: str | None
    result: Any
    arguments: Any
    #: the fields the caller gave the ``review`` event (when, who, why)
    given: dict[str, Any]
    key: bytes | str | None
    machines: Mapping[str, Machine] | None

    def judge(
        self,
        store: Any,
        stored: StoredRun,
        observe: Callable[[list[dict[str, Any]]], None] | None,
    ) -> tuple[list[dict[str, Any]], RunState, Checkpoint]:
        """The events the review's edge records on ``stored``, the state after it and
        the checkpoint to save; :class:`ReviewError` where it does not fit."""
        s = paused_state(stored, self.machines)
        request = _request(s, self.call_id, self.action, self.reason, self.result)
        if self.action == "edit":
            request.update(_edited(stored, s, self.call_id, self.arguments))
        request.update(self.given)
        before = len(s.events)
        fits = loop.review(s, request)
        events = s.events[before:]
        if observe is not None:
            observe(events)
        if not fits:
            raise ReviewError(_refusal(s, self.call_id, self.action))
        lines = _chained(store, stored, events, self.key)
        # An edit rewrote the batch's assistant message in the history.
        rows = [(i, s.messages[i]) for i in sorted(set(s.rewritten))]
        s.rewritten.clear()
        return events, s, Checkpoint(s.snapshot(), rows, lines)


def _on_view(
    store: Any,
    seen: StoredRun,
    decision: _Decision,
    observe: Callable[[list[dict[str, Any]]], None] | None,
) -> tuple[dict[str, Any], RunState] | None:
    """The decision judged on ``seen`` and written while the run is still that version
    (``store.save_if_unchanged``); ``None`` where it cannot be: the store tells no
    versions, the run moved on, or it does not fit this version (judged again on the
    run as stored, which says why)."""
    save = getattr(store, "save_if_unchanged", None)
    if save is None or seen.head is None:
        return None
    # Judged on a copy: the loop's state shares what it restores from (the decider
    # may keep its view, and this judgement may not be the one stored).
    view = StoredRun(seen.run_id, seen.header, copy.deepcopy(seen.snapshot),
                     list(seen.messages), list(seen.events), seen.head)  # fmt: skip
    try:
        events, s, checkpoint = decision.judge(store, view, observe)
    except ReviewError:
        return None
    if not save(seen.run_id, seen.head, events, checkpoint):
        return None
    return events[-1], s


def _chained(
    store: Any, stored: StoredRun, events: list[dict[str, Any]], key: bytes | str | None
) -> list[str] | None:
    """The review's events as trace lines chained onto the stored run's (for a store
    that keeps lines)."""
    if not (getattr(store, "wants_lines", False) and stored.events):
        return None
    try:
        encoder = continue_chain(
            stored.run_id, stored.events[0], stored.events[-2:], trace_key(key), 1
        )
    except ConfigError as exc:
        raise ReviewError(str(exc)) from None
    return None if encoder is None else encoder.lines(events)


def _check_action(action: str, arguments: Any) -> None:
    if action not in FITS:
        raise ReviewError(f"unknown review action {action!r} (approve, edit, deny, reconcile)")
    if (arguments is not None) != (action == "edit"):
        raise ReviewError(
            "corrected arguments go with the edit action only (approve with arguments: edit)"
            if arguments is not None
            else "an edit needs the corrected arguments (a JSON object)"
        )


def _text_or_none(what: str, value: Any, of: str = "review") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ReviewError(f"the {of}'s {what} must be a non-empty string, got {value!r}")
    return value


def _instant(at: Any, of: str = "review") -> str:
    """``at`` as ISO-8601 UTC (now if ``None``)."""
    if at is None:
        return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(at, str):
        try:
            parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.utcoffset() == timedelta(0):
            return at
    raise ReviewError(
        f"the {of}'s time must be ISO-8601 in UTC (e.g. '2026-01-31T12:00:00Z'), got {at!r}"
    )


def _request(
    s: RunState, call_id: str, action: str, reason: str | None, result: Any
) -> dict[str, Any]:
    """The ``review`` event a decision would write (the table then decides whether it
    fits). Raises :class:`ReviewError` for a run not paused and for unusable values."""
    if s.state != "review_required":
        status = s.state + (f"/{s.reason}" if s.reason else "")
        raise ReviewError(f"run {s.run_id!r} is {status}, not waiting for review")
    call = next((c for c in s.decision.calls if c.id == call_id), None)
    request: dict[str, Any] = {
        "type": "review",
        "action": action,
        "call_id": call_id,
        "tool": None if call is None else call.name,
    }
    if action == "approve" and call is not None:
        try:
            request["digest"] = digest(call.name, parse_arguments(call.raw_arguments))
        except ArgumentsError as exc:
            raise ReviewError(f"call {call_id!r} has unusable arguments: {exc}") from None
    elif action == "deny":
        request["reason"] = reason or "denied by review"
    elif action == "reconcile":
        try:
            json.dumps(result, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise ReviewError(f"the reconciled result must be JSON data: {exc}") from None
        request["result"] = result
    return request


def _edited(stored: StoredRun, s: RunState, call_id: str, arguments: Any) -> dict[str, Any]:
    """The fields an ``edit`` adds to its ``review`` event: the corrected ``arguments``,
    their ``digest`` and the ``original_arguments``. Refused (:class:`ReviewError`)
    unless they are a JSON object the tool's recorded schema accepts; a call that is not
    pending is left to the table to refuse (``_refusal`` says why)."""
    call = next((c for c in s.decision.calls if c.id == call_id), None)
    paused = s.placeholders.get(call_id)
    if call is None or paused is None or paused[1] not in FITS["edit"] or call_id in s.reviews:
        return {}  # the table refuses it, and _refusal says why
    if isinstance(arguments, Mapping):
        arguments = dict(arguments)
    try:
        text = json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidEdit(f"the edited arguments must be JSON data: {exc}") from None
    if not isinstance(arguments, dict):
        raise InvalidEdit(
            f"the edited arguments of call {call_id!r} must be a JSON object, "
            f"got {type(arguments).__name__}"
        )
    tools = stored.header.get("tools")
    facts = tools.get(call.name) if isinstance(tools, Mapping) else None
    schema = facts.get("schema") if isinstance(facts, Mapping) else None
    if not isinstance(schema, dict):
        raise InvalidEdit(
            f"run {s.run_id!r} records no argument schema for tool {call.name!r}: its "
            "edits cannot be validated (approve or deny the call instead)"
        )
    edited = json.loads(text)
    problems = schema_errors(arguments_validator(schema), edited)
    if problems:
        raise InvalidEdit(
            f"the edited arguments of call {call_id!r} do not fit tool {call.name!r}'s "
            f"schema: {'; '.join(problems)}"
        )
    try:
        original = parse_arguments(call.raw_arguments)
    except ArgumentsError as exc:
        raise ReviewError(f"call {call_id!r} has unusable arguments: {exc}") from None
    return {
        "digest": digest(call.name, edited),
        "arguments": edited,
        "original_arguments": original,
    }


def _refusal(s: RunState, call_id: str, action: str) -> str:
    """Why the table refused the decision (``review_fits`` did not hold)."""
    if call_id not in s.placeholders:
        return (
            f"call {call_id!r} is not pending in run {s.run_id!r} (pending: "
            f"{', '.join(s.placeholders) or 'none'})"
        )
    if call_id in s.reviews:
        done = _DONE.get(s.reviews[call_id].get("action", ""), "decided")
        return f"call {call_id!r} of run {s.run_id!r} was already {done}"
    waiting = s.placeholders[call_id][1]
    fits = sorted(a for a, errors in FITS.items() if waiting in errors)
    use = " or ".join(fits) if len(fits) < 3 else f"{', '.join(fits[:-1])} or {fits[-1]}"
    return (
        f"call {call_id!r} is waiting for {waiting or 'nothing'}: {action} "
        f"does not apply (use {use})"
    )
