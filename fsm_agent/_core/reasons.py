"""The words behind each stop reason: ``RunResult.detail`` and the trace's ``detail``.

One entry per reason, read from the run's state at the moment it stopped.
"""

from __future__ import annotations

from collections.abc import Callable

from fsm_agent._core.state import RunState

__all__ = ["stop_detail"]


def _refusals(kind: str) -> Callable[[RunState], str]:
    def detail(s: RunState) -> str:
        return "; ".join(
            f"{c.id}: {c.refusal_detail}" for c in s.decision.calls if c.refusal == kind
        )

    return detail


def _tokens(s: RunState) -> str:
    limit = s.config.budget.max_tokens
    if s.tokens_unknown:
        return f"a reply reported no token usage while max_tokens={limit} is set"
    return f"{s.counters.tokens} tokens used; the limit is {limit}"


def _usage_unknown(s: RunState) -> str:
    b = s.config.budget
    limits = [f"{n}={v}" for n, v in (("max_tokens", b.max_tokens), ("max_cost", b.max_cost))
              if v is not None]  # fmt: skip
    return (
        f"a reply reported no token usage while {' and '.join(limits)} "
        f"{'is' if len(limits) == 1 else 'are'} set: what it spent is unknown, not zero"
    )


def _approval_required(calls: list[str]) -> str:
    return ", ".join(calls) + (" needs approval" if len(calls) == 1 else " need approval")


def _cost(s: RunState) -> str:
    limit = s.config.budget.max_cost
    if s.cost_unknown:
        return f"a reply could not be priced (no usage or no price) while max_cost={limit} is set"
    return f"cost {s.counters.cost:g} is past the limit {limit}"


def _outcome_unknown(s: RunState) -> str:
    call = s.call
    why = {
        "tool_returned": s.outcome.error,
        "cancel": "the run was cancelled while it ran",
        "resume": "the process stopped while it was running",
    }.get(s.taken.trigger, f"an earlier write under key {call.idempotency_key!r} never reported")
    return f"{call.name!r} ({call.id}) may have taken effect: {why}"


_DETAILS: dict[str, Callable[[RunState], str]] = {
    "final_answer": lambda s: "",
    "model_error": lambda s: s.model_error,
    "malformed_decision": lambda s: s.decision.malformed or "",
    "empty_answer": lambda s: "the reply has neither tool calls nor text",
    "missing_tool_call_id": lambda s: s.decision.missing_id or "",
    "duplicate_tool_call_id": lambda s: s.decision.duplicate_id or "",
    "tool_rounds": lambda s: (
        f"{s.counters.tool_rounds} of {s.config.budget.max_tool_rounds} tool rounds used"
    ),
    "calls_per_round": lambda s: (
        f"{len(s.decision.calls)} calls in one round; the limit is "
        f"{s.config.budget.max_calls_per_round}"
    ),
    "total_calls": lambda s: (
        f"{s.counters.tool_calls} calls made, {len(s.decision.calls)} more asked; the limit "
        f"is {s.config.budget.max_total_calls}"
    ),
    "model_calls": lambda s: (
        f"{s.counters.model_calls} of {s.config.budget.max_model_calls} model calls used"
    ),
    "tokens": _tokens,
    "usage_unknown": _usage_unknown,
    "cost": _cost,
    "wall_clock": lambda s: (
        f"{s.now - s.started:.3f}s elapsed; the limit is {s.config.budget.max_wall_clock_s}s"
    ),
    "reply_size": lambda s: (
        f"a reply of {s.reply_bytes} bytes; the limit is {s.config.budget.max_reply_bytes}"
    ),
    "tool_output": lambda s: (
        f"{s.counters.output_bytes} bytes of tool output; the limit is "
        f"{s.config.budget.max_output_bytes}"
    ),
    "approval_required": lambda s: _approval_required(
        [f"{c.id} ({c.name})" for c in s.decision.calls if c.needs_approval]
    ),
    "idempotency_conflict": lambda s: (
        f"key {s.call.idempotency_key!r} of {s.call.name!r} was used with other arguments"
    ),
    "outcome_unknown": _outcome_unknown,
    "cancelled": lambda s: f"cancelled by the caller in {s.taken.source}",
    "unknown_tool": _refusals("unknown_tool"),
    "permission_denied": _refusals("permission_denied"),
    "invalid_arguments": _refusals("invalid_arguments"),
    # The user's rules (core/judging.py): a refused call's words, or the judgement's.
    "denied_by_rule": lambda s: _refusals("denied_by_rule")(s) or s.rule_detail,
    "rule_limit": lambda s: _refusals("limit_reached")(s) or s.rule_detail,
    "rule_review": lambda s: s.rule_detail,
    "answer_rejected": lambda s: s.rule_detail,
}


def stop_detail(s: RunState) -> str:
    """Why the run stopped, in words, for its ``reason``."""
    detail = _DETAILS.get(s.reason or "")
    return detail(s) if detail is not None else ""
