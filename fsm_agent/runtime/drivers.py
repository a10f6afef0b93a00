"""The drivers: the only code that performs the loop's requests (all of fsm-agent's I/O).

:class:`SyncDriver` answers each request of :func:`fsm_agent.core.loop.steps` in the
calling thread; :class:`AsyncDriver` awaits them, running a blocking store's operations
in a worker thread (a non-blocking one such as ``MemoryStore`` is called inline: no
thread hop per event), so ``arun()`` never blocks its event loop on a store.

Stopping. When performing a request raises — Ctrl-C, a cancelled task, a tool raising
``GeneratorExit`` or another ``BaseException``, a ``StoreError`` (disk full, lock
timeout, a fenced owner), a trace file that cannot be written — the driver throws
:class:`~fsm_agent.core.loop.Cancelled` into the loop, which takes the ``cancel`` edge so
every open call is answered and ``run_end`` is written; the driver performs what the loop
still asks (best effort: a store or sink that failed is not asked again, so a store keeps
its last good checkpoint and the run can be resumed from there) and then re-raises the
first exception. Model and tool failures that are *outcomes* (an ``Exception`` or
``SystemExit`` from a model or tool) never stop the driver: the loop is sent them.

Timeouts count from the moment a tool starts (R11). A sync tool with ``timeout_s`` runs
on a thread of its own, at most ``ToolThreads.limit`` at once per runtime; a call that
cannot start within its timeout (every thread busy with hung calls) is never started and
answered ``not_executed``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from fsm_agent.core.loop import Cancelled, Steps
from fsm_agent.core.requests import (
    AbortIntent,
    AskModel,
    BeginIntent,
    CallTool,
    CommitIntent,
    ConsumeApproval,
    EmitEvents,
    IntentClaim,
    LoadIntent,
    ReadClock,
    Request,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
)
from fsm_agent.core.state import RunState
from fsm_agent.durable import owners
from fsm_agent.durable.resume import Heartbeat
from fsm_agent.durable.store import ApprovalStore, Checkpoint, RunSave, RunStore, Store
from fsm_agent.errors import ToolRejected, TransientToolError
from fsm_agent.runtime.context import reset_deadline, set_deadline
from fsm_agent.trace.chain import Encoder
from fsm_agent.trace.io import TraceSink

__all__ = ["AsyncDriver", "Driving", "Io", "SyncDriver", "ToolThreads", "outcome_of", "propagates"]

Model = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Any]


class ToolThreads:
    """Threads for sync tools with a timeout: each call starts on a thread of its own, so
    its timeout never counts time spent waiting behind other calls."""

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def try_start(
        self, fn: Callable[..., Any], kwargs: dict[str, Any], wait_s: float
    ) -> concurrent.futures.Future[Any] | None:
        """Start ``fn(**kwargs)`` on a new thread within ``wait_s`` seconds, or ``None``
        (nothing started) if every slot stays busy that long."""
        if not self._slots.acquire(timeout=max(wait_s, 0.0)):
            return None
        return self._start(fn, kwargs)

    def try_start_now(
        self, fn: Callable[..., Any], kwargs: dict[str, Any]
    ) -> concurrent.futures.Future[Any] | None:
        return self._start(fn, kwargs) if self._slots.acquire(blocking=False) else None

    def _start(
        self, fn: Callable[..., Any], kwargs: dict[str, Any]
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(**kwargs))
            except BaseException as exc:  # handed to the waiting driver
                future.set_exception(exc)
            finally:
                self._slots.release()

        future.set_running_or_notify_cancel()
        threading.Thread(target=run, name="fsm-agent-tool", daemon=True).start()
        return future


@dataclass
class Io:
    """What one driving of one run performs requests against."""

    @classmethod
    def of(cls, s: RunState, **parts: Any) -> Io:
        """The I/O of run ``s``: its deadline is the run's wall-clock budget, measured on
        ``time.monotonic()`` (the run's clock may be a test clock)."""
        limit = s.config.budget.max_wall_clock_s

        def deadline(now: float) -> float | None:
            if limit is None:
                return None
            return time.monotonic() + max(limit - (now - s.started), 0.0)

        # A run its store keeps is fenced: see ``fenced`` below.
        return cls(run_id=s.run_id, deadline=deadline, fenced=s.config.save != "never", **parts)

    run_id: str
    model: Model
    clock: Callable[[], float]
    sleep: Callable[[float], Any] | None
    threads: ToolThreads
    deadline: Callable[[float], float | None]
    store: Store | None = None
    owner: str | None = None
    sink: TraceSink | None = None
    #: The store keeps this run: every intent operation carries ``(run_id, owner)`` so
    #: the store refuses it once another driver took the run over (R11 fencing).
    fenced: bool = False
    #: Encodes each event once as its chained line, for the sink and a store that keeps
    #: JSON text (``None``: neither wants lines, and nothing is encoded).
    encoder: Encoder | None = None
    # Set when a store or sink failed while the run was stopping: not asked again.
    broken: set[str] = field(default_factory=set)


def propagates(exc: BaseException) -> bool:
    """KeyboardInterrupt, GeneratorExit, asyncio's CancelledError and other non-Exception
    BaseExceptions belong to the process and its event loop, not to the tool or model
    that was running: they stop the run (cleanly) and propagate. Anything else a tool or
    model raises (SystemExit included) is that call's outcome."""
    return not isinstance(exc, (Exception, SystemExit))


def _text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises
        return f"{type(exc).__name__}: <unprintable>"


def outcome_of(exc: BaseException) -> ToolOutcome:
    """The outcome of a tool that raised ``exc``."""
    text = _text(exc)
    if isinstance(exc, ToolRejected):
        return ToolOutcome("rejected", error=text)
    if isinstance(exc, TransientToolError):
        return ToolOutcome("transient", error=text)
    if isinstance(exc, TimeoutError):
        return ToolOutcome("timeout", error=text)
    return ToolOutcome("error", error=text)


#: What models and tools return in the common case: never awaitable, so not inspected.
_PLAIN = (dict, list, str, int, float, type(None))

_STORE_REQUESTS = (
    SaveCheckpoint,
    BeginIntent,
    CommitIntent,
    AbortIntent,
    LoadIntent,
    ConsumeApproval,
)


def _creates_run(request: Request) -> bool:
    return isinstance(request, SaveCheckpoint) and request.header is not None


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


class _Driver:
    """What both drivers share: the store, sink and clock operations, and stopping."""

    def __init__(self, io: Io) -> None:
        self.io = io

    def store_op(self, request: Request) -> Any:
        store = self.io.store
        if store is None:
            raise RuntimeError(f"{type(request).__name__} needs a store")  # a loop bug
        # Only a store that keeps runs is asked to fence (an idempotency-only store may
        # not know the keyword).
        fence: dict[str, Any] = (
            {"fence": (self.io.run_id, self.io.owner or "")} if self.io.fenced else {}
        )
        if isinstance(request, BeginIntent):
            riding = self.riding(request.save)
            if riding is not None:  # only a store that keeps runs gets a save
                fence["save"] = riding
            return store.begin_intent(request.record, take_over=request.take_over, **fence)
        if isinstance(request, CommitIntent):
            return store.commit_intent(
                request.tool, request.key, request.owner, request.result, **fence
            )
        if isinstance(request, AbortIntent):
            return store.abort_intent(request.tool, request.key, request.owner, **fence)
        if isinstance(request, LoadIntent):
            return store.get_intent(request.tool, request.key)
        if isinstance(request, ConsumeApproval):
            # (Runtime checked at construction that a store with limited approvals counts
            # them.) Not fenced: a use is keyed by (approval, run, call), so a stalled
            # driver and the one that took its run over spend the same single use.
            return cast(ApprovalStore, store).consume_approval(
                request.approval_id, request.max_uses, request.run_id, request.call_id
            )
        assert isinstance(request, SaveCheckpoint)
        checkpoint = self.checkpoint(request)
        owner = self.io.owner or ""
        runs = cast(RunStore, store)  # the loop saves only when the store keeps runs
        if request.header is not None:
            return runs.create_run(
                self.io.run_id, request.header, owner, request.events, checkpoint
            )
        return runs.save(self.io.run_id, owner, request.events, checkpoint)

    def riding(self, save: SaveCheckpoint | None) -> RunSave | None:
        """A checkpoint that goes in with an intent operation, as the store takes it."""
        if save is None:
            return None
        return RunSave(self.io.run_id, self.io.owner or "", save.events, self.checkpoint(save))

    def checkpoint(self, save: SaveCheckpoint) -> Checkpoint:
        """The checkpoint of ``save``, with its events' chained lines for a store that
        keeps JSON text (encoded once: the sink gets the same lines)."""
        encoder = self.io.encoder
        lines = None
        if encoder is not None and getattr(self.io.store, "wants_lines", False):
            lines = encoder.lines(save.events)
        return Checkpoint(save.snapshot, save.messages, lines)

    def emit(self, request: EmitEvents) -> None:
        sink = self.io.sink
        if sink is None:
            return
        write_line = getattr(sink, "write_line", None)
        encoder = self.io.encoder
        if encoder is not None and write_line is not None:
            for line in encoder.lines(request.events):
                write_line(line)
        else:  # a sink of event dicts
            for event in request.events:
                sink.write(event)

    def broke(self, request: Request) -> None:
        """A store or sink operation failed: that one is not asked again in this driving
        (a store keeps its last good checkpoint, from which the run can be resumed)."""
        if isinstance(request, EmitEvents):
            self.io.broken.add("sink")
        elif isinstance(request, _STORE_REQUESTS):
            self.io.broken.add("store")

    def fallback(self, request: Request, exc: BaseException) -> Any:
        """The answer to a request that failed while the run was stopping."""
        self.broke(request)
        if isinstance(request, ReadClock):
            return 0.0
        if isinstance(request, BeginIntent):
            return IntentClaim(False, None)
        if isinstance(request, ConsumeApproval):
            return False  # not granted: the call does not run
        if isinstance(request, CallTool):
            return ToolOutcome("not_started", error="the run was stopping")
        return None

    def skipped(self, request: Request) -> bool:
        broken = self.io.broken
        if "sink" in broken and isinstance(request, EmitEvents):
            return True
        return "store" in broken and isinstance(request, _STORE_REQUESTS)


class SyncDriver(_Driver):
    """Performs every request in the calling thread."""

    def drive(self, steps: Steps) -> None:
        failure: BaseException | None = None
        request = next(steps)
        while True:
            try:
                if failure is not None and self.skipped(request):
                    answer = self.fallback(request, failure)
                else:
                    answer = self.perform(request)
            except BaseException as exc:
                if failure is not None:  # already stopping: keep going, first cause wins
                    answer = self.fallback(request, exc)
                elif _creates_run(request):  # the run never existed: nothing to close
                    steps.close()
                    raise
                else:
                    failure = exc
                    self.broke(request)
                    try:
                        request = steps.throw(Cancelled())
                    except (StopIteration, Cancelled):
                        break
                    continue
            try:
                request = steps.send(answer)
            except StopIteration:
                break
        if failure is not None:
            raise failure

    def perform(self, request: Request) -> Any:
        io = self.io
        if isinstance(request, ReadClock):
            return io.clock()
        if isinstance(request, AskModel):
            return self.ask(request)
        if isinstance(request, CallTool):
            return self.call_tool(request)
        if isinstance(request, EmitEvents):
            return self.emit(request)
        if isinstance(request, Sleep):
            (io.sleep or time.sleep)(request.seconds)
            return None
        return self.store_op(request)

    def ask(self, request: AskModel) -> Any:
        token = set_deadline(self.io.deadline(self.io.clock()))
        try:
            reply = self.io.model(request.messages, request.tool_specs)
        except BaseException as exc:
            if propagates(exc):
                raise
            return exc
        finally:
            reset_deadline(token)
        if not isinstance(reply, _PLAIN) and inspect.isawaitable(reply):
            _close(reply)
            return TypeError("the model returned an awaitable; use runtime.arun()")
        return reply

    def call_tool(self, request: CallTool) -> ToolOutcome:
        fn = request.call.tool.fn  # type: ignore[union-attr]
        timeout = request.timeout_s
        try:
            if timeout is None:
                value = fn(**request.arguments)
            else:
                future = self.io.threads.try_start(fn, request.arguments, timeout)
                if future is None:
                    return ToolOutcome(
                        "not_started",
                        error=f"no tool thread was free within {timeout:.3f}s; it never started",
                    )
                try:
                    value = future.result(timeout=timeout)
                except concurrent.futures.TimeoutError:
                    # The thread cannot be killed; it runs on, and a write may still land.
                    return ToolOutcome("timeout", error=f"no result within {timeout:.3f}s")
        except BaseException as exc:
            if propagates(exc):
                raise
            return outcome_of(exc)
        if not isinstance(value, _PLAIN) and inspect.isawaitable(value):
            _close(value)
            return ToolOutcome("error", error="the tool returned an awaitable; use arun()")
        return ToolOutcome("ok", value)


class AsyncDriver(_Driver):
    """Awaits every request; blocking store operations run in a worker thread."""

    async def drive(self, steps: Steps) -> None:
        failure: BaseException | None = None
        request = next(steps)
        while True:
            try:
                if failure is not None and self.skipped(request):
                    answer = self.fallback(request, failure)
                else:
                    answer = await self.perform(request)
            except BaseException as exc:
                if failure is not None:
                    answer = self.fallback(request, exc)
                elif _creates_run(request):
                    steps.close()
                    raise
                else:
                    failure = exc
                    self.broke(request)
                    try:
                        request = steps.throw(Cancelled())
                    except (StopIteration, Cancelled):
                        break
                    continue
            try:
                request = steps.send(answer)
            except StopIteration:
                break
        if failure is not None:
            raise failure

    async def perform(self, request: Request) -> Any:
        import asyncio

        io = self.io
        if isinstance(request, ReadClock):
            return io.clock()
        if isinstance(request, AskModel):
            return await self.ask(request)
        if isinstance(request, CallTool):
            return await self.call_tool(request)
        if isinstance(request, EmitEvents):
            return self.emit(request)
        if isinstance(request, Sleep):
            if io.sleep is None:
                await asyncio.sleep(request.seconds)
            else:
                slept = io.sleep(request.seconds)
                if inspect.isawaitable(slept):
                    await slept
            return None
        if io.store is not None and io.store.blocking:
            return await asyncio.to_thread(self.store_op, request)
        return self.store_op(request)

    async def ask(self, request: AskModel) -> Any:
        token = set_deadline(self.io.deadline(self.io.clock()))
        try:
            reply = self.io.model(request.messages, request.tool_specs)
            if inspect.isawaitable(reply):
                reply = await reply
        except BaseException as exc:
            if propagates(exc):
                raise
            return exc
        finally:
            reset_deadline(token)
        return reply

    async def call_tool(self, request: CallTool) -> ToolOutcome:
        import asyncio

        tool = request.call.tool
        assert tool is not None
        timeout = request.timeout_s
        try:
            if getattr(tool, "is_async", False):
                value = await asyncio.wait_for(tool.fn(**request.arguments), timeout)  # type: ignore[attr-defined]
            elif timeout is None:
                value = tool.fn(**request.arguments)  # type: ignore[attr-defined]
            else:
                future = await self._start_thread(tool.fn, request.arguments, timeout)  # type: ignore[attr-defined]
                if future is None:
                    return ToolOutcome(
                        "not_started",
                        error=f"no tool thread was free within {timeout:.3f}s; it never started",
                    )
                value = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            if isinstance(exc, asyncio.TimeoutError) and timeout is not None:
                return ToolOutcome("timeout", error=f"no result within {timeout:.3f}s")
            return outcome_of(exc)
        except BaseException as exc:
            if propagates(exc):
                raise
            return outcome_of(exc)
        if not isinstance(value, _PLAIN) and inspect.isawaitable(value):
            _close(value)
            return ToolOutcome("error", error="the tool returned an awaitable it did not await")
        return ToolOutcome("ok", value)

    async def _start_thread(
        self, fn: Callable[..., Any], kwargs: dict[str, Any], wait_s: float
    ) -> concurrent.futures.Future[Any] | None:
        """Start a tool thread without blocking the event loop: poll for a free slot."""
        import asyncio

        give_up = time.monotonic() + wait_s
        while True:
            future = self.io.threads.try_start_now(fn, kwargs)
            if future is not None or time.monotonic() >= give_up:
                return future
            await asyncio.sleep(0.01)


class Driving:
    """Around one driving of one run: the owner token, the lease heartbeat, and at the
    end the claim released and the trace sink closed — whatever stopped the run."""

    def __init__(self, store: Store, s: RunState, io: Io) -> None:
        self.store, self.s, self.io = store, s, io
        self.heartbeat: Heartbeat | None = None

    def __enter__(self) -> Driving:
        io = self.io
        if io.owner is None:
            io.owner = owners.new_owner()
            owners.hold(io.owner)
        if self.s.config.save != "never" and getattr(self.store, "blocking", False):
            self.heartbeat = Heartbeat(self.store, self.s.run_id, io.owner)
        return self

    def __exit__(self, *exc: object) -> None:
        io = self.io
        try:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            if self.s.config.save != "never" and io.owner is not None:
                # A broken store keeps the claim; it is reclaimable (durable/owners.py).
                with contextlib.suppress(Exception):
                    cast(RunStore, self.store).release(self.s.run_id, io.owner)
        finally:
            if io.owner is not None:
                owners.drop(io.owner)
            if io.sink is not None:
                io.sink.close()
