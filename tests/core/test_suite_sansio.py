"""The fast tier: the one-scenario-per-edge suite driven by hand through the sans-I/O loop.

No driver, no thread, no real clock: each scenario of ``fsm_agent.testing._suite`` that
needs no review, crash or tool threads (those go through a store or a driver by nature,
and the slow tier runs them) is run by :func:`hand_drive`, which answers every request of
:func:`fsm_agent._core.loop.steps` itself (the model by the scenario's script, tools by
calling the kit's functions, the clock by the kit's fake clock, intents by an in-memory
store). Each test asserts the exact request sequence (pinned in ``suite_requests.json``,
which ``tests/test_suite_requests.py`` checks against the real driver), the edge the
scenario targets, and where the run stops; the determinism trap of this folder fails any
that touches the world. ``make test-fast`` (``pytest -m fast``) runs this tier alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fsm_agent._core.intents import IdempotencyRecord, IntentClaim, may_claim
from fsm_agent._core.loop import Cancelled, steps
from fsm_agent._core.loop import start as start_run
from fsm_agent._core.requests import (
    AbortIntent,
    AskModel,
    BeginIntent,
    CallTool,
    CommitIntent,
    ConsumeApproval,
    EmitEvents,
    LoadIntent,
    ReadClock,
    Request,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
)
from fsm_agent._core.state import RunState
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._runtime.config import initial_messages
from fsm_agent._runtime.drivers import outcome_of, propagates
from fsm_agent.models._scripted import ScriptedModel
from fsm_agent.testing._faults import FaultyTools
from fsm_agent.testing._scenarios import Scenario, scripted_runtime
from fsm_agent.testing._suite import SUITE

pytestmark = pytest.mark.fast

PINS_FILE = Path(__file__).with_name("suite_requests.json")


def by_hand(scenario: Scenario) -> bool:
    """Whether the scenario runs without a driver's own machinery (reviews, crashes, a
    pool of tool threads)."""
    return not (
        scenario.review or scenario.die_at or scenario.die_before_commit
        or "tool_threads" in scenario.options
    )  # fmt: skip


HAND = [s for s in SUITE if by_hand(s)]


def label(request: Request) -> str:
    """A request as the pins spell it: its kind, and the tool a ``CallTool`` names."""
    kind = type(request).__name__
    return f"{kind}:{request.tool}" if isinstance(request, CallTool) else kind


class Intents:
    """What a store keeps for the loop's intent and approval requests, in dicts and with
    no clock (``MemoryStore`` timestamps its commits, which the trap would refuse)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], IdempotencyRecord] = {}
        self.uses: dict[str, set[tuple[str, str]]] = {}

    def begin(self, record: IdempotencyRecord, take_over: bool) -> IntentClaim:
        found = self.records.get((record.tool, record.key))
        if may_claim(found, record, take_over):
            self.records[(record.tool, record.key)] = record
            return IntentClaim(True, found)
        return IntentClaim(False, found)

    def commit(self, tool: str, key: str, owner: tuple[str, str], result: Any) -> None:
        current = self.records[(tool, key)]
        assert current.status == "pending" and current.owner == owner, current
        self.records[(tool, key)] = replace(current, status="committed", result=result)

    def abort(self, tool: str, key: str, owner: tuple[str, str]) -> None:
        current = self.records.get((tool, key))
        if current is not None and current.status == "pending" and current.owner == owner:
            del self.records[(tool, key)]

    def consume(self, request: ConsumeApproval) -> bool:
        holders = self.uses.setdefault(request.approval_id, set())
        holder = (request.run_id, request.call_id)
        if holder not in holders and len(holders) >= request.max_uses:
            return False
        holders.add(holder)
        return True


class HandDriver:
    """Answers one run's requests as the sync driver would, with no I/O of its own."""

    def __init__(
        self,
        kit: FaultyTools,
        store: Intents,
        model: Callable[..., Any],
        cancel_on_entering: str | None = None,
    ) -> None:
        self.kit, self.store, self.model = kit, store, model
        self.cancel_on_entering = cancel_on_entering
        self.requests: list[str] = []
        self.events: list[dict[str, Any]] = []

    def answer(self, request: Request) -> Any:  # noqa: C901 - one branch per request kind
        if isinstance(request, ReadClock):
            return self.kit.clock()
        if isinstance(request, AskModel):
            try:
                return self.model(request.messages, request.tool_specs)
            except BaseException as exc:
                if propagates(exc):
                    raise
                return exc
        if isinstance(request, CallTool):
            try:
                return ToolOutcome("ok", value=self.kit[request.tool](**request.arguments))
            except BaseException as exc:
                if propagates(exc):
                    raise
                return outcome_of(exc)
        if isinstance(request, EmitEvents):
            self.events += request.events
            state = self.cancel_on_entering
            if state is not None and any(
                e.get("type") == "transition" and e["dest"] == state for e in request.events
            ):
                self.cancel_on_entering = None  # Ctrl-C once, as an observer of the events
                raise KeyboardInterrupt
            return None
        if isinstance(request, Sleep):
            return self.kit.clock.sleep(request.seconds)
        if isinstance(request, SaveCheckpoint):
            return None  # nothing here resumes: the checkpoint is not needed
        if isinstance(request, BeginIntent):
            return self.store.begin(request.record, request.take_over)
        if isinstance(request, CommitIntent):
            return self.store.commit(request.tool, request.key, request.owner, request.result)
        if isinstance(request, AbortIntent):
            return self.store.abort(request.tool, request.key, request.owner)
        if isinstance(request, LoadIntent):
            return self.store.records.get((request.tool, request.key))
        if isinstance(request, ConsumeApproval):
            return self.store.consume(request)
        raise AssertionError(f"the hand driver has no answer for {request!r}")

    def drive(self, s: RunState) -> bool:
        """Run ``s`` to its end; whether a Ctrl-C (``KeyboardInterrupt``) cancelled it."""
        gen, interrupted = steps(s), False
        request = next(gen)
        while True:
            self.requests.append(label(request))
            try:
                answer = self.answer(request)
            except KeyboardInterrupt:
                interrupted = True
                try:  # as the driver does: the loop cancels itself, answering what is open
                    request = gen.throw(Cancelled())
                except (StopIteration, Cancelled):
                    return interrupted
                continue
            try:
                request = gen.send(answer)
            except StopIteration:
                return interrupted
            except KeyboardInterrupt:  # raised inside the loop (a key function): it
                return True  # cancelled itself, then let the interrupt through


def hand_drive(scenario: Scenario) -> tuple[list[list[str]], RunState, list[dict[str, Any]]]:
    """Every run of ``scenario`` by hand: the request labels per run, the last run's
    state and events."""
    kit = FaultyTools()
    scripts = scenario.setup(kit)
    store, intents = MemoryStore(), Intents()  # the runtime's config is built over a store
    sequences: list[list[str]] = []
    s: RunState | None = None
    driver: HandDriver | None = None
    for n, script in enumerate(scripts, 1):
        runtime = scripted_runtime(
            kit, script, allowed_tools=scenario.allowed_tools, store=store, **scenario.options
        )
        s = RunState(
            run_id=f"{scenario.name}-{n}",
            config=runtime.config(emit=True),
            messages=initial_messages(scenario.task),
        )
        start_run(s)
        driver = HandDriver(kit, intents, ScriptedModel(list(script)), scenario.cancel_on_entering)
        driver.drive(s)
        sequences.append(driver.requests)
    assert s is not None and driver is not None
    return sequences, s, driver.events


def pins() -> dict[str, list[list[str]]]:
    loaded: dict[str, list[list[str]]] = json.loads(PINS_FILE.read_text(encoding="utf-8"))
    return loaded


PINS = pins()  # read at import: the trap forbids files while a test runs


def test_the_hand_tier_covers_every_scenario_a_driver_is_not_needed_for() -> None:
    assert sorted(PINS) == sorted(s.name for s in HAND)
    assert len(HAND) >= 43  # of the suite's 50: the rest review, crash or use threads


@pytest.mark.parametrize("scenario", HAND, ids=[s.name for s in HAND])
def test_the_scenario_by_hand(scenario: Scenario) -> None:
    sequences, s, events = hand_drive(scenario)
    assert sequences == PINS[scenario.name]
    edge = scenario.edge
    taken = [
        (e["trigger"], e["source"], e["dest"]) for e in events if e.get("type") == "transition"
    ]
    assert (edge.trigger, edge.source, edge.dest) in taken, f"{scenario.target} not taken"
    assert (s.status, s.reason) == (scenario.status, scenario.reason), s.detail
