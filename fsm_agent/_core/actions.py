"""Actions: what taking an edge does to the run, named by the table's ``action`` column.

Each action is a pure function of the :class:`~fsm_agent._core.state.RunState` (and the
list of payload events it adds, written after the transition event). The loop runs the
action of every edge it takes (``core/loop.py``); nothing here does I/O.

Answering a call appends (or, after a review, replaces) one ``tool`` message bound to the
call's id, so the history is provider-valid at every stop (R1, R2). A tool message's
``content`` is the JSON text of a result object: ``{"ok": true, "value": ...}`` (with
``"replayed": true`` for an idempotent replay, ``"reconciled": true`` for a reviewer's
observed fact) or ``{"ok": false, "error": ..., "detail": ...}``; values are made
JSON-safe by ``core/jsonsafe.py`` (R12).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent._core import events
from fsm_agent._core.budget import MAX_RECORD_BYTES
from fsm_agent._core.content import split_media, tool_message
from fsm_agent._core.decision import NO_DECISION, PreparedCall
from fsm_agent._core.jsonsafe import copy_json, dumps_safe
from fsm_agent._core.reasons import stop_detail
from fsm_agent._core.state import NO_CALL, RunState

__all__ = ["ACTIONS", "BLOCKING", "FITS", "answer"]

Payloads = list[dict[str, Any]]
ActionFn = Callable[[RunState, Payloads], None]

#: Placeholder errors a reviewer must settle before a paused run can go on
#: (``skipped_pending_review`` calls simply run afresh).
BLOCKING = frozenset(
    {"approval_required", "outcome_unknown", "idempotency_conflict", "rule_review"}
)

#: Which review action settles which placeholder error (the ``review_fits`` guard).
FITS: dict[str, frozenset[str]] = {
    "approve": frozenset({"approval_required", "rule_review"}),
    "reconcile": frozenset({"outcome_unknown"}),
    "deny": BLOCKING | {"skipped_pending_review"},
}
# Approve with corrected arguments: it settles whatever an approval settles.
FITS["edit"] = FITS["approve"]
#: What a paused run's checkpoint keeps of a review (``s.reviews``), besides its action.
_KEPT = ("digest", "reason", "result", "reviewer", "at", "note", "arguments")

_FAILURE_ERRORS = {"rejected": "rejected", "timeout": "timeout", "not_started": "not_executed"}


#: A result as its tool message and observation hold it (:func:`record`): the JSON text
#: (with media split off, or a stand-in where it is kept by its size only), the media,
#: their bytes, the size counted against ``max_output_bytes``, and whether it is kept by
#: its size only. (A plain tuple: made once per answered call.)
Recorded = tuple[str, Sequence[Any], int, int, bool]


#: The media of a result that holds none.
_NO_MEDIA: tuple[Any, ...] = ()


def recorded_value(recorded: Recorded) -> Any:
    """The recorded ``value`` of an ok result (``None`` where it is kept by its size
    only): what the rules read of it, and what ``check`` replays."""
    return None if recorded[4] else copy_json(recorded[0]).get("value")


def record(s: RunState, result: dict[str, Any], synthetic: bool = False) -> Recorded:
    """``result`` as :func:`answer` records it (the observation the trace gets)."""
    text, data, changed = dumps_safe(result)
    media: Sequence[Any] = _NO_MEDIA
    media_bytes = 0
    budget = s.config.budget
    if changed:  # not plain JSON data: it may hold images or files (core/content.py)
        value, media = split_media(result, budget.max_media_bytes)
        if value is not result:
            text, data, _ = dumps_safe(value)
            media_bytes = sum(len(m.data) for m in media)
    size = len(data) + media_bytes
    limit = budget.max_output_bytes
    oversized = not synthetic and (size > MAX_RECORD_BYTES or (limit is not None and size > limit))
    if oversized:
        # Alone past the whole output budget (or what one record may hold): the run
        # stops on it anyway, so it is kept by its size, not whole, in the history, the
        # store and the trace, and the model is never handed it.
        text = json.dumps({"ok": False, "error": "output_too_large", "bytes": size})
        media = _NO_MEDIA
    return text, media, media_bytes, size, oversized


def answer(
    s: RunState,
    payloads: Payloads,
    result: dict[str, Any],
    *,
    call: PreparedCall | None = None,
    synthetic: bool = False,
    recorded: Recorded | None = None,
) -> int:
    """Bind ``result`` to ``call`` (default: the current one) as its tool message; returns
    the message's index in the history. The trace gets a copy (``observation``), so a
    tool that mutates what it returned later cannot change what was recorded.
    ``recorded``: :func:`record` of ``result``, where the rules already made it."""
    call = call or s.call
    text, media, media_bytes, size, oversized = s.recorded = recorded or record(
        s, result, synthetic
    )
    # (tool_message's plain-text form, without its call: once per answered call.)
    message = (
        {"role": "tool", "tool_call_id": call.id, "content": text}
        if not media
        else tool_message(call.id, text, media)
    )
    at_error = s.placeholders.pop(call.id, None)
    if at_error is None:
        at = len(s.messages)
        s.messages.append(message)
    else:  # a reviewed batch: the real answer takes the placeholder's place
        at = at_error[0]
        s.messages[at] = message
        s.rewritten.append(at)
    s.answered.add(call.id)
    if not synthetic:
        s.counters.output_bytes += size
    event = events.observation(call.id, call.name, copy_json(text), synthetic)
    # What the checker cannot measure from the recorded result (trace/walk.py adds it).
    if oversized:
        event["oversized"] = size
    elif media_bytes:
        event["media_bytes"] = media_bytes
    payloads.append(event)
    return at


def _append_batch(s: RunState) -> None:
    if not s.batch_appended:
        s.messages.append(s.decision.message)
        s.batch_appended = True


def _set_stop(s: RunState) -> None:
    s.status, s.reason = s.state, s.taken.reason
    s.detail = stop_detail(s)


def start_batch(s: RunState, payloads: Payloads) -> None:
    # (_append_batch and select_call(0) inlined: once per tool round, two calls less.)
    d = s.decision
    if not s.batch_appended:
        s.messages.append(d.message)
        s.batch_appended = True
    s.counters.tool_rounds += 1
    s.counters.tool_calls += len(d.calls)
    s.index, s.call, s.attempt = 0, d.calls[0], 0


def next_call(s: RunState, payloads: Payloads) -> None:
    index = s.index + 1
    while s.decision.calls[index].id in s.answered:  # settled by a reviewer
        index += 1
    s.select_call(index)


def end_batch(s: RunState, payloads: Payloads) -> None:
    s.decision = NO_DECISION
    s.call = NO_CALL  # (clear_call's body: once per tool round, one call less)
    s.approvals = {}


def start_attempt(s: RunState, payloads: Payloads) -> None:
    s.attempt += 1
    c, name = s.counters, s.call.name
    c.tool_attempts[name] = c.tool_attempts.get(name, 0) + 1
    if s.call.effect == "write":
        c.write_attempts += 1


def schedule_retry(s: RunState, payloads: Payloads) -> None:
    s.counters.retries += 1


def answer_refusal(s: RunState, payloads: Payloads) -> None:
    call = s.call
    result: dict[str, Any] = {"ok": False, "error": call.refusal}
    if call.refusal_rule is not None:  # refused by the user's rule (core/judging.py)
        result["rule"] = call.refusal_rule
    result["detail"] = call.refusal_detail
    answer(s, payloads, result)


def answer_rule(s: RunState, payloads: Payloads) -> None:
    """A result an ``after_tool`` rule denies: the model is told which rule, never the
    result itself."""
    (rule,) = s.ruled
    result = {"ok": False, "error": "denied_by_rule", "rule": rule, "detail": s.rule_detail}
    answer(s, payloads, result)


def retry_answer(s: RunState, payloads: Payloads) -> None:
    """An answer an ``answer`` rule sends back: kept in the history with the rule's
    words after it, so the model is asked again knowing exactly what failed."""
    s.messages.append(s.decision.message)
    s.messages.append({"role": "user", "content": f"Your answer was not accepted: "
                       f"{s.rule_detail}. Answer again."})  # fmt: skip
    s.decision = NO_DECISION


def answer_replay(s: RunState, payloads: Payloads) -> None:
    record = s.call.record
    assert record is not None
    s.counters.replays += 1
    if s.call.effect == "write":
        s.counters.write_attempts += 1
    answer(s, payloads, {"ok": True, "value": record.result, "replayed": True})


def answer_result(s: RunState, payloads: Payloads) -> None:
    # (Recorded already where an after_tool rule judged it: judging.after_tool.)
    answer(s, payloads, {"ok": True, "value": s.outcome.value}, recorded=s.ahead)


def answer_failure(s: RunState, payloads: Payloads) -> None:
    error = _FAILURE_ERRORS.get(s.outcome.kind, "tool_failed")
    answer(
        s, payloads, {"ok": False, "error": error, "detail": s.outcome.error, "attempts": s.attempt}
    )


def answer_stored(s: RunState, payloads: Payloads) -> None:
    """The result a write stored (idempotency record) before the process died."""
    record = s.call.record
    assert record is not None
    answer(s, payloads, {"ok": True, "value": record.result})


def finish(s: RunState, payloads: Payloads) -> None:
    s.messages.append(s.decision.message)
    s.answer = s.decision.answer
    _set_stop(s)


def stop(s: RunState, payloads: Payloads) -> None:
    """Enter a terminal state, answering every unanswered call so history stays valid."""
    _set_stop(s)
    d = s.decision
    pairable = d.calls and d.malformed is None and d.missing_id is None and (d.duplicate_id is None)
    if d is NO_DECISION or not pairable:
        if d is not NO_DECISION and not d.calls and d.malformed is None:
            s.messages.append(d.message)  # a text reply stopped by a budget is kept
        return
    _append_batch(s)
    for call in d.calls:
        if call.id not in s.answered:
            error, detail = _placeholder(s, call)
            result = {"ok": False, "error": error, "detail": detail}
            if error == "denied_by_rule":  # a result withheld: answered as without the stop
                result = {"ok": False, "error": error, "rule": min(s.ruled), "detail": detail}
            at = answer(s, payloads, result, call=call, synthetic=True)
            if s.state == "review_required":
                s.placeholders[call.id] = (at, error)


def _placeholder(s: RunState, call: PreparedCall) -> tuple[str, str]:
    """The synthetic answer of a call the run stops before answering."""
    reason = s.reason or ""
    if reason == "cancelled":
        return "cancelled", "the run was cancelled before this call ran"
    if reason == "approval_required" and call.needs_approval:
        return "approval_required", "no approval matches these exact arguments"
    if reason == "rule_review" and call.review_rule is not None:
        return "rule_review", f"rule {call.review_rule!r} asks a reviewer for these exact arguments"
    if (
        reason == "denied_by_rule"
        and call is s.call
        and s.taken.trigger == "tool_returned"
        and s.ruled
    ):
        # It ran, and an after_tool rule withholds its result (the strict policy's stop):
        # the model is told which rule, as without the stop, never "not executed".
        return "denied_by_rule", s.rule_detail
    if s.state == "review_required":
        if call is s.call and reason != "approval_required":
            return reason, stop_detail(s)
        return "skipped_pending_review", f"the run stopped for review: {reason}"
    return "not_executed", f"the run stopped: {s.status}/{reason}"


def apply_review(s: RunState, payloads: Payloads) -> None:
    """Settle the paused batch with the reviewers' decisions: a denied call is answered
    as denied, a reconciled one with the observed result; approved and skipped calls keep
    their placeholder until they run afresh."""
    if s.reason in ("approval_required", "rule_review") and s.call.index < 0:
        # The pause came at validate, before the batch started (a use refused at
        # dispatch pauses a started batch: it is counted already).
        s.counters.tool_rounds += 1
        s.counters.tool_calls += len(s.decision.calls)
    for call in s.decision.calls:
        if call.id not in s.placeholders:
            continue
        review = s.reviews.get(call.id, {})
        action = review.get("action")
        if action == "deny":
            detail = review.get("reason") or "denied by review"
            answer(
                s,
                payloads,
                {"ok": False, "error": "denied", "detail": detail},
                call=call,
                synthetic=True,
            )
        elif action == "reconcile":
            answer(
                s,
                payloads,
                {"ok": True, "value": review.get("result"), "reconciled": True},
                call=call,
            )
        else:  # approved (admission found the review) or skipped: runs afresh
            s.answered.discard(call.id)
    s.reviews = {}
    s.index, s.attempt = -1, 0  # next_call picks the first call still to run
    s.clear_call()
    s.status = s.reason = None
    s.detail = ""


def record_review(s: RunState, payloads: Payloads) -> None:
    """Record the reviewer's decision (``s.review_request``, which ``review_fits`` found
    fitting) on its paused call, and write it as the ``review`` event."""
    request = s.review_request
    assert request is not None
    s.reviews[request["call_id"]] = {
        "action": request["action"],
        **{k: request[k] for k in _KEPT if k in request},
    }
    if request["action"] == "edit":
        _edit_call(s, request["call_id"], request["arguments"])
    payloads.append({"type": "review", **request})


def _edit_call(s: RunState, call_id: str, arguments: dict[str, Any]) -> None:
    """Put a reviewer's corrected arguments in the paused call's place: in the batch
    (the resume admits the call afresh with them, so it is validated, digested and
    judged like any call) and in the history's assistant message (the model later sees
    the call that ran, answered by its result). The trace's ``decision`` keeps what the
    model asked and the ``review`` event both."""
    text = json.dumps(arguments, ensure_ascii=False)
    call = next(c for c in s.decision.calls if c.id == call_id)
    call.raw_arguments, call.arguments, call.args_digest = text, None, ""
    s.decision.message = _with_arguments(s.decision.message, call_id, text)
    at = s.placeholders[call_id][0]
    # The batch's assistant message precedes its tool messages; a replay keeps no history.
    while 0 < at <= len(s.messages) and s.messages[at - 1].get("role") != "assistant":
        at -= 1
    if 0 < at <= len(s.messages):
        s.messages[at - 1] = _with_arguments(s.messages[at - 1], call_id, text)
        s.rewritten.append(at - 1)


def _with_arguments(message: dict[str, Any], call_id: str, text: str) -> dict[str, Any]:
    """A copy of an assistant message whose call ``call_id`` has the arguments ``text``
    (a copy: the message may be the recorded ``decision`` event's own dict)."""
    calls = [
        {**c, "function": {**c["function"], "arguments": text}} if c.get("id") == call_id else c
        for c in message.get("tool_calls") or ()
    ]
    return {**message, "tool_calls": calls}


#: action name (the table's ``action`` column) -> function.
ACTIONS: dict[str, ActionFn] = {
    fn.__name__: fn
    for fn in (
        start_batch,
        next_call,
        end_batch,
        start_attempt,
        schedule_retry,
        answer_refusal,
        answer_replay,
        answer_result,
        answer_failure,
        answer_stored,
        finish,
        stop,
        apply_review,
        record_review,
        retry_answer,
        answer_rule,
    )
}
