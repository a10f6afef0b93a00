"""Your agent under test: the application's own runtime, with faults and a ledger.

An application builds its runtime in one function of its own (its tools, its store, its
machine); :class:`AgentUnderTest` takes that function and runs the application through
it unchanged, adding two interceptors around every run (``observing``): a
:class:`~fsm_agent.testing._faults.ToolFaults` script per tool, and a :class:`Ledger` of
what really reached each tool::

    agent = AgentUnderTest(make_runtime, faults={"issue_refund": ["lost_response", "ok"]})
    result = agent.run("refund order A17", model=KeyedScriptedModel(...))
    assert_no_duplicate_writes(agent.ledger)

The factory is called as ``factory(model=model)`` (plus the ``options`` given to the
harness), so ``def make_runtime(*, model, store=None) -> Runtime`` fits as it is. No tool
is edited or replaced: faults answer a call instead of performing it (or after it), and
the ledger sits behind the faults, so it lists only the calls that ran.

Crashes and Ctrl-C: ``cancel_on_entering="observing"`` presses Ctrl-C the first time a
run enters that state; ``crash_at="tool_returned"`` kills the process the first time a
run takes an edge of that trigger, before the edge is saved, and ``crash_at="BeginIntent"``
(a request of ``core/requests.py``, :data:`CRASH_REQUESTS`) just before the driver
performs it (the store refuses every write from then on, as a dead process writes
nothing); so do ``ToolFaults``' ``crash`` behaviours. :meth:`AgentUnderTest.run` (and
``resume``, ``approve``, ...) then return what the store kept of the run, and
:meth:`~AgentUnderTest.resume` continues it in the next "process" (the store writable
again)::

    agent = AgentUnderTest(make_runtime, crash_at="tool_returned")
    died = agent.run("refund order A17", model=model)     # died.status == "executing"
    result = agent.resume(died.run_id)                    # continues where it was

Time is virtual: a retry's backoff (``Sleep``) does not wait, it moves the run's clock
(every ``ReadClock`` reads that much later), and so does an injected ``slow`` call.

Which tools write: by default those the registry declares ``effect="write"``. Pass
``writes=[...]`` to state the truth yourself; that is how a test catches a write
registered as a read (the registry's word is what is being tested).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsm_agent._core.events import Event, RuleJudged, Transitioned
from fsm_agent._core.requests import AskModel, CallTool, ReadClock, Request, Sleep, ToolOutcome
from fsm_agent._runtime.interceptors import AsyncCallNext, CallNext, Interceptor, observing
from fsm_agent._runtime.result import RunResult
from fsm_agent._runtime.runtime import Runtime
from fsm_agent.testing._faults import InjectedInterrupt, ProcessDied
from fsm_agent.tools._registry import ToolRegistry

__all__ = ["CRASH_REQUESTS", "AgentUnderTest", "Execution", "Ledger", "VirtualTime"]

#: Outcomes after which a tool promises that nothing happened (so a repeat is no duplicate).
_NOTHING_HAPPENED = frozenset({"transient", "rejected", "not_started"})

RuntimeFactory = Callable[..., Runtime]


@dataclass(frozen=True)
class Execution:
    """One call that reached its tool: what ran, under which key, and how it ended."""

    tool: str
    call_id: str
    arguments: dict[str, Any]
    #: The tool's idempotency key for these arguments, else ``None``.
    key: str | None
    outcome: str
    #: How many model calls preceded it: the round of its batch (ids recur across rounds).
    round: int = 0

    @property
    def identity(self) -> tuple[Any, ...]:
        """What must take effect once: a keyed write's key; an unkeyed call itself (a
        model that asks twice for the same email in two rounds asked for two emails)."""
        return (self.tool, "key", self.key) if self.key is not None else (
            self.tool, "call", self.round, self.call_id
        )  # fmt: skip

    @property
    def took_effect(self) -> bool:
        """Whether the call may have changed the world (the tool did not promise otherwise)."""
        return self.outcome not in _NOTHING_HAPPENED


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(eq=False)
class Ledger(Interceptor):
    """Every tool call that really ran, in order (an interceptor behind the faults).

    ``writes`` names the tools whose calls change the world (``None``: ask the registry
    given to :meth:`bind`)."""

    writes: frozenset[str] | None = None
    executions: list[Execution] = field(default_factory=list)
    rounds: int = 0
    #: ``(call_id, round, rule)`` of each call a ``before_tool`` rule denied.
    denied: list[tuple[str, int, str]] = field(default_factory=list)
    _registry: ToolRegistry | None = field(default=None, repr=False)

    def bind(self, registry: ToolRegistry) -> None:
        """Read idempotency keys (and, without ``writes``, effects) from ``registry``."""
        self._registry = registry

    def is_write(self, tool: str) -> bool:
        if self.writes is not None:
            return tool in self.writes
        registered = self._registry.get(tool) if self._registry is not None else None
        return registered is not None and registered.effect == "write"

    def _key(self, request: CallTool) -> str | None:
        registered = self._registry.get(request.tool) if self._registry is not None else None
        if registered is not None and registered.idempotency_key is not None:
            try:
                return _canonical(registered.idempotency_key(dict(request.arguments)))
            except Exception:
                pass
        return None

    def _record(self, request: CallTool, outcome: Any) -> None:
        kind = outcome.kind if isinstance(outcome, ToolOutcome) else "ok"
        arguments = dict(request.arguments)
        key = self._key(request)
        self.executions.append(
            Execution(request.tool, request.call_id, arguments, key, kind, self.rounds)
        )

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        if isinstance(request, AskModel):
            self.rounds += 1
        outcome = call_next(request)
        if isinstance(request, CallTool):
            self._record(request, outcome)
        return outcome

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        if isinstance(request, AskModel):
            self.rounds += 1
        outcome = await call_next(request)
        if isinstance(request, CallTool):
            self._record(request, outcome)
        return outcome

    def on_event(self, event: Event) -> None:
        # Events reach an interceptor before the next request, so ``rounds`` is the round
        # of the batch the rule judged, as it is for that batch's executions.
        if (
            isinstance(event, RuleJudged)
            and (event.phase, event.verdict) == ("before_tool", "deny")
            and event.call_id is not None
        ):
            self.denied.append((event.call_id, self.rounds, event.rule or "?"))

    def denied_but_ran(self) -> list[str]:
        """Calls a ``before_tool`` rule denied that reached their tool all the same."""
        ran = {(e.call_id, e.round) for e in self.executions}
        return [
            f"call {call_id!r} ran although rule {rule!r} denied it"
            for call_id, round_, rule in self.denied
            if (call_id, round_) in ran
        ]

    def executed(self, tool: str | None = None) -> list[Execution]:
        """The calls that ran (of ``tool`` only, when given) and may have taken effect."""
        return [e for e in self.executions if e.took_effect and tool in (None, e.tool)]

    def duplicate_writes(self) -> list[str]:
        """Writes that may have taken effect more than once: under one idempotency key,
        or (unkeyed) as one call of one round run again."""
        writes = [e for e in self.executed() if self.is_write(e.tool)]
        counts = Counter(e.identity for e in writes)
        problems = []
        for identity, n in counts.items():
            if n < 2:
                continue
            same = [e for e in writes if e.identity == identity]
            what = f"with key {same[0].key}" if same[0].key is not None else "as one call"
            calls = ", ".join(repr(e.call_id) for e in same)
            problems.append(f"write {same[0].tool!r} ran {n} times {what}: calls {calls}")
        return problems


class VirtualTime(Interceptor):
    """A run's time without waiting: a ``Sleep`` (a retry's backoff) moves the clock the
    run reads instead of blocking the test."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.slept: list[float] = []

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        if isinstance(request, Sleep):
            self.slept.append(request.seconds)
            self.elapsed += request.seconds
            return None
        if isinstance(request, ReadClock):
            return call_next(request) + self.elapsed
        return call_next(request)

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        if isinstance(request, Sleep):
            self.slept.append(request.seconds)
            self.elapsed += request.seconds
            return None
        if isinstance(request, ReadClock):
            return (await call_next(request)) + self.elapsed
        return await call_next(request)


#: The requests ``crash_at`` may name: the process dies just before the driver performs it.
CRASH_REQUESTS: tuple[str, ...] = (
    "AskModel", "CallTool", "SaveCheckpoint", "BeginIntent", "CommitIntent", "LoadIntent",
    "ConsumeApproval",
)  # fmt: skip


class _Mishaps(Interceptor):
    """Ctrl-C on entering a state, a crash at a trigger's first edge, and the dead store
    after any crash (a ``ToolFaults`` one too). First among the context's interceptors,
    so no other observer sees the event the process died in."""

    def __init__(self, cancel_on_entering: str | None, crash_at: str | None) -> None:
        self.cancel_on_entering = cancel_on_entering
        self.crash_at = crash_at
        self.cancelled = self.crashed = self.dead = False
        self.mortal: Any = None  # the testing.mortal.Mortal over the runtime's store

    def died(self) -> None:
        self.crashed = self.dead = True
        if self.mortal is not None:
            self.mortal.kill()

    def restart(self) -> None:
        """The next process: the store takes writes again."""
        self.dead = False
        if self.mortal is not None:
            self.mortal.restart()

    def on_event(self, event: Event) -> None:
        if self.dead:  # a dead process tells no observer what it would have done next
            raise ProcessDied("the process is dead")
        if not isinstance(event, Transitioned):
            return
        if event.trigger == self.crash_at and not self.crashed:
            self.died()
            raise ProcessDied(f"injected crash at {event.trigger} ({event.source})")
        if event.dest == self.cancel_on_entering and not self.cancelled:
            self.cancelled = True
            raise InjectedInterrupt(f"injected Ctrl-C on entering {event.dest}")

    def _before(self, request: Request) -> None:
        if type(request).__name__ == self.crash_at and not self.crashed:
            self.died()
            raise ProcessDied(f"injected crash before {self.crash_at}")

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        self._before(request)
        try:
            return call_next(request)
        except ProcessDied:
            self.died()
            raise

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        self._before(request)
        try:
            return await call_next(request)
        except ProcessDied:
            self.died()
            raise


class AgentUnderTest:
    """The application's runtime factory, run with faults per tool and a ledger.

    ``faults`` maps tool names to behaviour sequences (:class:`ToolFaults`); ``writes``
    overrides which tools write (see the module docstring); ``cancel_on_entering`` (a
    state) and ``crash_at`` (a trigger) inject a Ctrl-C and a crash (see the module
    docstring); ``options`` go to the factory with ``model=``. ``runtime`` is the last
    runtime built (one per :meth:`run`); ``interrupted`` and ``crashed`` say whether the
    last call ended in an injected Ctrl-C or crash."""

    def __init__(
        self,
        factory: RuntimeFactory,
        *,
        faults: Mapping[str, Sequence[str]] | None = None,
        writes: Iterable[str] | None = None,
        slow_s: float = 60.0,
        cancel_on_entering: str | None = None,
        crash_at: str | None = None,
        **options: Any,
    ) -> None:
        from fsm_agent.testing._faults import ToolFaults

        if not callable(factory):
            raise TypeError(
                f"AgentUnderTest needs the application's runtime factory (a callable taking "
                f"model=...), got {factory!r}"
            )
        if isinstance(writes, str):
            raise TypeError(f"writes must be a list of tool names, got the string {writes!r}")
        self.factory = factory
        self.options = options
        self.faults = ToolFaults(dict(faults or {}), slow_s=slow_s)
        self.ledger = Ledger(frozenset(writes) if writes is not None else None)
        self.time = VirtualTime()
        self.mishaps = _Mishaps(cancel_on_entering, crash_at)
        self.runtime: Runtime | None = None
        self.interrupted = self.crashed = False
        self._runs = 0

    def _check_mishaps(self, runtime: Runtime) -> None:
        machine = runtime.machine
        state, trigger = self.mishaps.cancel_on_entering, self.mishaps.crash_at
        working = [s for s in machine.states if s not in machine.terminal]
        if state is not None and state not in working:
            raise ValueError(
                f"cancel_on_entering={state!r} is not a working state of the application's "
                f"machine; choose from {', '.join(working)}"
            )
        points = sorted({t.trigger for t in machine.transitions}) + list(CRASH_REQUESTS)
        if trigger is not None and trigger not in points:
            raise ValueError(
                f"crash_at={trigger!r} is neither a trigger of the application's machine "
                f"nor a request the driver performs; choose from {', '.join(points)}"
            )

    def build(self, model: Any) -> Runtime:
        """The application's runtime over ``model``, checked against the fault script."""
        from fsm_agent.testing._mortal import Mortal

        runtime = self.factory(model=model, **self.options)
        if not isinstance(runtime, Runtime):
            raise TypeError(
                f"the runtime factory {getattr(self.factory, '__name__', self.factory)!r} "
                f"returned {type(runtime).__name__}, not a Runtime"
            )
        unknown = sorted(set(self.faults.script) - set(runtime.tools.names()))
        if unknown:
            raise ValueError(
                f"faults name tools the application does not register: {unknown}; "
                f"its tools are {sorted(runtime.tools.names())}"
            )
        self._check_mishaps(runtime)
        self.ledger.bind(runtime.tools)
        # The store learns to die (its writes refuse after a faked crash, until the next
        # "process"); one shared between builds (``store=`` in options) is wrapped once.
        store = runtime.store
        mortal = getattr(store, "_fsm_mortal", None)
        if mortal is None:
            mortal = Mortal(store)
            with contextlib.suppress(AttributeError):  # a store with __slots__
                store._fsm_mortal = mortal  # type: ignore[attr-defined]
        self.mishaps.mortal = mortal
        self.runtime = runtime
        return runtime

    @contextlib.contextmanager
    def injecting(self) -> Iterator[None]:
        """Faults, virtual time and the ledger around every run driven in the block."""
        with observing(self.mishaps, first=True), observing(self.faults, self.time, self.ledger):
            yield

    def _through(self, drive: Callable[[], RunResult], run_id: str) -> RunResult:
        """``drive()`` with the faults; after an injected Ctrl-C or crash, what the store
        kept of run ``run_id`` (a real Ctrl-C is never swallowed)."""
        from fsm_agent.testing._mortal import stored_result

        assert self.runtime is not None
        self.interrupted = self.crashed = False
        try:
            with self.injecting():
                return drive()
        except InjectedInterrupt:
            self.interrupted = True
        except ProcessDied:
            self.crashed = True
            self.mishaps.restart()  # the next process finds the store working
        kept = stored_result(self.runtime, run_id)
        if kept is None:
            raise RuntimeError(f"run {run_id!r} was interrupted before the store kept anything")
        return kept

    def _new_id(self, kwargs: dict[str, Any]) -> str:
        self._runs += 1
        run_id = kwargs.pop("run_id", None)
        return str(run_id) if run_id is not None else f"agent-under-test-{self._runs}"

    def run(self, task: str | list[dict[str, Any]], *, model: Any, **kwargs: Any) -> RunResult:
        """Build the runtime over ``model`` and run ``task`` to its end, with the faults."""
        runtime = self.build(model)
        run_id = self._new_id(kwargs)
        return self._through(lambda: runtime.run(task, run_id=run_id, **kwargs), run_id)

    async def arun(
        self, task: str | list[dict[str, Any]], *, model: Any, **kwargs: Any
    ) -> RunResult:
        """:meth:`run` on the async driver (an injected Ctrl-C or crash propagates)."""
        runtime = self.build(model)
        run_id = self._new_id(kwargs)
        with self.injecting():
            return await runtime.arun(task, run_id=run_id, **kwargs)

    def _last(self, what: str) -> Runtime:
        if self.runtime is None:
            raise RuntimeError(f"nothing to {what}: call run() first (it builds the runtime)")
        return self.runtime

    def resume(self, run_id: str, **kwargs: Any) -> RunResult:
        """Resume ``run_id`` on the last runtime built (same store), with the faults."""
        runtime = self._last("resume")
        return self._through(lambda: runtime.resume(run_id, **kwargs), run_id)

    def approve(self, run_id: str, call_id: str, **kwargs: Any) -> RunResult:
        """``Runtime.approve`` on the last runtime built, with the faults (a resume may run)."""
        runtime = self._last("approve")
        return self._through(lambda: runtime.approve(run_id, call_id, **kwargs), run_id)

    def deny(self, run_id: str, call_id: str, reason: str, **kwargs: Any) -> RunResult:
        """``Runtime.deny`` on the last runtime built, with the faults."""
        runtime = self._last("deny")
        return self._through(lambda: runtime.deny(run_id, call_id, reason, **kwargs), run_id)

    def reconcile(self, run_id: str, call_id: str, result: Any, **kwargs: Any) -> RunResult:
        """``Runtime.reconcile`` on the last runtime built (``result``: what the paused
        write really did), with the faults."""
        runtime = self._last("reconcile")
        return self._through(lambda: runtime.reconcile(run_id, call_id, result, **kwargs), run_id)
