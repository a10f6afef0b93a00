"""Guards: small named predicates of a run's context.

A guard reads the run (its decision, current call, counters, budget, the time the shell
stamped before firing) and never does I/O, so the same machine serves ``run()`` and
``arun()``. The machine records each outcome in ``run.guard_log`` as it checks an edge;
the trace event of the transition carries that log, so a trace shows why an edge was
taken.

The machine table names guards as strings; :data:`GUARDS` maps each name to its function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm_agent.core.loop import Run

__all__ = ["GUARDS"]

#: name -> predicate(run).
GUARDS: dict[str, Callable[[Any], bool]] = {}


def guard(fn: Callable[[Run], bool]) -> Callable[[Run], bool]:
    GUARDS[fn.__name__] = fn
    return fn


# ── the model's reply ─────────────────────────────────────────────────────────────


@guard
def tokens_spent(run: Run) -> bool:
    """The replies so far used more tokens than ``max_tokens``."""
    limit = run.budget.max_tokens
    return limit is not None and run.counters.tokens > limit


@guard
def cost_spent(run: Run) -> bool:
    """Cost is past ``max_cost``, or a reply could not be priced while a cost limit is set."""
    limit = run.budget.max_cost
    return limit is not None and (run.cost_unknown or run.counters.cost > limit)


# ── the decision and its whole batch ──────────────────────────────────────────────


@guard
def decision_malformed(run: Run) -> bool:
    """The decision is not an assistant message whose calls are well-formed."""
    return run.decision.malformed is not None


@guard
def has_tool_calls(run: Run) -> bool:
    """The decision asks for at least one tool call."""
    return bool(run.decision.calls)


@guard
def has_answer(run: Run) -> bool:
    """The decision carries a non-empty text answer."""
    return bool(run.decision.answer and run.decision.answer.strip())


@guard
def call_id_missing(run: Run) -> bool:
    """Some call of the batch has no id or an empty one."""
    return run.decision.missing_id is not None


@guard
def call_id_duplicate(run: Run) -> bool:
    """Two calls of the batch share an id."""
    return run.decision.duplicate_id is not None


@guard
def tool_rounds_spent(run: Run) -> bool:
    """Every permitted tool round has been used."""
    return run.counters.tool_rounds >= run.budget.max_tool_rounds


@guard
def round_too_large(run: Run) -> bool:
    """The batch has more calls than ``max_calls_per_round``."""
    return len(run.decision.calls) > run.budget.max_calls_per_round


@guard
def total_calls_spent(run: Run) -> bool:
    """Running this batch would take the run past ``max_total_calls``."""
    return run.counters.tool_calls + len(run.decision.calls) > run.budget.max_total_calls


@guard
def strict_policy(run: Run) -> bool:
    """The run uses the ``strict`` policy (refusals stop the run)."""
    return run.policy == "strict"


@guard
def batch_has_unknown_tool(run: Run) -> bool:
    """Some call names a tool that is not registered."""
    return any(c.refusal == "unknown_tool" for c in run.decision.calls)


@guard
def batch_has_denied_call(run: Run) -> bool:
    """Some call names a registered tool outside ``allowed_tools``."""
    return any(c.refusal == "permission_denied" for c in run.decision.calls)


@guard
def batch_has_invalid_arguments(run: Run) -> bool:
    """Some call's arguments fail parsing or its tool's schema."""
    return any(c.refusal == "invalid_arguments" for c in run.decision.calls)


@guard
def batch_needs_approval(run: Run) -> bool:
    """Some admitted call needs an approval that no configured approval matches exactly."""
    return any(c.needs_approval for c in run.decision.calls)


# ── the current call, before it runs ──────────────────────────────────────────────


@guard
def call_admitted(run: Run) -> bool:
    """The current call names an allowed tool and its arguments are valid."""
    return run.call.refusal is None


@guard
def wall_clock_spent(run: Run) -> bool:
    """The wall-clock budget is used up (time stamped by the shell before firing)."""
    limit = run.budget.max_wall_clock_s
    return limit is not None and run.now - run.started >= limit


@guard
def idempotency_conflict(run: Run) -> bool:
    """The call's idempotency key is stored with different arguments."""
    record = run.call.record
    return record is not None and record.args_digest != run.call.args_digest


@guard
def idempotency_pending(run: Run) -> bool:
    """An earlier write under this key never reported back, and the tool does not dedupe."""
    record = run.call.record
    return (
        record is not None
        and record.status == "pending"
        and record.owner != (run.run_id, run.call.id)
        and not run.call.tool_dedup
    )


@guard
def idempotent_replay(run: Run) -> bool:
    """The call's key and arguments match a committed write: replay its result."""
    record = run.call.record
    return record is not None and record.status == "committed"


@guard
def write_outcome_lost(run: Run) -> bool:
    """The process died while this write (without downstream dedup) was running, and no
    committed result under its idempotency key says how it ended."""
    call = run.call
    if call.effect != "write" or call.tool_dedup:
        return False
    if call.idempotency_key is None:
        return True
    # No record: the intent is written before the tool runs, so it never started.
    return call.record is not None and call.record.status == "pending"


@guard
def write_result_stored(run: Run) -> bool:
    """This very call's write committed its result under its key before the process died."""
    record = run.call.record
    return (
        record is not None
        and record.status == "committed"
        and record.owner == (run.run_id, run.call.id)
    )


# ── the current call, after its tool returned ─────────────────────────────────────


@guard
def call_succeeded(run: Run) -> bool:
    """The tool returned a value."""
    return run.outcome.kind == "ok"


@guard
def call_rejected(run: Run) -> bool:
    """The tool raised ``ToolRejected``: definitely nothing happened."""
    return run.outcome.kind == "rejected"


@guard
def is_retryable(run: Run) -> bool:
    """A transient failure or timeout of a read tool, or of a write that declares dedup."""
    return run.outcome.kind in ("transient", "timeout") and (
        run.call.effect == "read" or run.call.tool_dedup
    )


@guard
def attempts_left(run: Run) -> bool:
    """Fewer attempts than ``RetryPolicy.max_attempts`` (first attempt included)."""
    return run.attempt < run.retry.max_attempts


@guard
def retry_fits_deadline(run: Run) -> bool:
    """The backoff before the next attempt ends inside the wall-clock budget."""
    limit = run.budget.max_wall_clock_s
    return limit is None or (run.now - run.started) + run.next_backoff() < limit


@guard
def write_in_flight(run: Run) -> bool:
    """A write tool was started and has not reported back."""
    return run.in_flight and run.call.effect == "write"


@guard
def is_write(run: Run) -> bool:
    """The current call's tool is declared ``write`` by its registrar."""
    return run.call.effect == "write"


# ── after a result is paired ──────────────────────────────────────────────────────


@guard
def output_budget_spent(run: Run) -> bool:
    """Tool output fed back so far exceeds ``max_output_bytes``."""
    limit = run.budget.max_output_bytes
    return limit is not None and run.counters.output_bytes > limit


@guard
def batch_has_more_calls(run: Run) -> bool:
    """The accepted batch still has calls that have been neither dispatched nor answered."""
    calls, answered, nxt = run.decision.calls, run.answered, run.index + 1
    if nxt >= len(calls):
        return False
    # After a review, later calls may already be answered (denied, reconciled).
    return calls[nxt].id not in answered or any(c.id not in answered for c in calls[nxt:])


@guard
def model_calls_spent(run: Run) -> bool:
    """Every permitted model call has been made (a final answer counts as one)."""
    return run.counters.model_calls >= run.budget.max_model_calls
