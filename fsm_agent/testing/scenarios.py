"""Scripted scenarios that drive a run through each transition of the table.

A :class:`Scenario` is a recipe: it registers fault tools on a fresh kit and returns one
script of decisions per run (runs share the kit, its fake clock and one idempotency
store, so a scenario can crash a write in one run and retry it in the next), plus the
``Runtime`` options (budget, retry, policy, approvals) it needs.

The recipes live in ``recipes.py``. Each names the edge it aims at, but which edges a
scenario takes is found by running it: :func:`scenario_for` prefers the recipe aimed at
a transition and otherwise any recipe observed to take it, and :func:`unbuildable` lists
the transitions of the table no recipe reaches. A transition added to the table without
a recipe therefore shows up there (and fails the engine's test suite) instead of being
skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsm_agent.core.engine import TRANSITION_LISTENERS
from fsm_agent.core.table import TRANSITIONS, Transition
from fsm_agent.durable.memory import MemoryStore
from fsm_agent.durable.store import Store
from fsm_agent.models.scripted import ScriptedModel, Step
from fsm_agent.runtime.result import RunResult
from fsm_agent.runtime.runtime import Runtime
from fsm_agent.testing.faults import FaultyTools

__all__ = [
    "ProcessDied",
    "Scenario",
    "ScenarioRun",
    "edge_key",
    "record_transitions",
    "run_through_interrupts",
    "scenario_for",
    "scenarios",
    "scripted_runtime",
    "stale_recipes",
    "unbuildable",
]

EdgeKey = tuple[str, str, str, tuple[str, ...]]
Setup = Callable[[FaultyTools], list[list[Step]]]

#: A write tool's arguments: an idempotency key and a title that can differ under one key.
TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "key": {"type": "string", "minLength": 1, "maxLength": 64},
        "title": {"type": "string", "maxLength": 200},
    },
    "required": ["key"],
}


def edge_key(t: Transition) -> EdgeKey:
    """What identifies an edge independently of its position: trigger, source, dest,
    guards."""
    return (t.trigger, t.source, t.dest, t.guards)


def scripted_runtime(
    kit: FaultyTools,
    script: Sequence[Step],
    *,
    allowed_tools: Sequence[str] | None = None,
    store: Store | None = None,
    **options: Any,
) -> Runtime:
    """A :class:`Runtime` over ``kit``'s tools and fake clock replaying ``script``.

    Every tool of the kit is allowed unless ``allowed_tools`` says otherwise; backoff
    sleeps move the fake clock instead of waiting.
    """
    return Runtime(
        model=ScriptedModel(list(script)),
        tools=kit.registry,
        allowed_tools=kit.names() if allowed_tools is None else allowed_tools,
        clock=kit.clock,
        sleep=kit.clock.sleep,
        store=store if store is not None else MemoryStore(),
        **options,
    )


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


def run_through_interrupts(
    runtime: Runtime, task: str, *, run_id: str, use_async: bool = False
) -> tuple[RunResult, bool]:
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
    """The process dying mid-run. Raised from a transition listener it escapes the loop
    at once; raised by a store it makes that store refuse everything after (see
    :func:`die_before_commit`), so nothing the dying process would not have written is
    written."""


_STORE_WRITES = ("begin_intent", "commit_intent", "abort_intent", "create_run", "save",
                 "claim", "renew", "release")  # fmt: skip


class Mortal:
    """A store whose process can die: after :meth:`kill` (or, with ``before_commit``, at
    the first idempotency commit) every write to it raises :class:`ProcessDied`, so a
    dying run writes nothing more — as a killed process would not. :meth:`restart` is the
    next process: the same data, writable again. Reads always work."""

    def __init__(self, store: Store, *, before_commit: bool = False) -> None:
        self.store, self.before_commit, self.dead = store, before_commit, False
        for name in _STORE_WRITES:
            if hasattr(store, name):
                setattr(store, name, self._guard(name, getattr(store, name)))

    def _guard(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise ProcessDied(f"the process is dead ({name} not written)")
            if name == "commit_intent" and self.before_commit:
                self.before_commit = False
                self.kill()
                raise ProcessDied(f"the process died before {args[0]!r} {args[1]!r} was stored")
            return original(*args, **kwargs)

        return call

    def kill(self) -> None:
        self.dead = True

    def restart(self) -> None:
        self.dead = False


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
        mortal = Mortal(store, before_commit=self.die_before_commit)

        def faults(run: Any, transition: Transition) -> None:
            if transition.dest == self.cancel_on_entering:
                kit.clock.interrupt_next_read()
            if transition.trigger == self.die_at and not died:
                died.append(run.run_id)
                mortal.kill()
                raise ProcessDied(f"the process died at {transition.label}")

        with record_transitions() as taken:
            # First in line: a transition the process died in is never saved, so no
            # other listener (recorder, coverage) should count it either.
            TRANSITION_LISTENERS.insert(0, faults)
            try:
                for n, script in enumerate(scripts, 1):
                    runtime = scripted_runtime(
                        kit, script, allowed_tools=self.allowed_tools, store=store, **self.options
                    )
                    run_id = f"{self.name}-{n}"
                    try:
                        result, interrupted = run_through_interrupts(
                            runtime, self.task, run_id=run_id
                        )
                        outcome.results.append(result)
                        outcome.interrupted.append(interrupted)
                    except ProcessDied:
                        # Only what the store saved remains; ``review`` resumes it in a
                        # new process, which finds the store working.
                        mortal.restart()
                    for result in self.review(runtime, run_id) if self.review else ():
                        outcome.results.append(result)
                        outcome.interrupted.append(False)
            finally:
                TRANSITION_LISTENERS.remove(faults)
        outcome.taken = list(taken)
        return outcome


RECIPES: list[Scenario] = []
_TABLE_KEYS = {edge_key(t) for t in TRANSITIONS}


def recipe(
    trigger: str,
    source: str,
    dest: str,
    guards: tuple[str, ...] = (),
    *,
    if_in_table: bool = False,
    needs: bool = True,
    **scenario: Any,
) -> Callable[[Setup], Setup]:
    """Register a recipe aimed at an edge. ``if_in_table`` recipes are for edges that
    another part of the engine adds (durable runs): they register only once the table
    has their edge and ``needs`` (the API they drive) holds."""

    def register(setup: Setup) -> Setup:
        name = setup.__name__.strip("_")
        target = (trigger, source, dest, guards)
        if not if_in_table or (needs and target in _TABLE_KEYS):
            RECIPES.append(Scenario(name, target, setup, **scenario))
        return setup

    return register


# ── resolution against the table ────────────────────────────────────────────────────


def _load() -> None:
    # The recipes register themselves on import; they live in their own module.
    import fsm_agent.testing.recipes  # noqa: F401


def scenarios() -> list[Scenario]:
    """Every recipe, in the order they are declared."""
    _load()
    return list(RECIPES)


@functools.lru_cache(maxsize=1)
def _observed() -> dict[int, list[str]]:
    """transition index -> names of the recipes whose runs take it (each recipe run once)."""
    _load()
    index = {id(t): i for i, t in enumerate(TRANSITIONS)}
    seen: dict[int, list[str]] = {}
    for scenario in RECIPES:
        for t in scenario.run().taken:
            names = seen.setdefault(index[id(t)], [])
            if scenario.name not in names:
                names.append(scenario.name)
    return seen


def scenario_for(transition: Transition | int) -> Scenario | None:
    """The recipe that drives a run through ``transition`` (an edge or its index), or
    ``None`` when no recipe does."""
    _load()
    i = transition if isinstance(transition, int) else TRANSITIONS.index(transition)
    t = TRANSITIONS[i]
    for scenario in RECIPES:
        if scenario.target == edge_key(t):
            return scenario
    names = _observed().get(i, [])
    by_name = {s.name: s for s in RECIPES}
    return by_name[names[0]] if names else None


def unbuildable() -> list[tuple[int, Transition, str]]:
    """Transitions of the table no recipe drives a run through, with what is missing."""
    missing = []
    for i, t in enumerate(TRANSITIONS):
        if scenario_for(i) is not None:
            continue
        why = "no recipe in fsm_agent/testing/recipes.py reaches it"
        if t.trigger == "resume" and not any(hasattr(Runtime, n) for n in ("resume", "approve")):
            why = "it needs the durable-run resume API, which Runtime does not have yet"
        missing.append((i, t, why))
    return missing


def stale_recipes() -> list[Scenario]:
    """Recipes aimed at an edge the table no longer has (their target needs updating)."""
    _load()
    keys = {edge_key(t) for t in TRANSITIONS}
    return [s for s in RECIPES if s.target not in keys]
