"""Scripted scenarios that drive a run through each transition of the table.

A :class:`Scenario` is a recipe: it registers fault tools on a fresh kit and returns one
script of decisions per run (runs share the kit, its fake clock and one idempotency
store, so a scenario can crash a write in one run and retry it in the next), plus the
``Runtime`` options (budget, retry, policy, approvals) it needs.

Recipes name the edge they aim at, but which edges a scenario takes is found by running
it: :func:`scenario_for` prefers the recipe aimed at a transition and otherwise any
recipe observed to take it, and :func:`unbuildable` lists the transitions of the table
no recipe reaches. A transition added to the table without a recipe therefore shows up
there (and fails the engine's test suite) instead of being skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsm_agent.budget import Budget, RetryPolicy
from fsm_agent.machine import TRANSITIONS, Transition
from fsm_agent.models.scripted import ScriptedModel, Step
from fsm_agent.result import RunResult
from fsm_agent.run import TRANSITION_LISTENERS
from fsm_agent.runtime import Runtime
from fsm_agent.store import MemoryStore, Store
from fsm_agent.testing.decisions import answer, call, decide
from fsm_agent.testing.faults import FaultyTools

__all__ = ["ProcessDied", "Scenario", "ScenarioRun", "edge_key", "record_transitions",
           "run_through_interrupts", "scenario_for", "scenarios", "scripted_runtime",
           "stale_recipes", "unbuildable"]

EdgeKey = tuple[str, str, str, tuple[str, ...]]
Setup = Callable[[FaultyTools], list[list[Step]]]

#: A write tool's arguments: an idempotency key and a title that can differ under one key.
TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 64},
                   "title": {"type": "string", "maxLength": 200}},
    "required": ["key"],
}


def edge_key(t: Transition) -> EdgeKey:
    """What identifies an edge independently of its position: trigger, source, dest,
    guards."""
    return (t.trigger, t.source, t.dest, t.guards)


def scripted_runtime(kit: FaultyTools, script: Sequence[Step], *,
                     allowed_tools: Sequence[str] | None = None,
                     store: Store | None = None, **options: Any) -> Runtime:
    """A :class:`Runtime` over ``kit``'s tools and fake clock replaying ``script``.

    Every tool of the kit is allowed unless ``allowed_tools`` says otherwise; backoff
    sleeps move the fake clock instead of waiting.
    """
    return Runtime(model=ScriptedModel(list(script)), tools=kit.registry,
                   allowed_tools=kit.names() if allowed_tools is None else allowed_tools,
                   clock=kit.clock, sleep=kit.clock.sleep,
                   store=store if store is not None else MemoryStore(), **options)


@contextlib.contextmanager
def record_transitions() -> Iterator[list[Transition]]:
    """Collect every transition taken (by any run) inside the ``with`` block."""
    taken: list[Transition] = []

    def listener(run: Any, transition: Transition) -> None:
        taken.append(transition)

    TRANSITION_LISTENERS.append(listener)
    try:
        yield taken
    finally:
        TRANSITION_LISTENERS.remove(listener)


def run_through_interrupts(runtime: Runtime, task: str, *, run_id: str,
                           use_async: bool = False) -> tuple[RunResult, bool]:
    """``runtime.run(task)`` (or ``arun`` in a fresh event loop), and when the run is
    interrupted (``KeyboardInterrupt``: the run cancels itself, then re-raises) the
    result it had reached. Returns ``(result, interrupted)``."""
    runs: dict[str, Any] = {}

    def keep(run: Any, transition: Transition) -> None:
        runs[run.run_id] = run

    TRANSITION_LISTENERS.append(keep)
    try:
        if use_async:
            return asyncio.run(runtime.arun(task, run_id=run_id)), False
        return runtime.run(task, run_id=run_id), False
    except (KeyboardInterrupt, asyncio.CancelledError):
        run = runs.get(run_id)
        if run is None:
            raise
        return Runtime._result(run), True
    finally:
        TRANSITION_LISTENERS.remove(keep)


class ProcessDied(BaseException):
    """The process dying mid-run, as far as the engine can tell: nothing catches it
    (unlike ``KeyboardInterrupt``, which cancels the run cleanly)."""


#: What a trusted caller does with a run after it stopped or its process died
#: (``runtime.resume(run_id)``, ``runtime.approve(run_id, call_id)``, ...).
Review = Callable[[Runtime, str], list[RunResult]]


@dataclass
class ScenarioRun:
    """What running a scenario did: the results, its tools, and the edges taken."""

    scenario: Scenario
    kit: FaultyTools
    results: list[RunResult]
    taken: list[Transition]
    interrupted: list[bool] = field(default_factory=list)

    @property
    def result(self) -> RunResult:
        """The last run's result (the one the scenario is about)."""
        return self.results[-1]


@dataclass
class Scenario:
    """A recipe that drives runs through ``target`` (trigger, source, dest, guards).

    ``cancel_on_entering`` names a state: when a run enters it, the fake clock is armed
    to raise ``KeyboardInterrupt`` at its next reading (Ctrl-C in that state).
    ``die_at`` names a trigger: the process dies (:class:`ProcessDied`) the first time a
    run takes an edge of it, before that edge is saved; ``die_before_commit`` kills it
    after a keyed write ran, before its result reaches the idempotency record. ``review``
    then runs after each script's run, as the trusted caller who resumes or settles it.
    """

    name: str
    target: EdgeKey
    setup: Setup
    options: dict[str, Any] = field(default_factory=dict)
    allowed_tools: Sequence[str] | None = None
    task: str = "Please help with order A17."
    cancel_on_entering: str | None = None
    die_at: str | None = None
    die_before_commit: bool = False
    review: Review | None = None

    def run(self) -> ScenarioRun:
        kit = FaultyTools()
        scripts = self.setup(kit)
        store = MemoryStore()
        outcome = ScenarioRun(self, kit, [], [])
        died: list[str] = []
        if self.die_before_commit:
            commit = store.commit_idempotency

            def commit_or_die(tool: str, key: str, result: Any) -> None:
                if not died:
                    died.append(key)
                    raise ProcessDied(f"the process died before {tool!r} {key!r} was stored")
                commit(tool, key, result)

            store.commit_idempotency = commit_or_die  # type: ignore[method-assign]

        def faults(run: Any, transition: Transition) -> None:
            if transition.dest == self.cancel_on_entering:
                kit.clock.interrupt_next_read()
            if transition.trigger == self.die_at and not died:
                died.append(run.run_id)
                raise ProcessDied(f"the process died at {transition.label}")

        with record_transitions() as taken:
            # First in line: a transition the process died in is never saved, so no
            # other listener (recorder, coverage) should count it either.
            TRANSITION_LISTENERS.insert(0, faults)
            try:
                for n, script in enumerate(scripts, 1):
                    runtime = scripted_runtime(kit, script, allowed_tools=self.allowed_tools,
                                               store=store, **self.options)
                    run_id = f"{self.name}-{n}"
                    try:
                        result, interrupted = run_through_interrupts(
                            runtime, self.task, run_id=run_id)
                        outcome.results.append(result)
                        outcome.interrupted.append(interrupted)
                    except ProcessDied:
                        pass  # only what the store saved remains; ``review`` resumes it
                    for result in self.review(runtime, run_id) if self.review else ():
                        outcome.results.append(result)
                        outcome.interrupted.append(False)
            finally:
                TRANSITION_LISTENERS.remove(faults)
        outcome.taken = list(taken)
        return outcome


_RECIPES: list[Scenario] = []
_TABLE_KEYS = {edge_key(t) for t in TRANSITIONS}


def _recipe(trigger: str, source: str, dest: str, guards: tuple[str, ...] = (), *,
            if_in_table: bool = False, needs: bool = True,
            **scenario: Any) -> Callable[[Setup], Setup]:
    """Register a recipe aimed at an edge. ``if_in_table`` recipes are for edges that
    another part of the engine adds (durable runs): they register only once the table
    has their edge and ``needs`` (the API they drive) holds."""
    def register(setup: Setup) -> Setup:
        name = setup.__name__.strip("_")
        target = (trigger, source, dest, guards)
        if not if_in_table or (needs and target in _TABLE_KEYS):
            _RECIPES.append(Scenario(name, target, setup, **scenario))
        return setup
    return register


def _lookup(key: str = "A17", **kw: Any) -> dict[str, Any]:
    return call("lookup", {"key": key}, **kw)


def _ticket(key: str = "R-1", title: str = "refund", **kw: Any) -> dict[str, Any]:
    return call("create_ticket", {"key": key, "title": title}, **kw)


def _kit(kit: FaultyTools, *, lookup: Sequence[str] = (), ticket: Sequence[str] = (),
         **ticket_options: Any) -> None:
    kit.read("lookup", faults=lookup, timeout_s=10.0)
    kit.write("create_ticket", faults=ticket, schema=TICKET_SCHEMA, **ticket_options)


# ── deciding ────────────────────────────────────────────────────────────────────────

@_recipe("model_replied", "deciding", "budget_exhausted", ("tokens_spent",),
         options={"budget": Budget(max_tokens=10)})
def _tokens_spent(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("A long answer.", usage={"prompt_tokens": 40, "completion_tokens": 9})]]


@_recipe("model_replied", "deciding", "budget_exhausted", ("cost_spent",),
         options={"budget": Budget(max_cost=0.01)})
def _cost_spent(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("An expensive answer.", usage={"total_tokens": 5, "cost": 0.5})]]


@_recipe("model_failed", "deciding", "protocol_error")
def _model_failed(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[ConnectionError("the model endpoint is down")]]


# ── validating ──────────────────────────────────────────────────────────────────────

@_recipe("validate", "validating", "protocol_error", ("decision_malformed",))
def _malformed_decision(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[{"role": "user", "content": "I am not an assistant message"}]]


@_recipe("validate", "validating", "done", ("!has_tool_calls", "has_answer"))
def _final_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[answer("Order A17 is in transit.")]]


@_recipe("validate", "validating", "protocol_error", ("!has_tool_calls",))
def _empty_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[{"role": "assistant", "content": "  "}]]


@_recipe("validate", "validating", "protocol_error", ("call_id_missing",))
def _missing_id(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup(), _lookup(no_id=True))]]


@_recipe("validate", "validating", "protocol_error", ("call_id_duplicate",))
def _duplicate_id(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1", id="x"), _lookup("A2", id="x"))]]


@_recipe("validate", "validating", "budget_exhausted", ("tool_rounds_spent",),
         options={"budget": Budget(max_tool_rounds=1)})
def _tool_rounds(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1")), decide(_lookup("A2"))]]


@_recipe("validate", "validating", "budget_exhausted", ("round_too_large",),
         options={"budget": Budget(max_calls_per_round=1)})
def _calls_per_round(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2"))]]


@_recipe("validate", "validating", "budget_exhausted", ("total_calls_spent",),
         options={"budget": Budget(max_total_calls=2)})
def _total_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2")), decide(_lookup("A3"))]]


@_recipe("validate", "validating", "protocol_error", ("strict_policy", "batch_has_unknown_tool"),
         options={"policy": "strict"})
def _strict_unknown_tool(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("delete_everything", {}))]]


@_recipe("validate", "validating", "protocol_error", ("strict_policy", "batch_has_denied_call"),
         options={"policy": "strict"}, allowed_tools=["lookup"])
def _strict_denied(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_ticket())]]


@_recipe("validate", "validating", "protocol_error",
         ("strict_policy", "batch_has_invalid_arguments"), options={"policy": "strict"})
def _strict_invalid_arguments(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("lookup", '{"key": "A1", "key": "A2"}'))]]


@_recipe("validate", "validating", "review_required", ("batch_needs_approval",))
def _approval_required(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_lookup(), _ticket(title="approved: true"))]]


@_recipe("validate", "validating", "executing")
def _read_then_answer(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), answer("A17 is in transit.")]]


# ── executing: dispatch ─────────────────────────────────────────────────────────────

@_recipe("dispatch", "executing", "observing", ("!call_admitted",))
def _refusal_as_observation(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(call("lookup", {"key": 17})), answer("Sorry, I used a wrong argument.")]]


@_recipe("dispatch", "executing", "budget_exhausted", ("wall_clock_spent",),
         options={"budget": Budget(max_wall_clock_s=5.0)})
def _wall_clock_before_call(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)

    def slow_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
        kit.clock.advance(6.0)  # the model took longer than the whole budget
        return decide(_lookup())

    return [[slow_model]]


@_recipe("dispatch", "executing", "review_required", ("idempotency_conflict",))
def _idempotency_conflict(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True)
    return [[decide(_ticket(title="refund")), decide(_ticket(title="refund twice"))]]


@_recipe("dispatch", "executing", "review_required", ("idempotency_pending",))
def _write_pending_from_earlier_run(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True, ticket=["error_after_effect"])
    return [[decide(_ticket())], [decide(_ticket())]]


@_recipe("dispatch", "executing", "observing", ("idempotent_replay",))
def _idempotent_replay(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, idempotent=True)
    return [[decide(_ticket()), decide(_ticket()), answer("Ticket R-1 exists.")]]


# ── executing: the tool returned ───────────────────────────────────────────────────

@_recipe("tool_returned", "executing", "observing", ("call_rejected",))
def _write_rejected(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["rejected"])
    return [[decide(_ticket()), answer("The ticket system refused; nothing was created.")]]


@_recipe("tool_returned", "executing", "retry_wait",
         ("is_retryable", "attempts_left", "retry_fits_deadline"))
def _transient_read_retried(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["transient"])
    return [[decide(_lookup()), answer("A17 is in transit.")]]


@_recipe("tool_returned", "executing", "review_required", ("is_write",))
def _write_outcome_unknown(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["error_after_effect"])
    return [[decide(_ticket(), _lookup())]]


@_recipe("tool_returned", "executing", "observing", (),
         options={"retry": RetryPolicy(max_attempts=1)})
def _read_failed_for_good(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["error"])
    return [[decide(_lookup()), answer("The order service is failing.")]]


# ── observing ───────────────────────────────────────────────────────────────────────

@_recipe("observe", "observing", "budget_exhausted", ("output_budget_spent",),
         options={"budget": Budget(max_output_bytes=1000)})
def _oversized_output(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["oversized"])
    return [[decide(_lookup(), _lookup("A18"))]]


@_recipe("observe", "observing", "executing", ("batch_has_more_calls",))
def _two_calls_one_batch(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup("A1"), _lookup("A2")), answer("Both are in transit.")]]


@_recipe("observe", "observing", "budget_exhausted", ("model_calls_spent",),
         options={"budget": Budget(max_model_calls=1)})
def _model_calls(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), answer("never asked")]]


@_recipe("observe", "observing", "budget_exhausted", ("wall_clock_spent",),
         options={"budget": Budget(max_wall_clock_s=5.0)})
def _read_timeout_spends_clock(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["timeout"])
    return [[decide(_lookup()), answer("never asked")]]


@_recipe("observe", "observing", "deciding")
def _observe_then_decide(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), decide(_lookup("A18")), answer("Both are in transit.")]]


# ── cancel: Ctrl-C wherever the run is ─────────────────────────────────────────────

@_recipe("cancel", "deciding", "cancelled")
def _cancel_while_deciding(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_lookup()), KeyboardInterrupt()]]


@_recipe("cancel", "validating", "cancelled")
def _cancel_while_validating(kit: FaultyTools) -> list[list[Step]]:
    kit.write("create_ticket", schema=TICKET_SCHEMA, interrupt_key=True)
    return [[decide(_ticket())]]


@_recipe("cancel", "executing", "review_required", ("write_in_flight",))
def _cancel_write_in_flight(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, ticket=["interrupt_after_effect"])
    return [[decide(_ticket(), _lookup())]]


@_recipe("cancel", "executing", "cancelled")
def _cancel_read_in_flight(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["interrupt"])
    return [[decide(_lookup(), _lookup("A18"))]]


@_recipe("cancel", "retry_wait", "cancelled", cancel_on_entering="retry_wait")
def _cancel_during_backoff(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, lookup=["transient"])
    return [[decide(_lookup()), answer("never asked")]]


@_recipe("cancel", "observing", "cancelled", cancel_on_entering="observing")
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


@_recipe("resume", "executing", "review_required", ("write_outcome_lost",),
         if_in_table=True, needs=_DURABLE, die_at="tool_returned", review=_resume)
def _resume_after_death_mid_write(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit)
    return [[decide(_ticket(), _lookup()), answer("never asked")]]


@_recipe("resume", "executing", "observing", ("write_result_stored",), if_in_table=True,
         needs=_DURABLE, die_at="tool_returned", review=_resume)
def _resume_after_death_with_result_stored(kit: FaultyTools) -> list[list[Step]]:
    # The keyed write's result reached the idempotency record before the process died:
    # resumed, the stored result answers the call and nothing runs twice.
    _kit(kit, idempotent=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


@_recipe("resume", "executing", "executing", (), if_in_table=True, needs=_DURABLE,
         die_before_commit=True, review=_resume)
def _resume_dedup_write_dispatched_again(kit: FaultyTools) -> list[list[Step]]:
    # The downstream deduplicates by key, so a write whose end was lost may be sent again.
    _kit(kit, dedup=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


@_recipe("resume", "review_required", "observing", (), if_in_table=True, needs=_DURABLE,
         review=_approve_c1)
def _approve_then_resume(kit: FaultyTools) -> list[list[Step]]:
    _kit(kit, requires_approval=True)
    return [[decide(_ticket()), answer("Ticket filed.")]]


# ── resolution against the table ────────────────────────────────────────────────────

def scenarios() -> list[Scenario]:
    """Every recipe, in table order of its target."""
    return list(_RECIPES)


@functools.lru_cache(maxsize=1)
def _observed() -> dict[int, list[str]]:
    """transition index -> names of the recipes whose runs take it (each recipe run once)."""
    index = {id(t): i for i, t in enumerate(TRANSITIONS)}
    seen: dict[int, list[str]] = {}
    for scenario in _RECIPES:
        for t in scenario.run().taken:
            names = seen.setdefault(index[id(t)], [])
            if scenario.name not in names:
                names.append(scenario.name)
    return seen


def scenario_for(transition: Transition | int) -> Scenario | None:
    """The recipe that drives a run through ``transition`` (an edge or its index), or
    ``None`` when no recipe does."""
    i = transition if isinstance(transition, int) else TRANSITIONS.index(transition)
    t = TRANSITIONS[i]
    for scenario in _RECIPES:
        if scenario.target == edge_key(t):
            return scenario
    names = _observed().get(i, [])
    by_name = {s.name: s for s in _RECIPES}
    return by_name[names[0]] if names else None


def unbuildable() -> list[tuple[int, Transition, str]]:
    """Transitions of the table no recipe drives a run through, with what is missing."""
    missing = []
    for i, t in enumerate(TRANSITIONS):
        if scenario_for(i) is not None:
            continue
        why = "no recipe in fsm_agent/testing/scenarios.py reaches it"
        if t.trigger == "resume" and not any(hasattr(Runtime, n) for n in ("resume", "approve")):
            why = "it needs the durable-run resume API, which Runtime does not have yet"
        missing.append((i, t, why))
    return missing


def stale_recipes() -> list[Scenario]:
    """Recipes aimed at an edge the table no longer has (their target needs updating)."""
    keys = {edge_key(t) for t in TRANSITIONS}
    return [s for s in _RECIPES if s.target not in keys]
