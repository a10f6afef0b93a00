"""The words behind each stop reason: ``RunResult.detail`` and the trace's ``detail``.

One function per reason, read from the run's context at the moment it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsm_agent.core.loop import Run

__all__ = ["stop_detail"]


def stop_detail(run: Run) -> str:
    """Why ``run`` stopped, in words, for its ``reason``."""
    reason, b, c, d = run.reason, run.budget, run.counters, run.decision
    details: dict[str | None, Callable[[], str]] = {
        "final_answer": lambda: "",
        "model_error": lambda: run.model_error,
        "malformed_decision": lambda: d.malformed or "",
        "empty_answer": lambda: "the reply has neither tool calls nor text",
        "missing_tool_call_id": lambda: d.missing_id or "",
        "duplicate_tool_call_id": lambda: d.duplicate_id or "",
        "tool_rounds": lambda: f"{c.tool_rounds} of {b.max_tool_rounds} tool rounds used",
        "calls_per_round": lambda: (
            f"{len(d.calls)} calls in one round; the limit is {b.max_calls_per_round}"
        ),
        "total_calls": lambda: (
            f"{c.tool_calls} calls made, {len(d.calls)} more asked; the "
            f"limit is {b.max_total_calls}"
        ),
        "model_calls": lambda: f"{c.model_calls} of {b.max_model_calls} model calls used",
        "tokens": lambda: f"{c.tokens} tokens used; the limit is {b.max_tokens}",
        "cost": lambda: (
            "a reply could not be priced"
            if run.cost_unknown
            else f"cost {c.cost:g} is past the limit {b.max_cost}"
        ),
        "wall_clock": lambda: (
            f"{run.now - run.started:.3f}s elapsed; the limit is {b.max_wall_clock_s}s"
        ),
        "tool_output": lambda: (
            f"{c.output_bytes} bytes of tool output; the limit is {b.max_output_bytes}"
        ),
        "approval_required": lambda: (
            ", ".join(f"{x.id} ({x.name})" for x in d.calls if x.needs_approval) + " need approval"
        ),
        "idempotency_conflict": lambda: (
            f"key {run.call.idempotency_key!r} of {run.call.name!r} was used with other arguments"
        ),
        "outcome_unknown": lambda: (
            f"{run.call.name!r} ({run.call.id}) may have taken effect: "
            + {
                "tool_returned": run.outcome.error,
                "cancel": "the run was cancelled while it ran",
                "resume": "the process stopped while it was running",
            }.get(
                run.taken.trigger,
                f"an earlier write under key {run.call.idempotency_key!r} never reported",
            )
        ),
        "cancelled": lambda: f"cancelled by the caller in {run.taken.source}",
    }
    for kind in ("unknown_tool", "permission_denied", "invalid_arguments"):
        details[kind] = lambda kind=kind: "; ".join(  # type: ignore[misc]
            f"{x.id}: {x.refusal_detail}" for x in d.calls if x.refusal == kind
        )
    return details.get(reason, lambda: "")()
