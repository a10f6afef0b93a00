"""Review of a paused run (D2): approve, deny or reconcile one call.

A decision is recorded in the store, as a ``review`` event in the run's trace and in its
checkpoint. Nothing runs here, so the CLI can record decisions without the run's model
or tools; the next resume applies them once every blocking call of the paused batch is
settled (``core/loop.py``). An approval authorises exactly that call id, once, for the
arguments it was paused with (R8).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm_agent.core.actions import BLOCKING
from fsm_agent.core.approvals import ApprovalBook
from fsm_agent.core.review import FITS, decide
from fsm_agent.core.state import RunConfig, RunState
from fsm_agent.core.table import DEFAULT_MACHINE, Machine
from fsm_agent.durable import owners
from fsm_agent.durable.resume import restore_state
from fsm_agent.durable.store import Checkpoint, StoredRun, supports_runs
from fsm_agent.errors import ConfigError, ReviewError, StoreError
from fsm_agent.trace.chain import continue_chain, trace_key

__all__ = ["BLOCKING", "pending_calls", "record_review"]


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
    key: bytes | str | None = None,
    machines: Mapping[str, Machine] | None = None,
) -> dict[str, Any]:
    """Record a reviewer's decision on a paused call; returns the ``review`` event.
    ``machines``: the machines the runtime knows, by hash (see ``paused_state``).

    ``key``: the runtime's ``trace_key``, needed to append to a signed trace (a store
    that keeps trace lines gets the review event chained onto the run's last link).
    Anything that does not fit raises :class:`ReviewError` and changes nothing.
    """
    if action not in FITS:
        raise ReviewError(f"unknown review action {action!r} (approve, deny, reconcile)")
    if not supports_runs(store):
        raise StoreError(f"{type(store).__name__} does not keep runs")
    owner = owners.new_owner()
    owners.hold(owner)
    store.claim(run_id, owner)
    try:
        stored = store.load_run(run_id)
        s = paused_state(stored, machines)
        event = decide(s, call_id, action, reason, result)
        s.seq += 1
        event["seq"] = s.seq
        lines = None
        if getattr(store, "wants_lines", False) and stored.events:
            try:
                encoder = continue_chain(
                    run_id, stored.events[0], stored.events[-2:], trace_key(key), 1
                )
            except ConfigError as exc:
                raise ReviewError(str(exc)) from None
            lines = None if encoder is None else encoder.lines([event])
        s.events.append(event)
        store.save(run_id, owner, [event], Checkpoint(s.snapshot(), [], lines))
        return event
    finally:
        owners.let_go(store, run_id, owner)
