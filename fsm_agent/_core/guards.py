"""Guards: small named predicates of a run's state.

A guard reads the :class:`~fsm_agent._core.state.RunState` (its decision, current call,
counters, the caller's config, the time the loop read before firing) and never does I/O,
so the same machine serves ``run()`` and ``arun()``. The engine evaluates them in table
order, each only as far as the choice of edge needs, and records each outcome in
``state.guard_log``; the trace event of the transition carries that log, so a trace shows
why an edge was taken.

The machine table names guards as strings; :data:`GUARDS` maps each name to its function.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

from fsm_agent._core.actions import FITS
from fsm_agent._core.state import RunState

__all__ = ["GUARDS", "Guard", "GuardNames", "guard_of", "is_rule_guard"]

Guard = Callable[[RunState], bool]


_RULE = "rule:"


def guard_of(name: str) -> Guard:
    """The guard named ``name``: one of :data:`GUARDS`, or ``rule:<id>`` for any id (the
    user's rule ``id`` decided the judgement the edge acts on: ``core/judging.py``, whose
    rows name it). :data:`GUARDS` stays a plain dict, so the hot path's lookup does too:
    the engine asks this only for a name the dict has not."""
    found = GUARDS.get(name)
    if found is not None:
        return found
    if not is_rule_guard(name):
        raise KeyError(name)
    rule_id = name[len(_RULE) :]

    def decided(run: RunState) -> bool:
        return rule_id in run.ruled

    decided.__doc__ = f"The rule {rule_id!r} decided the judgement this edge acts on."
    return decided


def is_rule_guard(name: object) -> bool:
    return isinstance(name, str) and name.startswith(_RULE) and len(name) > len(_RULE)


class GuardNames(Collection[str]):
    """Every name a table may use as a guard (what ``check_table`` is given)."""

    def __contains__(self, name: object) -> bool:
        return name in GUARDS or is_rule_guard(name)

    def __iter__(self) -> Iterator[str]:
        return iter(GUARDS)

    def __len__(self) -> int:
        return len(GUARDS)


#: name -> predicate(state).
GUARDS: dict[str, Guard] = {}


def guard(fn: Guard) -> Guard:
    GUARDS[fn.__name__] = fn
    return fn


# ── the model's reply ─────────────────────────────────────────────────────────────


@guard
def reply_too_large(run: RunState) -> bool:
    """The reply just received is larger than ``max_reply_bytes`` (its JSON text)."""
    return run.reply_bytes > run.config.budget.max_reply_bytes


@guard
def usage_unknown(run: RunState) -> bool:
    """A reply reported no token usage (a stream without its usage event, a model that
    returns none) while a token or cost budget is set: what it spent is unknown, and an
    unknown spend is never counted as zero."""
    budget = run.config.budget
    return run.tokens_unknown and (budget.max_tokens is not None or budget.max_cost is not None)


@guard
def tokens_spent(run: RunState) -> bool:
    """The replies so far used more tokens than ``max_tokens``, or one reported no token
    count while that limit is set (an unmetered reply is never counted as free)."""
    limit = run.config.budget.max_tokens
    return limit is not None and (run.tokens_unknown or run.counters.tokens > limit)


@guard
def cost_spent(run: RunState) -> bool:
    """Cost is past ``max_cost``, or a reply could not be priced while that limit is set."""
    limit = run.config.budget.max_cost
    return limit is not None and (run.cost_unknown or run.counters.cost > limit)


# ── the decision and its whole batch ──────────────────────────────────────────────


def _any_refused(run: RunState, refusal: str) -> bool:
    # A loop, not ``any(genexpr)``: these guards run every round, and a generator
    # costs more than the one or two calls a batch usually holds.
    for c in run.decision.calls:  # noqa: SIM110 - the hot path (see above)
        if c.refusal == refusal:
            return True
    return False


@guard
def decision_malformed(run: RunState) -> bool:
    """The decision is not an assistant message whose calls are well-formed."""
    return run.decision.malformed is not None


@guard
def has_tool_calls(run: RunState) -> bool:
    """The decision asks for at least one tool call."""
    return bool(run.decision.calls)


@guard
def has_answer(run: RunState) -> bool:
    """The decision carries a non-empty text answer."""
    return bool(run.decision.answer and run.decision.answer.strip())


@guard
def call_id_missing(run: RunState) -> bool:
    """Some call of the batch has no id or an empty one."""
    return run.decision.missing_id is not None


@guard
def call_id_duplicate(run: RunState) -> bool:
    """Two calls of the batch share an id."""
    return run.decision.duplicate_id is not None


@guard
def tool_rounds_spent(run: RunState) -> bool:
    """Every permitted tool round has been used."""
    return run.counters.tool_rounds >= run.config.budget.max_tool_rounds


@guard
def round_too_large(run: RunState) -> bool:
    """The batch has more calls than ``max_calls_per_round``."""
    return len(run.decision.calls) > run.config.budget.max_calls_per_round


@guard
def total_calls_spent(run: RunState) -> bool:
    """Running this batch would take the run past ``max_total_calls``."""
    return run.counters.tool_calls + len(run.decision.calls) > run.config.budget.max_total_calls


@guard
def strict_policy(run: RunState) -> bool:
    """The run uses the ``strict`` policy (refusals stop the run)."""
    return run.config.policy == "strict"


@guard
def batch_has_unknown_tool(run: RunState) -> bool:
    """Some call names a tool that is not registered."""
    return _any_refused(run, "unknown_tool")


@guard
def batch_has_denied_call(run: RunState) -> bool:
    """Some call names a registered tool outside ``allowed_tools``."""
    return _any_refused(run, "permission_denied")


@guard
def batch_has_invalid_arguments(run: RunState) -> bool:
    """Some call's arguments fail parsing or its tool's schema."""
    return _any_refused(run, "invalid_arguments")


@guard
def batch_needs_approval(run: RunState) -> bool:
    """Some admitted call needs an approval that no configured approval matches exactly."""
    for c in run.decision.calls:  # noqa: SIM110 - every round: no generator (_any_refused)
        if c.needs_approval:
            return True
    return False


# ── the current call, before it runs ──────────────────────────────────────────────


@guard
def call_admitted(run: RunState) -> bool:
    """The current call names an allowed tool and its arguments are valid."""
    return run.call.refusal is None


@guard
def wall_clock_spent(run: RunState) -> bool:
    """The wall-clock budget is used up (time stamped by the shell before firing)."""
    limit = run.config.budget.max_wall_clock_s
    return limit is not None and run.now - run.started >= limit


# ``call.record`` is what the store held under the call's key when its intent was begun
# (an atomic compare-and-set, R11), if that record kept this call from owning the intent.


@guard
def idempotency_conflict(run: RunState) -> bool:
    """The call's idempotency key is held with different arguments."""
    record = run.call.record
    return record is not None and record.args_digest != run.call.args_digest


@guard
def idempotency_pending(run: RunState) -> bool:
    """Another write under this key has not reported back (and this tool does not dedupe,
    or it would have taken the intent over)."""
    record = run.call.record
    return record is not None and record.status == "pending"


@guard
def idempotent_replay(run: RunState) -> bool:
    """The call's key and arguments match a committed write: replay its result."""
    record = run.call.record
    return record is not None and record.status == "committed"


@guard
def approval_refused(run: RunState) -> bool:
    """The store refused the call a use of its limited approval: every ``max_uses`` went
    to other calls (the ``ConsumeApproval`` answer, recorded as ``approval_use``)."""
    return run.call.needs_approval


@guard
def review_fits(run: RunState) -> bool:
    """The reviewer's decision (``review_request``) names a paused call not decided yet,
    with an action that settles what it waits for (``core/actions.py``'s ``FITS``)."""
    request = run.review_request
    if request is None:
        return False
    call_id = request.get("call_id")
    paused = run.placeholders.get(call_id) if isinstance(call_id, str) else None
    return (
        paused is not None
        and call_id not in run.reviews
        and paused[1] in FITS.get(str(request.get("action")), frozenset())
    )


@guard
def write_outcome_lost(run: RunState) -> bool:
    """The process died while this write (without downstream dedup) was running, and no
    committed result under its idempotency key says how it ended. Decided from the facts
    checkpointed with the attempt, not from today's registry (R11)."""
    call = run.call
    if call.effect != "write" or call.dedup:
        return False
    if call.idempotency_key is None:
        return True
    # No record: the intent is written before the tool runs, so it never started.
    return call.record is not None and call.record.status == "pending"


@guard
def write_result_stored(run: RunState) -> bool:
    """This very call's write committed its result under its key before the process died."""
    record = run.call.record
    return (
        record is not None
        and record.status == "committed"
        and record.owner == (run.run_id, run.call.id)
    )


# ── the current call, after its tool returned ─────────────────────────────────────


@guard
def call_not_started(run: RunState) -> bool:
    """The call was cancelled before its tool began (queued behind others): nothing ran."""
    return run.outcome.kind == "not_started"


@guard
def call_succeeded(run: RunState) -> bool:
    """The tool returned a value."""
    return run.outcome.kind == "ok"


@guard
def call_rejected(run: RunState) -> bool:
    """The tool raised ``ToolRejected``: definitely nothing happened."""
    return run.outcome.kind == "rejected"


@guard
def is_retryable(run: RunState) -> bool:
    """A transient failure or timeout of a read tool, or of a write that declares dedup."""
    return run.outcome.kind in ("transient", "timeout") and (
        run.call.effect == "read" or run.call.dedup
    )


@guard
def attempts_left(run: RunState) -> bool:
    """Fewer attempts than ``RetryPolicy.max_attempts`` (first attempt included)."""
    return run.attempt < run.config.retry.max_attempts


@guard
def retry_fits_deadline(run: RunState) -> bool:
    """The backoff before the next attempt ends inside the wall-clock budget."""
    limit = run.config.budget.max_wall_clock_s
    return limit is None or (run.now - run.started) + run.config.retry.backoff(run.attempt) < limit


@guard
def write_in_flight(run: RunState) -> bool:
    """A write tool was started and has not reported back."""
    return run.in_flight and run.call.effect == "write"


@guard
def is_write(run: RunState) -> bool:
    """The current call's tool is declared ``write`` by its registrar."""
    return run.call.effect == "write"


# ── after a result is paired ──────────────────────────────────────────────────────


@guard
def output_budget_spent(run: RunState) -> bool:
    """Tool output fed back so far exceeds ``max_output_bytes``."""
    limit = run.config.budget.max_output_bytes
    return limit is not None and run.counters.output_bytes > limit


@guard
def batch_has_more_calls(run: RunState) -> bool:
    """The accepted batch still has calls that have been neither dispatched nor answered."""
    calls, answered, nxt = run.decision.calls, run.answered, run.index + 1
    if nxt >= len(calls):
        return False
    # After a review, later calls may already be answered (denied, reconciled).
    return calls[nxt].id not in answered or any(c.id not in answered for c in calls[nxt:])


@guard
def model_calls_spent(run: RunState) -> bool:
    """Every permitted model call has been made (a final answer counts as one)."""
    return run.counters.model_calls >= run.config.budget.max_model_calls
