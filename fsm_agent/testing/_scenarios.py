"""Scripted scenarios: the machinery that drives runs through chosen transitions.

A :class:`Scenario` registers fault tools on a fresh kit and returns one script of
decisions per run (runs share the kit, its fake clock and one store, so a scenario can
crash a write in one run and resume or retry it in the next), plus the ``Runtime``
options it needs and what must hold afterwards: the edge it aims at (``target``, an
:attr:`~fsm_agent._core.table.Transition.key`), where the last run stops, counters, and a
check of its own. :meth:`Scenario.verify` asserts all of that and the invariants every
run keeps (a provider-valid history, a trace the one checker accepts, no write taking
effect twice).

The suite with one scenario per edge of the table is ``suite.py``; this module holds no
scenarios and registers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsm_agent._core.events import Event, Transitioned
from fsm_agent._core.table import Transition, edge_by_key
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.store import Store
from fsm_agent._runtime.interceptors import Interceptor, observing
from fsm_agent._runtime.result import RunResult
from fsm_agent._runtime.runtime import Runtime
from fsm_agent.models._scripted import ScriptedModel, Step
from fsm_agent.testing._assertions import (
    assert_history_valid,
    assert_no_duplicate_writes,
    assert_trace_legal,
)
from fsm_agent.testing._coverage import edge_of
from fsm_agent.testing._faults import FaultyTools, ProcessDied
from fsm_agent.testing._mortal import Mortal, stored_result

__all__ = [
    "Mortal",
    "ProcessDied",
    "Scenario",
    "ScenarioRun",
    "record_transitions",
    "run_through_interrupts",
    "scripted_runtime",
    "stored_result",
]

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


class _Recorder(Interceptor):
    """Appends the table entry of every transition event it sees to ``taken``."""

    def __init__(self, taken: list[Transition]) -> None:
        self.taken = taken

    def on_event(self, event: Event) -> None:
        if isinstance(event, Transitioned):
            edge = edge_of(event)
            if edge is not None:
                self.taken.append(edge)


class _OnTransition(Interceptor):
    """Calls ``act(event)`` for every transition event (to raise a crash or a Ctrl-C
    at a chosen edge: ``runtime/interceptors.py`` lets a ``BaseException`` through)."""

    def __init__(self, act: Callable[[Transitioned], None]) -> None:
        self.act = act

    def on_event(self, event: Event) -> None:
        if isinstance(event, Transitioned):
            self.act(event)


@contextlib.contextmanager
def record_transitions() -> Iterator[list[Transition]]:
    """Collect every transition taken (by any run driven in this context) inside the
    ``with`` block."""
    taken: list[Transition] = []
    with observing(_Recorder(taken)):
        yield taken


def run_through_interrupts(
    runtime: Runtime, task: str, *, run_id: str, use_async: bool = False
) -> tuple[RunResult, bool]:
    """``runtime.run(task)`` (or ``arun`` in a fresh event loop), and when the run is
    interrupted (``KeyboardInterrupt``: the run cancels itself, saves its end, then
    re-raises) the result it reached, read back from the runtime's store. Returns
    ``(result, interrupted)``."""
    try:
        if use_async:
            return asyncio.run(runtime.arun(task, run_id=run_id)), False
        return runtime.run(task, run_id=run_id), False
    except (KeyboardInterrupt, asyncio.CancelledError):
        result = stored_result(runtime, run_id)
        if result is None:
            raise
        return result, True


#: What a trusted caller does with a run after it stopped or its process died
#: (``runtime.resume(run_id)``, ``runtime.approve(run_id, call_id, resume=True)``, ...).
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
    """Runs that drive the machine through ``target`` (an edge's key), and what must hold.

    ``status``/``reason``: where the last run stops. ``counters``: values its counters
    must have (a subset). ``check``: anything else, as assertions on the outcome.
    ``cancel_on_entering`` names a state: when a run enters it, ``KeyboardInterrupt`` is
    raised there (Ctrl-C in that state). ``die_at`` names a
    trigger: the process dies (:class:`ProcessDied`) the first time a run takes an edge of
    it, before that edge is saved; ``die_before_commit`` kills it after a keyed write
    ran, before its result reaches the idempotency record. ``review`` then runs after
    each script's run, as the trusted caller who resumes or settles it.
    """

    name: str
    target: str
    setup: Setup
    status: str
    reason: str
    counters: dict[str, Any] = field(default_factory=dict)
    check: Callable[[ScenarioRun], None] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    allowed_tools: Sequence[str] | None = None
    task: str = "Please help with order A17."
    cancel_on_entering: str | None = None
    die_at: str | None = None
    die_before_commit: bool = False
    review: Review | None = None

    @property
    def edge(self) -> Transition:
        edge = edge_by_key(self.target)
        if edge is None:
            raise LookupError(f"scenario {self.name}: {self.target!r} is no edge of the table")
        return edge

    def run(self) -> ScenarioRun:
        kit = FaultyTools()
        scripts = self.setup(kit)
        store = MemoryStore()
        outcome = ScenarioRun(self, kit, [], [])
        died: list[str] = []
        mortal = Mortal(store, before_commit=self.die_before_commit)

        def interrupt(event: Transitioned) -> None:
            if event.dest == self.cancel_on_entering:
                raise KeyboardInterrupt(f"Ctrl-C on entering {event.dest}")

        def die(event: Transitioned) -> None:
            if event.trigger == self.die_at and not died:
                died.append(event.run_id)
                mortal.kill()
                raise ProcessDied(f"the process died at {event.trigger} ({event.source})")

        # The runtime's own interceptors come first: a transition the process died in
        # is never saved, so no other observer (recorder, coverage) counts it either.
        # Ctrl-C, last in line, lands after the transition was seen everywhere.
        options = dict(self.options)
        options["interceptors"] = [_OnTransition(die), *options.get("interceptors", ())]
        with record_transitions() as taken, observing(_OnTransition(interrupt)):
            for n, script in enumerate(scripts, 1):
                runtime = scripted_runtime(
                    kit, script, allowed_tools=self.allowed_tools, store=store, **options
                )
                run_id = f"{self.name}-{n}"
                try:
                    result, interrupted = run_through_interrupts(runtime, self.task, run_id=run_id)
                    outcome.results.append(result)
                    outcome.interrupted.append(interrupted)
                except ProcessDied:
                    # Only what the store saved remains; ``review`` resumes it in a
                    # new process, which finds the store working.
                    mortal.restart()
                for result in self.review(runtime, run_id) if self.review else ():
                    outcome.results.append(result)
                    outcome.interrupted.append(False)
        outcome.taken = list(taken)
        return outcome

    def verify(self, outcome: ScenarioRun | None = None) -> ScenarioRun:
        """Run the scenario (unless ``outcome`` is given) and assert what it promises."""
        outcome = outcome if outcome is not None else self.run()
        where = f"scenario {self.name}"
        assert self.edge in outcome.taken, f"{where}: {self.target} was never taken"
        result = outcome.result
        assert (result.status, result.reason) == (self.status, self.reason), (
            f"{where}: stopped {result.status}/{result.reason} ({result.detail}), expected "
            f"{self.status}/{self.reason}"
        )
        for name, want in self.counters.items():
            assert result.counters[name] == want, (
                f"{where}: counter {name} is {result.counters[name]!r}, expected {want!r}"
            )
        for each in outcome.results:
            assert_history_valid(each)
            assert_trace_legal(each)
        assert_no_duplicate_writes(outcome.kit)
        if self.check is not None:
            self.check(outcome)
        return outcome
