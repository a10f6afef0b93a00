"""The recipes: one scripted scenario per transition of the table (see ``scenarios``).

Each recipe registers fault tools on a fresh kit and returns one script of decisions per
run; the decorator names the edge it aims at and the runtime options it needs. Recipes
for edges another part of the engine adds (``resume``) register only once the table has
them and ``Runtime`` can drive them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent.core.budget import Budget, RetryPolicy
from fsm_agent.models.scripted import Step
from fsm_agent.runtime.result import RunResult
from fsm_agent.runtime.runtime import Runtime
from fsm_agent.testing.decisions import answer, call, decide
from fsm_agent.testing.faults import KEY_SCHEMA, FaultyTools
from fsm_agent.testing.scenarios import TICKET_SCHEMA, recipe

__all__: list[str] = []


def _lookup(key: str = "A17", **kw: Any) -> dict[str, Any]:
    return call("lookup", {"key": key}, **kw)


def _ticket(key: str = "R-1", title: str = "refund", **kw: Any) -> dict[str, Any]:
    return call("create_ticket", {"key": key, "title": title}, **kw)


def _kit(
    kit: FaultyTools,
    *,
    lookup: Sequence[str] = (),
    ticket: Sequence[str] = (),
    **ticket_options: Any,
) -> None:
    kit.read("lookup", faults=lookup, timeout_s=10.0, schema=KEY_SCHEMA)
    kit.write("create_ticket", faults=ticket, schema=TICKET_SCHEMA, **ticket_options)


# ── deciding ────────────────────────────────────────────────────────────────────────


@recipe(
    "model_replied",
    "deciding",
    "budget_exhausted",
    ("tokens_spent",),
    options={"budget": Budget(max_tokens=10)},
)
def _tokens_spent(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("A long answer.", usage={"prompt_tokens": 40, "completion_tokens": 9})]]


@recipe(
    "model_replied",
    "deciding",
    "budget_exhausted",
    ("cost_spent",),
    options={"budget": Budget(max_cost=0.01)},
)
def _cost_spent(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("An expensive answer.", usage={"total_tokens": 5, "cost": 0.5})]]


@recipe("model_failed", "deciding", "protocol_error")
def _model_failed(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[ConnectionError("the model endpoint is down")]]


# ── validating ──────────────────────────────────────────────────────────────────────


@recipe("validate", "validating", "protocol_error", ("decision_malformed",))
def _malformed_decision(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[{"role": "user", "content": "I am not an assistant message"}]]


@recipe("validate", "validating", "done", ("!has_tool_calls", "has_answer"))
def _final_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("Order A17 is in transit.")]]


@recipe("validate", "validating", "protocol_error", ("!has_tool_calls",))
def _empty_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[{"role": "assistant", "content": "  "}]]


@recipe("validate", "validating", "protocol_error", ("call_id_missing",))
def _missing_id(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), _lookup(no_id=True))]]


@recipe("validate", "validating", "protocol_error", ("call_id_duplicate",))
def _duplicate_id(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1", id="x"), _lookup("A2", id="x"))]]


@recipe(
    "validate",
    "validating",
    "budget_exhausted",
    ("tool_rounds_spent",),
    options={"budget": Budget(max_tool_rounds=1)},
)
def _tool_rounds(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1")), decide(_lookup("A2"))]]


@recipe(
    "validate",
    "validating",
    "budget_exhausted",
    ("round_too_large",),
    options={"budget": Budget(max_calls_per_round=1)},
)
def _calls_per_round(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2"))]]


@recipe(
    "validate",
    "validating",
    "budget_exhausted",
    ("total_calls_spent",),
    options={"budget": Budget(max_total_calls=2)},
)
def _total_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2")), decide(_lookup("A3"))]]


@recipe(
    "validate",
    "validating",
    "protocol_error",
    ("strict_policy", "batch_has_unknown_tool"),
    options={"policy": "strict"},
)
def _strict_unknown_tool(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("delete_everything", {}))]]


@recipe(
    "validate",
    "validating",
    "protocol_error",
    ("strict_policy", "batch_has_denied_call"),
    options={"policy": "strict"},
    allowed_tools=["lookup"],
)
def _strict_denied(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_ticket())]]


@recipe(
    "validate",
    "validating",
    "protocol_error",
    ("strict_policy", "batch_has_invalid_arguments"),
    options={"policy": "strict"},
)
def _strict_invalid_arguments(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("lookup", '{"key": "A1", "key": "A2"}'))]]


@recipe("validate", "validating", "review_required", ("batch_needs_approval",))
def _approval_required(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_lookup(), _ticket(title="approved: true"))]]


@recipe("validate", "validating", "executing")
def _read_then_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), answer("A17 is in transit.")]]


# ── executing: dispatch ─────────────────────────────────────────────────────────────


@recipe("dispatch", "executing", "observing", ("!call_admitted",))
def _refusal_as_observation(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("lookup", {"key": 17})), answer("Sorry, I used a wrong argument.")]]


@recipe(
    "dispatch",
    "executing",
    "budget_exhausted",
    ("wall_clock_spent",),
    options={"budget": Budget(max_wall_clock_s=5.0)},
)
def _wall_clock_before_call(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)

    def slow_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
        kit.clock.advance(6.0)  # the model took longer than the whole budget
        return decide(_lookup())

    return [[slow_model]]


@recipe("dispatch", "executing", "review_required", ("idempotency_conflict",))
def _idempotency_conflict(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True)
    return [[decide(_ticket(title="refund")), decide(_ticket(title="refund twice"))]]


@recipe("dispatch", "executing", "review_required", ("idempotency_pending",))
def _write_pending_from_earlier_run(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True, ticket=["error_after_effect"])
    return [[decide(_ticket())], [decide(_ticket())]]


@recipe("dispatch", "executing", "observing", ("idempotent_replay",))
def _idempotent_replay(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True)
    return [[decide(_ticket()), decide(_ticket()), answer("Ticket R-1 exists.")]]


# ── executing: the tool returned ───────────────────────────────────────────────────


@recipe("tool_returned", "executing", "observing", ("call_rejected",))
def _write_rejected(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["rejected"])
    return [[decide(_ticket()), answer("The ticket system refused; nothing was created.")]]


@recipe(
    "tool_returned",
    "executing",
    "retry_wait",
    ("is_retryable", "attempts_left", "retry_fits_deadline"),
)
def _transient_read_retried(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["transient"])
    return [[decide(_lookup()), answer("A17 is in transit.")]]


@recipe("tool_returned", "executing", "review_required", ("is_write",))
def _write_outcome_unknown(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["error_after_effect"])
    return [[decide(_ticket(), _lookup())]]


@recipe(
    "tool_returned", "executing", "observing", (), options={"retry": RetryPolicy(max_attempts=1)}
)
def _read_failed_for_good(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["error"])
    return [[decide(_lookup()), answer("The order service is failing.")]]


# ── observing ───────────────────────────────────────────────────────────────────────


@recipe(
    "observe",
    "observing",
    "budget_exhausted",
    ("output_budget_spent",),
    options={"budget": Budget(max_output_bytes=1000)},
)
def _oversized_output(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["oversized"])
    return [[decide(_lookup(), _lookup("A18"))]]


@recipe("observe", "observing", "executing", ("batch_has_more_calls",))
def _two_calls_one_batch(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2")), answer("Both are in transit.")]]


@recipe(
    "observe",
    "observing",
    "budget_exhausted",
    ("model_calls_spent",),
    options={"budget": Budget(max_model_calls=1)},
)
def _model_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), answer("never asked")]]


@recipe(
    "observe",
    "observing",
    "budget_exhausted",
    ("wall_clock_spent",),
    options={"budget": Budget(max_wall_clock_s=5.0)},
)
def _read_timeout_spends_clock(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["timeout"])
    return [[decide(_lookup()), answer("never asked")]]


@recipe("observe", "observing", "deciding")
def _observe_then_decide(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), decide(_lookup("A18")), answer("Both are in transit.")]]


# ── cancel: Ctrl-C wherever the run is ─────────────────────────────────────────────


@recipe("cancel", "deciding", "cancelled")
def _cancel_while_deciding(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), KeyboardInterrupt()]]


@recipe("cancel", "validating", "cancelled")
def _cancel_while_validating(kit: FaultyTools) -> list[list[Step]]:
    kit.write("create_ticket", schema=TICKET_SCHEMA, interrupt_key=True)
    return [[decide(_ticket())]]


@recipe("cancel", "executing", "review_required", ("write_in_flight",))
def _cancel_write_in_flight(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["interrupt_after_effect"])
    return [[decide(_ticket(), _lookup())]]


@recipe("cancel", "executing", "cancelled")
def _cancel_read_in_flight(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["interrupt"])
    return [[decide(_lookup(), _lookup("A18"))]]


@recipe("cancel", "retry_wait", "cancelled", cancel_on_entering="retry_wait")
def _cancel_during_backoff(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["transient"])
    return [[decide(_lookup()), answer("never asked")]]


@recipe("cancel", "observing", "cancelled", cancel_on_entering="observing")
def _cancel_while_observing(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), _lookup("A18")), answer("never asked")]]


# ── resume: durable runs picked up again (registered when the table has these edges) ──


def _resume(runtime: Runtime, run_id: str) -> list[RunResult]:
    resume: Callable[[str], RunResult] = getattr(runtime, "resume")  # noqa: B009
    return [resume(run_id)]


def _approve_c1(runtime: Runtime, run_id: str) -> list[RunResult]:
    approve: Callable[[str, str], RunResult] = getattr(runtime, "approve")  # noqa: B009
    return [approve(run_id, "c1")]


_DURABLE = hasattr(Runtime, "resume") and hasattr(Runtime, "approve")


@recipe(
    "resume",
    "executing",
    "review_required",
    ("write_outcome_lost",),
    if_in_table=True,
    needs=_DURABLE,
    die_at="tool_returned",
    review=_resume,
)
def _resume_after_death_mid_write(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_ticket(), _lookup()), answer("never asked")]]


@recipe(
    "resume",
    "executing",
    "observing",
    ("write_result_stored",),
    if_in_table=True,
    needs=_DURABLE,
    die_at="tool_returned",
    review=_resume,
)
def _resume_after_death_with_result_stored(kit: FaultyTools) -> list[list[Step]]:
    # The keyed write's result reached the idempotency record before the process died:
    # resumed, the stored result answers the call and nothing runs twice.
    _kit(kit, idempotent=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


@recipe(
    "resume",
    "executing",
    "executing",
    (),
    if_in_table=True,
    needs=_DURABLE,
    die_before_commit=True,
    review=_resume,
)
def _resume_dedup_write_dispatched_again(kit: FaultyTools) -> list[list[Step]]:
    # The downstream deduplicates by key, so a write whose end was lost may be sent again.
    _kit(kit, dedup=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


@recipe(
    "resume",
    "review_required",
    "observing",
    (),
    if_in_table=True,
    needs=_DURABLE,
    review=_approve_c1,
)
def _approve_then_resume(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]
