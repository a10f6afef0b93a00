"""``Runtime``: the public facade. It checks the caller's configuration once, builds each
run's :class:`~fsm_agent._core.state.RunState`, and hands the loop to a driver.

``run()``/``resume()`` use the sync driver, ``arun()``/``aresume()`` the async one; both
drive the same generator (``core/loop.py``), so they obey every rule identically.
Reviews (``approve``/``deny``/``reconcile``) are recorded in the store
(``durable/review.py``) and return at once; a worker or ``resume`` drives the run on.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fsm_agent._core.approvals import Approval, ApprovalBook
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.judging import rules_machine
from fsm_agent._core.loop import start, steps
from fsm_agent._core.requests import SaveCheckpoint
from fsm_agent._core.state import RunConfig, RunState
from fsm_agent._core.table import DEFAULT_MACHINE, Machine
from fsm_agent._durable import owners, review
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.resume import known_machines, restore_run
from fsm_agent._durable.store import (
    CancelRequest,
    Checkpoint,
    Store,
    StoredRun,
    supports_approvals,
    supports_runs,
)
from fsm_agent._errors import ConfigError, MachineMismatch, StoreError
from fsm_agent._rules import Rule, RuleSet
from fsm_agent._runtime.call_ids import call_ids, warn_repeated_calls
from fsm_agent._runtime.config import (
    check_context,
    check_settings,
    initial_messages,
    rule_set,
    tool_facts,
)
from fsm_agent._runtime.context import DEFAULT_CAPACITY
from fsm_agent._runtime.drivers import AsyncDriver, Driving, Io, Model, SyncDriver, ToolThreads
from fsm_agent._runtime.interceptors import Interceptors
from fsm_agent._runtime.result import RunResult, result_of
from fsm_agent._runtime.trace_files import continue_trace_file
from fsm_agent._trace import chain
from fsm_agent._trace.chain import Chain, Encoder
from fsm_agent._trace.io import JsonlTrace, Redactor, TraceSink
from fsm_agent.tools._registry import ToolRegistry

if TYPE_CHECKING:  # (streaming loads asyncio: only when a run is streamed)
    from fsm_agent._runtime.streaming import AsyncStreamRun, StreamRun

__all__ = ["Model", "Runtime"]

Policy = Literal["default", "strict"]
TraceArg = str | os.PathLike[str] | TraceSink | None


def _is_async_callable(fn: Any) -> bool:
    # An instance with an async __call__ counts too.
    call = getattr(fn, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class Runtime:
    """Runs agent loops under the rules of docs/concepts/rules.md. Configuration errors raise
    :class:`~fsm_agent._errors.ConfigError` (a ``ValueError``) at construction.

    ``allowed_tools`` is the trusted caller's allow-list: nothing a model writes widens it.
    ``approvals`` bind a write tool to exact arguments (``core/approvals.py`` says what
    each covers). ``store`` keeps idempotency records and runs (a fresh
    :class:`MemoryStore` per runtime by default). ``trace_dir`` writes one
    ``<run_id>.jsonl`` per run, continued when the run is resumed
    (``runtime/trace_files.py``); ``redact`` rewrites each event before it leaves the loop.
    ``clock`` and ``sleep`` exist so tests can run backoffs and deadlines without waiting.
    ``trace_key`` (bytes or str) signs every trace this runtime writes: each line's chain
    link becomes an HMAC, so ``fsm-agent check --key-env`` detects any edit
    (``trace/chain.py``); keep it where the runs' writers and auditors can read it.
    ``machine`` is the transition table new runs fire (default: the built-in one; build
    another with :func:`~fsm_agent._core.engine.compile_machine`); ``machines`` are older
    tables this runtime still resumes and reviews runs of: a stored run fires the machine
    its checkpoint names, so a run paused before the application changed its table
    finishes under the table it started with.
    ``interceptors`` wrap every request the drivers perform and see every event
    (``runtime/interceptors.py``); one that raises is logged and counted in
    :attr:`interceptor_errors` and never changes a run.
    """

    def __init__(
        self,
        *,
        model: Model,
        tools: ToolRegistry,
        allowed_tools: Iterable[str],
        budget: Budget | None = None,
        retry: RetryPolicy | None = None,
        approvals: Iterable[Approval] = (),
        policy: Policy = "default",
        store: Store | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        redact: Redactor | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        tool_threads: int = 16,
        trace_key: bytes | str | None = None,
        machine: Machine = DEFAULT_MACHINE,
        machines: Iterable[Machine] = (),
        interceptors: Iterable[Any] = (),
        rules: Iterable[Rule] = (),
    ) -> None:
        approvals = tuple(approvals)
        machines = tuple(machines)
        check_settings(model=model, tools=tools, allowed_tools=allowed_tools, budget=budget,
                       retry=retry, approvals=approvals, policy=policy, redact=redact,
                       machines=(machine, *machines))  # fmt: skip
        self.model = model
        self.tools = tools
        self.allowed_tools = frozenset(allowed_tools)
        self.budget = budget or Budget()
        self.retry = retry or RetryPolicy()
        self.approvals = approvals
        self.policy: Policy = policy
        self.store: Store = store if store is not None else MemoryStore()
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.redact = redact
        self.clock = clock
        self.sleep = sleep
        self._book = ApprovalBook(approvals)
        if self._book.limited and not supports_approvals(self.store):
            raise ConfigError(
                f"approvals with max_uses need a store that counts their uses; "
                f"{type(self.store).__name__} has no consume_approval() (use MemoryStore, "
                "SqliteStore or PostgresStore, or drop max_uses)"
            )
        self._trace_key = chain.trace_key(trace_key)
        self._threads = ToolThreads(tool_threads)
        self._tool_facts = tool_facts(tools)
        self.machine = self._with_rules(rules, machine)
        #: Every machine this runtime resumes runs of, by hash (``machine`` first).
        self.machines: dict[str, Machine] = known_machines((machine, *machines))
        self._interceptors = Interceptors(interceptors)

    def _with_rules(self, rules: Iterable[Rule], machine: Machine) -> Machine:
        """Compile the application's rules once (``ConfigError`` listing every mistake);
        new runs then fire ``machine`` plus the rules' rows (``core/judging.py``)."""
        #: The application's rules (None without any: runs judge nothing).
        self.rules: RuleSet | None = rule_set(rules, self.tools)
        #: machine hash -> the rules its runs are judged by.
        self._rule_sets: dict[str, RuleSet] = {}
        self._base_machine = machine
        if self.rules is None:
            return machine
        with_rules = rules_machine(self.rules, machine)
        self._rule_sets[with_rules.hash] = self.rules
        return with_rules

    @property
    def interceptors(self) -> tuple[Any, ...]:
        return self._interceptors.all

    @property
    def interceptor_errors(self) -> int:
        """How many times one of this runtime's interceptors raised (each was logged on
        ``logging.getLogger("fsm_agent")``; none changed a run)."""
        return self._interceptors.errors

    # ── public entry points ───────────────────────────────────────────────────────

    def run(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        trace: TraceArg = None,
        model: Model | None = None,
        context: dict[str, Any] | None = None,
    ) -> RunResult:
        """Run to a terminal state synchronously. Bad model output never raises.

        ``model`` replaces the runtime's model for this run only (same tools, store and
        policy); ``trace`` is a new file path (one file holds one run) or a sink.
        ``context``: the trusted caller's facts the rules read (``context.tier``), stored
        with the run and recorded in its header (JSON data).
        """
        model = self._sync_model(model, "run")
        state, sink = self._new_run(task, run_id, trace, context=context)
        return self._drive(state, model, sink, resumed=False, encoder=self._encoder(state, sink))

    async def arun(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        trace: TraceArg = None,
        model: Model | None = None,
        context: dict[str, Any] | None = None,
    ) -> RunResult:
        """Run to a terminal state; sync or async models and tools both work (``context``:
        as :meth:`run`)."""
        model = self._model_for(model)
        state, sink = self._new_run(task, run_id, trace, context=context)
        encoder = self._encoder(state, sink)
        return await self._adrive(state, model, sink, resumed=False, encoder=encoder)

    def stream(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        trace: TraceArg = None,
        model: Model | None = None,
        capacity: int = DEFAULT_CAPACITY,
        trace_deltas: bool = False,
        context: dict[str, Any] | None = None,
    ) -> StreamRun:
        """``with runtime.stream(task) as run: for event in run: ...``, then ``run.result``:
        the run driven as :meth:`run` drives it (in a thread of its own), its typed events
        live in ``seq`` order, with the deltas of a ``stream=True`` model. Leaving the block
        early or ``run.cancel()`` ends it ``cancelled`` (``runtime/streaming.py``). The
        trace keeps each streamed block's length and digest; ``trace_deltas=True`` keeps
        the raw deltas too (``fsm-agent check`` verifies that they fold to the message).
        ``context``: the trusted facts the rules read, as for :meth:`run`."""
        from fsm_agent._runtime.streaming import StreamRun

        self._sync_model(model, "stream")
        return StreamRun(
            self, task, run_id=run_id, trace=trace, model=model, capacity=capacity,
            trace_deltas=_flag("trace_deltas", trace_deltas), context=context,
        )  # fmt: skip

    def astream(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        trace: TraceArg = None,
        model: Model | None = None,
        capacity: int = DEFAULT_CAPACITY,
        trace_deltas: bool = False,
        context: dict[str, Any] | None = None,
    ) -> AsyncStreamRun:
        """``async with runtime.astream(task) as run: async for event in run: ...``: the
        async twin of :meth:`stream` (driven as :meth:`arun` drives it); cancelling the
        consuming task ends the run ``cancelled``."""
        from fsm_agent._runtime.streaming import AsyncStreamRun

        self._model_for(model)
        return AsyncStreamRun(
            self, task, run_id=run_id, trace=trace, model=model, capacity=capacity,
            trace_deltas=_flag("trace_deltas", trace_deltas), context=context,
        )  # fmt: skip

    def _stream_drive(
        self,
        task: Any,
        *,
        run_id: str | None,
        trace: TraceArg,
        model: Model | None,
        context: dict[str, Any] | None = None,
    ) -> RunResult:
        from fsm_agent._runtime.streaming import StreamCancelled

        model = self._sync_model(model, "stream")
        state, sink = self._new_run(task, run_id, trace, context=context)
        try:
            return self._drive(
                state, model, sink, resumed=False, encoder=self._encoder(state, sink)
            )
        except StreamCancelled:  # the consumer stopped it: the run took its cancel edge
            return self._result(state)

    async def _astream_drive(
        self,
        task: Any,
        *,
        run_id: str | None,
        trace: TraceArg,
        model: Model | None,
        context: dict[str, Any] | None = None,
    ) -> RunResult:
        import asyncio

        from fsm_agent._runtime.streaming import StreamCancelled

        model = self._model_for(model)
        state, sink = self._new_run(task, run_id, trace, context=context)
        encoder = self._encoder(state, sink)
        try:
            return await self._adrive(state, model, sink, resumed=False, encoder=encoder)
        except (asyncio.CancelledError, StreamCancelled):  # the consumer stopped it
            return self._result(state)

    def submit(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> str:
        """Record a new run in the store without driving it, and return its id: a worker
        (``fsm-agent worker``) claims and drives it, with the settings of this runtime
        (budget, retry, policy, allow-list) recorded in its header. Its trace starts
        with its first driver, whose ``run_start`` records what governs the run: that
        runtime's approvals, tools and ``trace_key`` (every stored line is chained under
        it), and this allow-list narrowed to that runtime's. The time it waits in the
        queue does not count against its wall-clock budget. Raises ``RunExists`` for a
        taken id (of concurrent submits of one id exactly one succeeds), ``StoreError``
        for a store that keeps no runs."""
        store = self.store
        if not supports_runs(store):
            raise StoreError(f"{type(store).__name__} does not keep runs; submit needs a store")
        state, _ = self._new_run(task, run_id, None, traced=False, context=context)
        self._carry_context(state.trace_context)
        # The loop's own first step writes the run's creation (its header and the
        # checkpoint at ``deciding``); it is stopped there, before asking the model. Its
        # trace starts with its first driver (``_adopt``): the run_start line records
        # what governs the run — that driver's approvals, tools and trace key.
        loop = steps(state)
        next(loop)  # ReadClock
        first = loop.send(self.clock())
        loop.close()
        assert isinstance(first, SaveCheckpoint) and first.header is not None
        owner = owners.new_owner()
        store.create_run(
            state.run_id,
            first.header,
            owner,
            [],
            Checkpoint(first.snapshot, first.messages),
        )
        store.release(state.run_id, owner)  # announces it to the workers
        return state.run_id

    def _carry_context(self, carrier: dict[str, str]) -> None:
        """The caller's trace context into a submitted run's carrier, from each
        interceptor that propagates one (``inject_context``: ``fsm_agent.otel``), so the
        worker that drives it continues the caller's trace. One that raises is counted
        and changes nothing, as any interceptor's failure."""
        for each in self._interceptors.all:
            inject = getattr(each, "inject_context", None)
            if callable(inject):
                try:
                    inject(carrier)
                except Exception as exc:
                    self._interceptors.failed(each, "inject_context", "submit", exc)

    # ── durable runs: resume and review (docs/concepts/durable-runs.md) ───────────────

    def resume(self, run_id: str, *, model: Model | None = None) -> RunResult:
        """Continue a stored run from its last checkpoint with this runtime's model and
        tools (after a crash, or after reviewers settled a ``review_required`` run).

        A write that was running when the process died is never run again: the run stops
        in ``review_required/outcome_unknown``. A terminal run, or one still waiting for
        a reviewer, is returned as stored. Raises ``RunNotFound``, ``RunBusy`` (another
        live owner drives it), ``MachineMismatch`` or ``StoreError``, changing nothing.
        """
        model = self._sync_model(model, "resume")
        state, owner, encoder, sink, cancel = self._restore(run_id)
        return self._drive(
            state, model, sink, resumed=True, owner=owner, encoder=encoder, cancel=cancel
        )

    async def aresume(
        self, run_id: str, *, model: Model | None = None, claimed_by: str | None = None
    ) -> RunResult:
        """:meth:`resume` for async models and tools. ``claimed_by``: the owner token of
        a claim the caller already holds on the run (a worker's: ``runtime/worker.py``)."""
        model = self._model_for(model)
        state, owner, encoder, sink, cancel = self._restore(run_id, claimed_by)
        return await self._adrive(
            state, model, sink, resumed=True, owner=owner, encoder=encoder, cancel=cancel
        )

    def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        by: str | None = None,
        note: str | None = None,
        at: str | None = None,
        resume: bool = False,
        arguments: Mapping[str, Any] | None = None,
        seen: StoredRun | None = None,
    ) -> RunResult:
        """Approve a paused call (that call, once, for its exact arguments).

        Records the decision in the store and returns at once with the run as stored
        (still ``review_required``; ``pending`` shows what waits). A worker then drives
        it, or :meth:`resume` (``await aresume(...)``); ``resume=True`` does that here.
        ``by``: who decided; ``note``: why; ``at``: when (ISO-8601 UTC, default now).
        ``arguments``: approve the call with these corrected arguments instead (an
        ``edit``): validated now against the tool's schema (``ReviewError`` if they do
        not fit, nothing recorded), bound by their own digest, and admitted afresh when
        the run resumes; the ``review`` event records them with the original ones.
        ``seen``: the run as the caller read it (``store.load_run``) to decide: judged
        on that version and written only while the run is still it, in one round trip
        (one commit on SQLite) instead of two; where it moved on, judged again on the
        run as stored (``docs/concepts/durable-runs.md``).
        """
        if arguments is not None:
            return self._review(run_id, call_id, "edit", by, note, at, resume,
                                arguments=arguments, seen=seen)  # fmt: skip
        return self._review(run_id, call_id, "approve", by, note, at, resume, seen=seen)

    def deny(
        self,
        run_id: str,
        call_id: str,
        reason: str,
        *,
        by: str | None = None,
        note: str | None = None,
        at: str | None = None,
        resume: bool = False,
        seen: StoredRun | None = None,
    ) -> RunResult:
        """Answer a paused call as denied (the model sees ``reason``); as :meth:`approve`."""
        return self._review(run_id, call_id, "deny", by, note, at, resume, reason=reason,
                            seen=seen)  # fmt: skip

    def reconcile(
        self,
        run_id: str,
        call_id: str,
        result: Any,
        *,
        by: str | None = None,
        note: str | None = None,
        at: str | None = None,
        resume: bool = False,
        seen: StoredRun | None = None,
    ) -> RunResult:
        """Settle an ``outcome_unknown`` write with the result observed outside (e.g. the
        ticket exists); the write is not run again. As :meth:`approve`."""
        return self._review(run_id, call_id, "reconcile", by, note, at, resume, result=result,
                            seen=seen)  # fmt: skip

    def _review(
        self,
        run_id: str,
        call_id: str,
        action: str,
        by: str | None,
        note: str | None,
        at: str | None,
        resume: bool,
        **decision: Any,
    ) -> RunResult:
        if resume:
            self._sync_model(None, "resume")  # refused before anything is recorded
        chain = self._interceptors.for_run()
        # The review's edge reaches the interceptors' on_event like any other (a misfit's
        # fallback edge too, though it stores nothing).
        observe = None if chain is None or not chain.watchers else partial(chain.deliver, run_id)
        _, state = review.record(self.store, run_id, call_id, action, key=self._trace_key,
                                 reviewer=by, note=note, at=at, machines=self.machines,
                                 observe=observe, **decision)  # fmt: skip
        return self.resume(run_id) if resume else result_of(state)

    # ── set-up ────────────────────────────────────────────────────────────────────

    def _model_for(self, model: Model | None) -> Model:
        if model is None:
            return self.model
        if not callable(model):
            raise ConfigError(f"model must be callable as (messages, tool_specs), got {model!r}")
        return model

    def _sync_model(self, model: Model | None, what: str) -> Model:
        """The model for a synchronous drive; refuses what only the async methods can
        drive, before anything is recorded."""
        model = self._model_for(model)
        blocking = [t.name for t in self.tools if t.name in self.allowed_tools and t.is_async]
        if _is_async_callable(model) or blocking:
            which = f"async tools {blocking}" if blocking else "an async model"
            raise ConfigError(f"{what}() cannot drive {which}; use 'await runtime.a{what}(...)'")
        return model

    def config(
        self,
        allowed: frozenset[str] | None = None,
        budget: Budget | None = None,
        retry: RetryPolicy | None = None,
        policy: Policy | None = None,
        *,
        emit: bool = False,
        machine: Machine | None = None,
    ) -> RunConfig:
        """The :class:`RunConfig` of a run of this runtime (a resumed run passes the
        settings and the machine it started with)."""
        allowed = self.allowed_tools if allowed is None else allowed
        store = self.store
        return RunConfig(
            budget=budget or self.budget,
            retry=retry or self.retry,
            policy=policy or self.policy,
            allowed=allowed,
            tools=self.tools.lookup,
            tool_specs=[t.spec() for t in self.tools if t.name in allowed],
            approvals=self._book,
            save=getattr(store, "save_mode", "writes") if supports_runs(store) else "never",
            emit=emit,
            header={"tools": self._tool_facts, "integrity": chain.mode_for(self._trace_key)},
            redact=self.redact,
            machine=machine or self.machine,
            rules=self._rule_sets.get((machine or self.machine).hash),
        )

    def _new_run(
        self,
        task: str | list[dict[str, Any]],
        run_id: str | None,
        trace: TraceArg,
        *,
        traced: bool = True,
        context: dict[str, Any] | None = None,
    ) -> tuple[RunState, TraceSink | None]:
        messages = initial_messages(task)
        facts = check_context(context)
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ConfigError(f"run_id must be a non-empty string, got {run_id!r}")
        run_id = run_id or uuid.uuid4().hex
        if trace is None and self.trace_dir is not None and traced:
            trace = self.trace_dir / f"{run_id}.jsonl"
        sink: TraceSink | None = (
            JsonlTrace(trace) if isinstance(trace, (str, os.PathLike)) else trace
        )
        state = RunState(
            run_id=run_id, config=self.config(emit=sink is not None), messages=messages
        )
        state.context = facts
        start(state)
        return state, sink

    def _restore(
        self, run_id: str, claimed_by: str | None = None
    ) -> tuple[RunState, str, Encoder | None, TraceSink | None, CancelRequest | None]:
        """The claimed, rebuilt run; with a ``trace_dir``, its file continued (it then holds
        the whole run: ``runtime/trace_files.py``) as the sink of the rest of the run; and
        the cancel asked of it, read with it."""
        store = self.store
        if not supports_runs(store):
            raise StoreError(
                f"{type(store).__name__} does not keep runs; "
                "use a MemoryStore, SqliteStore or PostgresStore"
            )
        state, owner, tail, cancel = restore_run(
            store,
            run_id,
            self.config,
            claimed_by=claimed_by,
            machines=self.machines,
            rebuild=self._rebuild,
        )
        sink: TraceSink | None = None
        try:
            adopted = self._adopt(state, owner)
            if self.trace_dir is not None and adopted:
                # A submitted run's trace starts with this driver: a new file, as run()'s
                # (encoded with the store's lines, one chain for both).
                sink = JsonlTrace(self.trace_dir / f"{run_id}.jsonl")
                state.config = replace(state.config, emit=True)
            encoder = self._encoder(state, sink, tail)
            if self.trace_dir is not None and state.events and not adopted:
                sink, file_chain = continue_trace_file(
                    self.trace_dir, run_id, state.events, self._trace_key
                )
                state.config = replace(state.config, emit=True)
                encoder = self._file_encoder(state, encoder, file_chain)
            return state, owner, encoder, sink, cancel
        except BaseException:
            if sink is not None:
                sink.close()
            owners.let_go(store, run_id, owner)
            raise

    def _file_encoder(
        self, s: RunState, store_encoder: Encoder | None, file_chain: Chain | None
    ) -> Encoder | None:
        """One encoder for the continued file and a store that keeps lines: each event is
        encoded once and both get the same line. It continues the file's chain, which is
        the store's too when the store's lines are chained (the file was checked to be
        the store's events under the same key); a store whose lines carry no links (a
        run recorded without them) takes the file's from here on."""
        if file_chain is None:
            return store_encoder
        to_store = s.config.save != "never" and getattr(self.store, "wants_lines", False)
        return Encoder(file_chain, 1 + int(to_store))

    def _rebuild(self, header: Mapping[str, Any], recorded: str) -> Machine | None:
        """The machine of a run begun under other rules than this runtime's, rebuilt
        from the rules its header records with this runtime's tools and callables; it
        resumes under those rules. A recorded callable this runtime does not hold stops
        the resume (``MachineMismatch``), naming the rule and both machines' hashes."""
        data = header.get("rules")
        if not isinstance(data, Mapping):
            return None
        callables = [r.when for r in (self.rules.rules if self.rules else ()) if callable(r.when)]
        try:
            rules = RuleSet.from_json(data, {t.name: t for t in self.tools}, callables=callables)
        except ConfigError as exc:
            raise MachineMismatch(
                f"the run was begun by machine {recorded} under rules this runtime "
                f"(machine {self.machine.hash}) cannot rebuild: {exc}"
            ) from None
        machine = rules_machine(rules, self._base_machine)
        if machine.hash != recorded:
            return None
        self._rule_sets[machine.hash] = rules
        self.machines.setdefault(machine.hash, machine)
        return machine

    def _adopt(self, s: RunState, owner: str) -> bool:
        """A run submitted and never driven has no trace yet: its first driver starts
        it, recording what governs the run (this runtime's approvals, tools' facts and
        trace key; the submitter's budget, retry, policy and allow-list, narrowed to
        this runtime's), in the stored header too. The run_start goes in with the
        driver's first save, chained under this runtime's key. Whether it did so."""
        if s.events or s.seq != 0 or s.state != s.config.machine.initial:
            return False
        adopt = getattr(self.store, "adopt_run", None)
        if adopt is not None and not adopt(s.run_id, owner, s.config.header_fields()):
            # Events appeared under a claim this driver holds: nothing to continue from.
            raise StoreError(
                f"run {s.run_id!r}: its trace began while this driver was claiming it; "
                "resume it again"
            )
        start(s)
        s.emitted = s.saved_events = 0
        return True

    def _encoder(
        self, s: RunState, sink: TraceSink | None, tail: list[dict[str, Any]] | None = None
    ) -> Encoder | None:
        """What encodes the run's events into chained lines, if anything wants lines: a
        sink that writes lines, a store that keeps JSON text. ``None`` on the in-memory
        path (no sink, ``MemoryStore``): nothing is encoded there."""
        consumers = int(sink is not None and hasattr(sink, "write_line"))
        if s.config.save != "never" and getattr(self.store, "wants_lines", False):
            consumers += 1
        if not consumers or not s.events:
            return None
        return chain.continue_chain(s.run_id, s.events[0], tail or [], self._trace_key, consumers)

    @staticmethod
    def _result(s: RunState) -> RunResult:
        return result_of(s)

    # ── driving ───────────────────────────────────────────────────────────────────

    def _io(
        self,
        s: RunState,
        model: Model,
        sink: TraceSink | None,
        owner: str | None,
        encoder: Encoder | None,
    ) -> Io:
        chain = self._interceptors.for_run()
        if chain is not None and chain.watchers and not s.config.emit:
            # Its events go to the interceptors as they happen (``EmitEvents``).
            s.config = dataclasses.replace(s.config, emit=True)
        return Io.of(s, model=model, clock=self.clock, sleep=self.sleep, threads=self._threads,
                     store=self.store, owner=owner, sink=sink, encoder=encoder,
                     chain=chain)  # fmt: skip

    def _drive(
        self,
        s: RunState,
        model: Model,
        sink: TraceSink | None,
        *,
        resumed: bool,
        owner: str | None = None,
        encoder: Encoder | None = None,
        cancel: CancelRequest | None = None,
    ) -> RunResult:
        io = self._io(s, model, sink, owner, encoder)
        since = len(s.messages)
        s.call_ids = call_ids(s.messages)  # (the loop notes an id that comes back)
        with Driving(self.store, s, io, cancel):
            SyncDriver(io).drive(steps(s, resumed=resumed))
        result = self._result(s)
        if s.call_id_repeated:  # else no call can repeat one: the pass is skipped
            result.warnings = warn_repeated_calls(s.run_id, s.messages, since)
        return result

    async def _adrive(
        self,
        s: RunState,
        model: Model,
        sink: TraceSink | None,
        *,
        resumed: bool,
        owner: str | None = None,
        encoder: Encoder | None = None,
        cancel: CancelRequest | None = None,
    ) -> RunResult:
        io = self._io(s, model, sink, owner, encoder)
        since = len(s.messages)
        s.call_ids = call_ids(s.messages)  # (the loop notes an id that comes back)
        with Driving(self.store, s, io, cancel):
            await AsyncDriver(io).drive(steps(s, resumed=resumed))
        result = self._result(s)
        if s.call_id_repeated:  # else no call can repeat one: the pass is skipped
            result.warnings = warn_repeated_calls(s.run_id, s.messages, since)
        return result


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value
