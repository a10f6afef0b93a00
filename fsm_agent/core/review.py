"""A reviewer's decision on a paused call: which actions fit which placeholder, and the
``review`` event a decision records. One implementation for the store that records a
decision (``durable/review.py``) and for ``fsm-agent check``, which replays it."""

from __future__ import annotations

import json
from typing import Any

from fsm_agent.core.actions import BLOCKING
from fsm_agent.core.canonical import digest, parse_arguments
from fsm_agent.core.state import RunState
from fsm_agent.errors import ArgumentsError, ReviewError

__all__ = ["FITS", "decide"]

#: Which review action fits which placeholder.
FITS: dict[str, frozenset[str]] = {
    "approve": frozenset({"approval_required"}),
    "reconcile": frozenset({"outcome_unknown"}),
    "deny": BLOCKING | {"skipped_pending_review"},
}
_DONE = {"approve": "approved", "deny": "denied", "reconcile": "reconciled"}


def decide(
    s: RunState, call_id: str, action: str, reason: str | None, result: Any
) -> dict[str, Any]:
    """Check that ``action`` fits the paused call and record it in ``s.reviews``; the
    ``review`` event (without its ``seq``), or :class:`ReviewError` saying why not."""
    if s.state != "review_required":
        status = s.state + (f"/{s.reason}" if s.reason else "")
        raise ReviewError(f"run {s.run_id!r} is {status}, not waiting for review")
    if call_id not in s.placeholders:
        raise ReviewError(
            f"call {call_id!r} is not pending in run {s.run_id!r} (pending: "
            f"{', '.join(s.placeholders) or 'none'})"
        )
    if call_id in s.reviews:
        done = _DONE.get(s.reviews[call_id].get("action", ""), "decided")
        raise ReviewError(f"call {call_id!r} of run {s.run_id!r} was already {done}")
    waiting = s.placeholders[call_id][1]
    if waiting not in FITS[action]:
        fits = sorted(a for a, errors in FITS.items() if waiting in errors)
        raise ReviewError(
            f"call {call_id!r} is waiting for {waiting or 'nothing'}: {action} "
            f"does not apply (use {' or '.join(fits)})"
        )
    call = next(c for c in s.decision.calls if c.id == call_id)
    event: dict[str, Any] = {
        "type": "review",
        "action": action,
        "call_id": call_id,
        "tool": call.name,
    }
    decision: dict[str, Any] = {"action": action}
    if action == "approve":
        try:
            bound = digest(call.name, parse_arguments(call.raw_arguments))
        except ArgumentsError as exc:
            raise ReviewError(f"call {call_id!r} has unusable arguments: {exc}") from None
        event["digest"] = decision["digest"] = bound
    elif action == "deny":
        event["reason"] = decision["reason"] = reason or "denied by review"
    else:
        try:
            json.dumps(result, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise ReviewError(f"the reconciled result must be JSON data: {exc}") from None
        event["result"] = decision["result"] = result
    s.reviews[call_id] = decision
    return event
