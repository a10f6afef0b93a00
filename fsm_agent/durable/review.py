"""Review of a paused run (SPEC §5): approve, deny or reconcile one call.

A decision is recorded in the store, as a ``review`` event in the run's trace and in its
checkpoint (plus, for an approval, a grant bound to the tool and the digest of the
call's canonical arguments). Nothing runs here, so the CLI can record decisions without
the run's model or tools; the next resume (``durable.prepare_resume``) applies them once
every blocking call of the paused batch is settled.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fsm_agent.core.canonical import ArgumentsError, digest, parse_arguments
from fsm_agent.core.decision import PreparedCall, parse_decision
from fsm_agent.durable.store import Checkpoint, Store, StoredRun, owner_token
from fsm_agent.errors import ReviewError, StoreError

if TYPE_CHECKING:
    from fsm_agent.core.loop import Run

__all__ = ["BLOCKING", "pending_calls", "record_review", "settled"]

#: Placeholder errors that a reviewer must settle before a paused run can go on
#: (``skipped_pending_review`` calls simply run afresh).
BLOCKING = frozenset({"approval_required", "outcome_unknown", "idempotency_conflict"})

#: Which review action fits which placeholder.
_FITS: dict[str, frozenset[str]] = {
    "approve": frozenset({"approval_required"}),
    "reconcile": frozenset({"outcome_unknown"}),
    "deny": BLOCKING | {"skipped_pending_review"},
}


def _error_of(message: dict[str, Any]) -> str:
    try:
        content = json.loads(message.get("content") or "")
    except (TypeError, ValueError):
        return ""
    return str(content.get("error", "")) if isinstance(content, dict) else ""


def settled(run: Run) -> bool:
    """Every blocking placeholder of the paused batch has a reviewer's decision."""
    if not run.reviews:
        return False
    return all(
        call_id in run.reviews
        for call_id, at in run.placeholders.items()
        if _error_of(run.messages[at]) in BLOCKING
    )


def pending_calls(stored: StoredRun) -> list[dict[str, Any]]:
    """The paused batch's calls a reviewer may act on, with what blocks each."""
    ctx = stored.ctx
    calls = {c.get("id"): c for c in ((ctx.get("decision") or {}).get("tool_calls") or [])}
    out = []
    for call_id, at in (ctx.get("placeholders") or {}).items():
        call = calls.get(call_id, {})
        fn = call.get("function") or {}
        out.append(
            {
                "call_id": call_id,
                "tool": fn.get("name"),
                "arguments": fn.get("arguments"),
                "waiting_for": _error_of(stored.messages[at]),
                "review": (ctx.get("reviews") or {}).get(call_id),
            }
        )
    return out


def record_review(
    store: Store,
    run_id: str,
    call_id: str,
    action: str,
    *,
    reason: str | None = None,
    result: Any = None,
) -> dict[str, Any]:
    """Record a reviewer's decision on a paused call; returns the ``review`` event.

    Nothing runs here (this works without the run's model and tools, e.g. from the CLI);
    the next resume applies the decisions once every blocking call is settled. Anything
    that does not fit raises :class:`ReviewError` and changes nothing.
    """
    if action not in _FITS:
        raise ReviewError(f"unknown review action {action!r} (approve, deny, reconcile)")
    if not callable(getattr(store, "load_run", None)) or not getattr(store, "keeps_runs", True):
        raise StoreError(f"{type(store).__name__} does not keep runs")
    owner = owner_token()
    store.claim(run_id, owner)
    try:
        stored = store.load_run(run_id)
        ctx = stored.ctx
        if ctx.get("state") != "review_required":
            raise ReviewError(
                f"run {run_id!r} is {ctx.get('state')}"
                f"{'/' + ctx['reason'] if ctx.get('reason') else ''}, "
                "not waiting for review"
            )
        placeholders: dict[str, int] = ctx.get("placeholders") or {}
        if call_id not in placeholders:
            raise ReviewError(
                f"call {call_id!r} is not pending in run {run_id!r} (pending: "
                f"{', '.join(placeholders) or 'none'})"
            )
        reviews: dict[str, Any] = ctx.setdefault("reviews", {})
        if call_id in reviews:
            done = {"approve": "approved", "deny": "denied", "reconcile": "reconciled"}
            raise ReviewError(
                f"call {call_id!r} of run {run_id!r} was already "
                f"{done.get(reviews[call_id]['action'], 'decided')}"
            )
        waiting = _error_of(stored.messages[placeholders[call_id]])
        if waiting not in _FITS[action]:
            fits = sorted(a for a, errors in _FITS.items() if waiting in errors)
            raise ReviewError(
                f"call {call_id!r} is waiting for {waiting or 'nothing'}: "
                f"{action} does not apply (use {' or '.join(fits)})"
            )
        call = _stored_call(ctx, call_id)
        event: dict[str, Any] = {
            "type": "review",
            "action": action,
            "call_id": call_id,
            "tool": call.name,
        }
        decision: dict[str, Any] = {"action": action}
        approvals: list[tuple[str, str, str]] = []
        if action == "approve":
            try:
                bound = digest(call.name, parse_arguments(call.raw_arguments))
            except ArgumentsError as exc:
                raise ReviewError(f"call {call_id!r} has unusable arguments: {exc}") from None
            event["digest"] = decision["digest"] = bound
            approvals.append((call_id, call.name, bound))
        elif action == "deny":
            event["reason"] = decision["reason"] = reason or "denied by review"
        else:
            try:
                json.dumps(result, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ReviewError(f"the reconciled result must be JSON data: {exc}") from None
            event["result"] = decision["result"] = result
        ctx["seq"] += 1
        event["seq"] = ctx["seq"]
        reviews[call_id] = decision
        store.save(run_id, owner, [event], Checkpoint(ctx, [], approvals))
        return event
    finally:
        store.release(run_id, owner)


def _stored_call(ctx: dict[str, Any], call_id: str) -> PreparedCall:
    decision = parse_decision(ctx.get("decision") or {})
    for call in decision.calls:
        if call.id == call_id:
            return call
    raise ReviewError(f"call {call_id!r} is not part of the paused batch")
