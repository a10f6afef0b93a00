"""The runtime: the I/O shell around the machine.

It asks the model, calls tools, sleeps between retries and reads the clock; the run
(``run.py``) decides everything else through the machine. ``run()`` and ``arun()`` drive
the same generator, so both obey every rule identically.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable
from pathlib import Path
from typing import Any, Literal

from fsm_agent.core.approvals import Approval
from fsm_agent.core.budget import Budget, RetryPolicy
from fsm_agent.core.history import check_history
from fsm_agent.core.loop import Run
from fsm_agent.core.requests import ModelRequest, Request, SleepRequest, ToolOutcome, ToolRequest
from fsm_agent.durable import journal as durable
from fsm_agent.durable import review
from fsm_agent.durable.store import MemoryStore, Store
from fsm_agent.errors import ConfigError, ToolRejected, TransientToolError
from fsm_agent.runtime.context import reset_deadline, set_deadline
from fsm_agent.runtime.result import RunResult
from fsm_agent.trace.io import JsonlTrace, Redactor, TraceSink

__all__ = ["Model", "Runtime"]

Model = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Any]
Policy = Literal["default", "strict"]
TraceArg = str | os.PathLike[str] | TraceSink | None


def _is_async_callable(fn: Any) -> bool:
    # An instance with an async __call__ counts too.
    call = getattr(fn, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class Runtime:
    """Runs agent loops under the rules of SPEC §2. Configuration errors raise ValueError.

    ``allowed_tools`` is the trusted caller's allow-list: nothing a model writes widens it.
    ``approvals`` bind a write tool to exact arguments. ``store`` keeps idempotency
    records across runs (a fresh :class:`MemoryStore` per runtime by default). ``trace_dir``
    writes one ``<run_id>.jsonl`` per run; ``redact`` rewrites each event before it leaves.
    ``clock`` and ``sleep`` exist so tests can run backoffs and deadlines without waiting.
    """

    def __init__(
        self,
        *,
        model: Model,
        tools: Any,
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
    ) -> None:
        from fsm_agent.tools.registry import ToolRegistry

        if not callable(model):
            raise ConfigError(f"model must be callable as (messages, tool_specs), got {model!r}")
        if not isinstance(tools, ToolRegistry):
            raise ConfigError("tools must be a ToolRegistry")
        if isinstance(allowed_tools, str):
            raise ConfigError("allowed_tools must be a collection of tool names, not one string")
        allowed = frozenset(allowed_tools)
        unknown = sorted(allowed - set(tools.names()))
        if unknown:
            raise ConfigError(
                f"allowed_tools names unregistered tools: {', '.join(unknown)} "
                f"(registered: {', '.join(tools.names()) or 'none'})"
            )
        approvals = tuple(approvals)
        for a in approvals:
            if not isinstance(a, Approval):
                raise ConfigError(f"approvals must be Approval objects, got {a!r}")
            if a.tool not in tools:
                raise ConfigError(f"approval for unregistered tool {a.tool!r}")
        if policy not in ("default", "strict"):
            raise ConfigError(f"policy must be 'default' or 'strict', got {policy!r}")
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigError(f"budget must be a Budget, got {budget!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, got {retry!r}")
        if redact is not None and not callable(redact):
            raise ConfigError("redact must be a function of one event")
        self.model = model
        self.tools = tools
        self.allowed_tools = allowed
        self.budget = budget or Budget()
        self.retry = retry or RetryPolicy()
        self.approvals = approvals
        self.policy: Policy = policy
        self.store: Store = store if store is not None else MemoryStore()
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.redact = redact
        self.clock = clock
        self.sleep = sleep
        self._approved = frozenset(a.digest for a in approvals)
        self._specs = [t.spec() for t in tools if t.name in allowed]
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    # ── public entry points ───────────────────────────────────────────────────────

    def run(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        trace: TraceArg = None,
        model: Model | None = None,
    ) -> RunResult:
        """Run to a terminal state synchronously. Bad model output never raises.

        ``model`` replaces the runtime's model for this run only (same tools, store and
        policy); ``trace`` is a path or a sink for this run's events.
        """
        model = self._model_for(model)
        blocking = [t.name for t in self.tools if t.name in self.allowed_tools and t.is_async]
        if _is_async_callable(model) or blocking:
            what = f"async tools {blocking}" if blocking else "an async model"
            raise ConfigError(f"run() cannot drive {what}; use 'await runtime.arun(...)'")
        run, sink = self._new_run(task, run_id, trace)
        return self._drive(run, run.steps(), model, sink)

    async def arun(
        self,
        task: str | list[dict[str, Any]],
        *,
        run_id: str | None = None,
        trace: TraceArg = None,
        model: Model | None = None,
    ) -> RunResult:
        """Run to a terminal state; sync or async models and tools both work."""
        model = self._model_for(model)
        run, sink = self._new_run(task, run_id, trace)
        return await self._adrive(run, run.steps(), model, sink)

    # ── durable runs: resume and review (SPEC §5; the logic lives in durable.py) ──

    def resume(self, run_id: str, *, model: Model | None = None) -> RunResult:
        """Continue a stored run from its last checkpoint with this runtime's model and
        tools (after a crash, or after reviewers settled a ``review_required`` run).

        A write that was running when the process died is never run again: the run stops
        in ``review_required/outcome_unknown``. A terminal run, or one still waiting for
        a reviewer, is returned as stored. Raises ``RunNotFound``, ``RunBusy`` (another
        live process drives it) or ``StoreError``, changing nothing in the store.
        """
        model = self._sync_model(model)
        run, journal = durable.prepare_resume(self, run_id)
        return self._drive(run, durable.steps(run), model, journal)

    async def aresume(self, run_id: str, *, model: Model | None = None) -> RunResult:
        """:meth:`resume` for async models and tools."""
        model = self._model_for(model)
        run, journal = durable.prepare_resume(self, run_id)
        return await self._adrive(run, durable.steps(run), model, journal)

    def approve(self, run_id: str, call_id: str) -> RunResult:
        """Approve a paused call for its exact arguments, then :meth:`resume`.
        (Async runtimes: ``review.record_review(...)``, then ``await aresume(...)``.)"""
        self._sync_model(None)
        review.record_review(self.store, run_id, call_id, "approve")
        return self.resume(run_id)

    def deny(self, run_id: str, call_id: str, reason: str) -> RunResult:
        """Answer a paused call as denied (the model sees ``reason``), then :meth:`resume`."""
        self._sync_model(None)
        review.record_review(self.store, run_id, call_id, "deny", reason=reason)
        return self.resume(run_id)

    def reconcile(self, run_id: str, call_id: str, result: Any) -> RunResult:
        """Settle an ``outcome_unknown`` write with the result observed outside (e.g. the
        ticket exists), then :meth:`resume`; the write is not run again."""
        self._sync_model(None)
        review.record_review(self.store, run_id, call_id, "reconcile", result=result)
        return self.resume(run_id)

    def _sync_model(self, model: Model | None) -> Model:
        """The model for a synchronous resume; refuses what only ``aresume`` can drive
        before anything is recorded."""
        model = self._model_for(model)
        blocking = [t.name for t in self.tools if t.name in self.allowed_tools and t.is_async]
        if _is_async_callable(model) or blocking:
            what = f"async tools {blocking}" if blocking else "an async model"
            raise ConfigError(f"resume() cannot drive {what}; use 'await runtime.aresume(...)'")
        return model

    # ── set-up and results ────────────────────────────────────────────────────────

    def _model_for(self, model: Model | None) -> Model:
        if model is None:
            return self.model
        if not callable(model):
            raise ConfigError(f"model must be callable as (messages, tool_specs), got {model!r}")
        return model

    def _new_run(
        self, task: str | list[dict[str, Any]], run_id: str | None, trace: TraceArg
    ) -> tuple[Run, TraceSink | None]:
        if isinstance(task, str):
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        elif isinstance(task, list) and task and all(isinstance(m, dict) for m in task):
            messages = [dict(m) for m in task]
            problems = check_history(messages)
            if problems:
                raise ConfigError("task messages are not a valid history: " + "; ".join(problems))
        else:
            raise ConfigError("task must be a string or a non-empty list of message dicts")
        run_id = run_id or uuid.uuid4().hex
        if trace is None and self.trace_dir is not None:
            trace = self.trace_dir / f"{run_id}.jsonl"
        sink: TraceSink | None = (
            JsonlTrace(trace) if isinstance(trace, (str, os.PathLike)) else trace
        )
        run = Run(
            run_id=run_id,
            messages=messages,
            registry=self.tools,
            allowed=self.allowed_tools,
            approved=self._approved,
            tool_specs=self._specs,
            budget=self.budget,
            retry=self.retry,
            policy=self.policy,
            store=self.store,
            clock=self.clock,
            sink=sink,
            redact=self.redact,
        )
        run.start(
            {
                "tools": {
                    t.name: {
                        "effect": t.effect,
                        "requires_approval": t.requires_approval,
                        "idempotent": t.idempotency_key is not None,
                        "dedup": t.dedup,
                        "timeout_s": t.timeout_s,
                    }
                    for t in self.tools
                }
            }
        )
        return run, durable.attach(self, run, sink)  # checkpoints if the store keeps runs

    @staticmethod
    def _result(run: Run) -> RunResult:
        return RunResult(
            run_id=run.run_id,
            status=run.status or run.state,
            reason=run.reason or "",
            answer=run.answer,
            messages=run.messages,
            events=run.events,
            counters=run.counters.as_dict(),
            detail=run.detail,
            pending=dict(run.placeholders),
        )

    # ── the drivers: answer the loop's requests until it ends ────────────────────

    def _drive(
        self,
        run: Run,
        steps: Generator[Request, Any, None],
        model: Model,
        closing: TraceSink | None,
    ) -> RunResult:
        try:
            request = next(steps)
            while True:
                request = steps.send(self._do(request, run, model))
        except StopIteration:
            pass
        except KeyboardInterrupt:
            run.cancel()  # the trace ends cleanly and every open call is answered
            raise
        finally:
            if closing is not None:
                closing.close()
        return self._result(run)

    async def _adrive(
        self,
        run: Run,
        steps: Generator[Request, Any, None],
        model: Model,
        closing: TraceSink | None,
    ) -> RunResult:
        import asyncio  # here, not at module level: sync users never load it

        try:
            request = next(steps)
            while True:
                request = steps.send(await self._ado(request, run, model))
        except StopIteration:
            pass
        except (asyncio.CancelledError, KeyboardInterrupt):
            run.cancel()
            raise
        finally:
            if closing is not None:
                closing.close()
        return self._result(run)

    # ── the sync driver ───────────────────────────────────────────────────────────

    def _deadline(self, run: Run) -> float | None:
        limit = self.budget.max_wall_clock_s
        if limit is None:
            return None
        # The run's clock may be a test clock; adapters measure on time.monotonic().
        return time.monotonic() + max(limit - (self.clock() - run.started), 0.0)

    def _do(self, request: Request, run: Run, model: Model) -> Any:
        if isinstance(request, ModelRequest):
            token = set_deadline(self._deadline(run))
            try:
                reply = model(request.messages, request.tool_specs)
            except BaseException as exc:
                if _propagates(exc):
                    raise
                return exc
            finally:
                reset_deadline(token)
            if inspect.isawaitable(reply):
                _close(reply)
                return TypeError("the model returned an awaitable; use runtime.arun()")
            return reply
        if isinstance(request, ToolRequest):
            return self._call_tool(request)
        assert isinstance(request, SleepRequest)
        (self.sleep or time.sleep)(request.seconds)
        return None

    def _call_tool(self, request: ToolRequest) -> ToolOutcome:
        call, timeout = request.call, request.timeout_s
        fn = call.tool.fn  # type: ignore[union-attr]
        kwargs = call.arguments or {}
        try:
            if timeout is None:
                value = fn(**kwargs)
            else:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=4, thread_name_prefix="fsm-agent-tool"
                    )
                future = self._executor.submit(fn, **kwargs)
                try:
                    value = future.result(timeout=timeout)
                except concurrent.futures.TimeoutError:
                    # The thread cannot be killed; it runs on, and a write may still land.
                    return ToolOutcome("timeout", error=f"no result within {timeout:.3f}s")
            if inspect.isawaitable(value):
                _close(value)
                return ToolOutcome("error", error="the tool returned an awaitable; use arun()")
            return ToolOutcome("ok", value)
        except BaseException as exc:
            if _propagates(exc):
                raise
            return _classify(exc)

    # ── the async driver ──────────────────────────────────────────────────────────

    async def _ado(self, request: Request, run: Run, model: Model) -> Any:
        import asyncio

        if isinstance(request, ModelRequest):
            token = set_deadline(self._deadline(run))
            try:
                reply = model(request.messages, request.tool_specs)
                if inspect.isawaitable(reply):
                    reply = await reply
            except BaseException as exc:
                if _propagates(exc):
                    raise
                return exc
            finally:
                reset_deadline(token)
            return reply
        if isinstance(request, ToolRequest):
            return await self._acall_tool(request)
        assert isinstance(request, SleepRequest)
        if self.sleep is not None:
            slept = self.sleep(request.seconds)
            if inspect.isawaitable(slept):
                await slept
        else:
            await asyncio.sleep(request.seconds)
        return None

    async def _acall_tool(self, request: ToolRequest) -> ToolOutcome:
        import asyncio

        call, timeout = request.call, request.timeout_s
        tool = call.tool
        assert tool is not None
        kwargs = call.arguments or {}
        try:
            pending: Awaitable[Any]
            if tool.is_async:
                pending = tool.fn(**kwargs)
            elif timeout is None:
                return ToolOutcome("ok", tool.fn(**kwargs))
            else:
                pending = asyncio.to_thread(tool.fn, **kwargs)
            try:
                value = await asyncio.wait_for(pending, timeout)
            except asyncio.TimeoutError:
                return ToolOutcome("timeout", error=f"no result within {timeout:.3f}s")
            return ToolOutcome("ok", value)
        except BaseException as exc:
            if _propagates(exc):
                raise
            return _classify(exc)


def _propagates(exc: BaseException) -> bool:
    """KeyboardInterrupt, GeneratorExit, asyncio's CancelledError and the like belong to
    the process and its event loop, not to the tool or model that was running; anything
    else a tool raises (SystemExit included) is that tool's outcome."""
    return not isinstance(exc, (Exception, SystemExit))


def _classify(exc: BaseException) -> ToolOutcome:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ToolRejected):
        return ToolOutcome("rejected", error=text)
    if isinstance(exc, TransientToolError):
        return ToolOutcome("transient", error=text)
    if isinstance(exc, TimeoutError):  # asyncio's own timeout is handled in _acall_tool
        return ToolOutcome("timeout", error=text)
    return ToolOutcome("error", error=text)


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
