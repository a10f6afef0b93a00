"""The drivers: the only code that performs the loop's requests (all of fsm-agent's I/O).

:class:`SyncDriver` answers each request of :func:`fsm_agent._core.loop.steps` in the
calling thread; :class:`AsyncDriver` awaits them, running a blocking store's operations
in a worker thread (a non-blocking one such as ``MemoryStore`` is called inline: no
thread hop per event), so ``arun()`` never blocks its event loop on a store.

Stopping. When performing a request raises — Ctrl-C, a cancelled task, a tool raising
``GeneratorExit`` or another ``BaseException``, a ``StoreError`` (disk full, lock
timeout, a fenced owner), a trace file that cannot be written — the driver throws
:class:`~fsm_agent._core.loop.Cancelled` into the loop, which takes the ``cancel`` edge so
every open call is answered and ``run_end`` is written; the driver performs what the loop
still asks (best effort: a store or sink that failed is not asked again, so a store keeps
its last good checkpoint and the run can be resumed from there) and then re-raises the
first exception. Model and tool failures that are *outcomes* (an ``Exception`` or
``SystemExit`` from a model or tool) never stop the driver: the loop is sent them.

A cancel asked through the store (``runtime/asked.py``: the heartbeat's renewal or the
claim brings it) stops the run the same way, with the request's ``by``/``at``/``note``
thrown in, before the next request that would ask the world (and, in the async driver,
by interrupting the model call, tool call or sleep in flight); the run then ends as
asked, and nothing is re-raised.

Timeouts count from the moment a tool starts (R11). A sync tool with ``timeout_s`` runs
on a thread of its own, at most ``ToolThreads.limit`` at once per runtime; a call that
cannot start within its timeout (every thread busy with hung calls) is never started and
answered ``not_executed``.

Interceptors (``runtime/interceptors.py``) wrap every request a driver performs and get
every event an ``EmitEvents`` carries; a run without any pays one ``None`` check per
request. A ``CallTool`` names its tool: the driver finds it in the run's registry
(``Io.tools``). Each request kind has its own handler, declared with
:func:`~fsm_agent._core.requests.answers`: mypy checks it returns the answer type its
request declares.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from contextvars import Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fsm_agent._core.budget import bounded_text
from fsm_agent._core.loop import Cancelled, Steps
from fsm_agent._core.requests import (
    READ_CLOCK,
    AbortIntent,
    AskModel,
    BeginIntent,
    CallTool,
    CommitIntent,
    ConsumeApproval,
    EmitEvents,
    IdempotencyRecord,
    IntentClaim,
    LoadIntent,
    ReadClock,
    Request,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
    answers,
    answers_async,
)
from fsm_agent._core.state import RunState
from fsm_agent._durable import owners
from fsm_agent._durable.resume import Heartbeat
from fsm_agent._durable.store import (
    ApprovalStore,
    CancelRequest,
    Checkpoint,
    RunSave,
    RunStore,
    Store,
)
from fsm_agent._errors import ToolRejected, TransientToolError
from fsm_agent._runtime.asked import CancelAsked
from fsm_agent._runtime.context import (
    reset_deadline,
    reset_trace_context,
    set_deadline,
    set_trace_context,
)
from fsm_agent._runtime.interceptors import Chain
from fsm_agent._trace.chain import Encoder
from fsm_agent._trace.io import TraceSink

if TYPE_CHECKING:
    import asyncio

__all__ = ["AsyncDriver", "Driving", "Io", "SyncDriver", "ToolThreads", "outcome_of", "propagates"]

T = TypeVar("T")

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
            assert limit is not None
            return time.monotonic() + max(limit - (now - s.started), 0.0)

        # A run its store keeps is fenced: see ``fenced`` below.
        fenced = s.config.save != "never"
        built = s.config.redact is None
        return cls(run_id=s.run_id, tools=s.config.tools, fenced=fenced, built=built,
                   deadline=None if limit is None else deadline, **parts)  # fmt: skip

    run_id: str
    model: Model
    #: The run's registry lookup: ``CallTool.tool`` (a name) -> the tool to call.
    tools: Callable[[str], Any]
    clock: Callable[[], float]
    sleep: Callable[[float], Any] | None
    threads: ToolThreads
    #: The model call's deadline from a clock reading (``None``: no wall-clock budget,
    #: so no clock is read for it).
    deadline: Callable[[float], float | None] | None
    store: Store | None = None
    owner: str | None = None
    sink: TraceSink | None = None
    #: The store keeps this run: every intent operation carries ``(run_id, owner)`` so
    #: the store refuses it once another driver took the run over (R11 fencing).
    fenced: bool = False
    #: Encodes each event once as its chained line, for the sink and a store that keeps
    #: JSON text (``None``: neither wants lines, and nothing is encoded).
    encoder: Encoder | None = None
    #: The interceptors of this driving (``None``: there are none, nothing is called).
    chain: Chain | None = None
    #: The run's events are as the engine built them (no redaction hook rewrites them):
    #: the interceptors get them typed unchecked (``core/events.typed``).
    built: bool = False
    # Set when a store or sink failed while the run was stopping: not asked again.
    broken: set[str] = field(default_factory=set)
    #: A cancel asked of the run through its store (``runtime/asked.py``; ``None``: a run
    #: no store keeps, whose driving no request can reach).
    asked: CancelAsked | None = None


def propagates(exc: BaseException) -> bool:
    """KeyboardInterrupt, GeneratorExit, asyncio's CancelledError and other non-Exception
    BaseExceptions belong to the process and its event loop, not to the tool or model
    that was running: they stop the run (cleanly) and propagate. Anything else a tool or
    model raises (SystemExit included) is that call's outcome."""
    return not isinstance(exc, (Exception, SystemExit))


def _text(exc: BaseException) -> str:
    try:
        # Bounded: a tool's message is recorded in the trace (core/budget.py).
        return bounded_text(f"{type(exc).__name__}: {exc}")
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
        """Perform a store request (one handler per kind, each checked by mypy)."""
        if isinstance(request, BeginIntent):
            return self.begin_intent(request)
        if isinstance(request, CommitIntent):
            return self.commit_intent(request)
        if isinstance(request, AbortIntent):
            return self.abort_intent(request)
        if isinstance(request, LoadIntent):
            return self.load_intent(request)
        if isinstance(request, ConsumeApproval):
            return self.consume_approval(request)
        assert isinstance(request, SaveCheckpoint), request
        return self.save_checkpoint(request)

    @property
    def store(self) -> Store:
        store = self.io.store
        if store is None:
            raise RuntimeError("a store request needs a store")  # a loop bug
        return store

    def _fence(self) -> dict[str, Any]:
        # Only a store that keeps runs is asked to fence (an idempotency-only store may
        # not know the keyword).
        return {"fence": (self.io.run_id, self.io.owner or "")} if self.io.fenced else {}

    @answers(BeginIntent)
    def begin_intent(self, request: BeginIntent) -> IntentClaim:
        self.honour()  # (a write about to begin: nothing of it has happened yet)
        fence = self._fence()
        riding = self.riding(request.save)
        if riding is not None:  # only a store that keeps runs gets a save
            fence["save"] = riding
        return self.store.begin_intent(request.record, take_over=request.take_over, **fence)

    @answers(CommitIntent)
    def commit_intent(self, request: CommitIntent) -> None:
        # The loop needs no answer: a store that can send the result with the run's
        # next statement (PostgresStore) is not waited for here (D1: a crash before it
        # lands resumes to outcome_unknown, never to a second run).
        behind = getattr(self.store, "commit_intent_behind", None) if self.io.fenced else None
        if behind is not None:
            behind(
                request.tool,
                request.key,
                request.owner,
                request.result,
                fence=(self.io.run_id, self.io.owner or ""),
            )
            return
        self.store.commit_intent(
            request.tool, request.key, request.owner, request.result, **self._fence()
        )

    @answers(AbortIntent)
    def abort_intent(self, request: AbortIntent) -> None:
        self.store.abort_intent(request.tool, request.key, request.owner, **self._fence())

    @answers(LoadIntent)
    def load_intent(self, request: LoadIntent) -> IdempotencyRecord | None:
        return self.store.get_intent(request.tool, request.key)

    @answers(ConsumeApproval)
    def consume_approval(self, request: ConsumeApproval) -> bool:
        # (Runtime checked at construction that a store with limited approvals counts
        # them.) Not fenced: a use is keyed by (approval, run, call), so a stalled
        # driver and the one that took its run over spend the same single use.
        return cast(ApprovalStore, self.store).consume_approval(
            request.approval_id, request.max_uses, request.run_id, request.call_id
        )

    @answers(SaveCheckpoint)
    def save_checkpoint(self, request: SaveCheckpoint) -> None:
        checkpoint = self.checkpoint(request)
        owner = self.io.owner or ""
        runs = cast(RunStore, self.store)  # the loop saves only when the store keeps runs
        if request.header is not None:
            runs.create_run(self.io.run_id, request.header, owner, request.events, checkpoint)
            return
        # PostgresStore: a checkpoint behind rides with the run's next statement; the
        # last one lets the claim go as it lands (one round trip, not two).
        save = runs.save
        if request.behind:
            save = getattr(runs, "save_behind", save)
        elif request.last:
            save = getattr(runs, "save_and_release", save)
        save(self.io.run_id, owner, request.events, checkpoint)

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

    @answers(EmitEvents)
    def emit(self, request: EmitEvents) -> None:
        """The events to the trace sink, then to the interceptors' ``on_event``. A sink
        that fails is not written again in this driving, and its failure stops the run
        (after the interceptors had the events: they see the run to its end)."""
        io = self.io
        failure: BaseException | None = None
        sink = io.sink
        if sink is not None and "sink" not in io.broken:
            try:
                write_line = getattr(sink, "write_line", None)
                encoder = io.encoder
                if encoder is not None and write_line is not None:
                    for line in encoder.lines(request.events):
                        write_line(line)
                else:  # a sink of event dicts
                    for event in request.events:
                        sink.write(event)
            except BaseException as exc:
                io.broken.add("sink")
                failure = exc
        chain = io.chain
        if chain is not None and chain.watchers:
            chain.deliver(io.run_id, request.events, built=io.built)
        if failure is not None:
            raise failure

    def broke(self, request: Request) -> None:
        """A store operation failed: the store is not asked again in this driving (it
        keeps its last good checkpoint, from which the run can be resumed). A failed
        sink is marked by :meth:`emit` itself."""
        if isinstance(request, _STORE_REQUESTS):
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

    @answers(ReadClock)
    def read_clock(self, request: ReadClock) -> float:
        return self.io.clock()

    def skipped(self, request: Request) -> bool:
        return "store" in self.io.broken and isinstance(request, _STORE_REQUESTS)

    def was_asked(self, exc: BaseException) -> bool:
        """``exc`` is the cancel asked through the store (the run ends cancelled, as
        asked: nothing to re-raise), not a failure."""
        asked = self.io.asked
        return asked is not None and exc is asked.cancelled

    def stop(self, steps: Steps, request: Request, exc: BaseException) -> Request | None:
        """Performing ``request`` raised ``exc``: stop the run (the ``cancel`` edge, with
        who asked where the store asked it); the loop's next request, or ``None`` when it
        has finished."""
        asked = self.was_asked(exc)
        if not asked:
            self.broke(request)
        try:
            nxt: Request = steps.throw(exc if asked else Cancelled())
        except (StopIteration, Cancelled):
            return None
        return nxt

    def honour(self) -> None:
        """Before asking the world: stop here if a cancel was asked through the store."""
        asked = self.io.asked
        if asked is not None:
            asked.check()


def _no_tool(request: CallTool) -> ToolOutcome:
    """The answer when the registry has no tool of that name (it changed since the call
    was admitted)."""
    return ToolOutcome(
        "not_started", error=f"no tool named {request.tool!r} in the runtime's registry"
    )


class SyncDriver(_Driver):
    """Performs every request in the calling thread."""

    def drive(self, steps: Steps) -> None:
        failure: BaseException | None = None
        stopping = False
        # Bound once: the per-request cost of no interceptors is one ``is None``.
        chain, perform, clock = self.io.chain, self.perform, self.io.clock
        request = next(steps)
        while True:
            try:
                if failure is not None and self.skipped(request):
                    answer = self.fallback(request, failure)
                elif chain is None:
                    # The clock (read twice a round) is read here: one call less each.
                    answer = clock() if request is READ_CLOCK else perform(request)
                else:
                    answer = chain.perform(request, perform)
            except BaseException as exc:
                if stopping:  # already stopping: keep going, first cause wins
                    answer = self.fallback(request, exc)
                    failure = failure or exc
                elif _creates_run(request):  # the run never existed: nothing to close
                    steps.close()
                    raise
                else:
                    stopping = True
                    failure = None if self.was_asked(exc) else exc
                    stopped = self.stop(steps, request, exc)
                    if stopped is None:
                        break
                    request = stopped
                    continue
            try:
                request = steps.send(answer)
            except StopIteration:
                break
        if failure is not None:
            raise failure

    def perform(self, request: Request) -> Any:
        # (``drive`` reads the clock for READ_CLOCK itself: the model and the tools come
        # first here, once a round each.)
        if isinstance(request, AskModel):
            return self.ask(request)
        if isinstance(request, CallTool):
            return self.call_tool(request)
        if isinstance(request, ReadClock):
            return self.io.clock()  # read_clock's body, one call less
        if isinstance(request, EmitEvents):
            return self.emit(request)
        if isinstance(request, Sleep):
            return self.sleep(request)
        return self.store_op(request)

    @answers(Sleep)
    def sleep(self, request: Sleep) -> None:
        self.honour()
        (self.io.sleep or time.sleep)(request.seconds)

    @answers(AskModel)
    def ask(self, request: AskModel) -> Any:
        self.honour()
        deadline = self.io.deadline
        token = set_deadline(None if deadline is None else deadline(self.io.clock()))
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

    @answers(CallTool)
    def call_tool(self, request: CallTool) -> ToolOutcome:
        self.honour()
        tool = self.io.tools(request.tool)  # the run's registry
        if tool is None:
            return _no_tool(request)
        fn: Callable[..., Any] = tool.fn
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
    """Awaits every request; blocking store operations run in a worker thread. A cancel
    asked through the store interrupts the model call, tool call or sleep in flight."""

    def __init__(self, io: Io) -> None:
        super().__init__(io)
        self._asked: asyncio.Event | None = None

    async def unless_asked(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, unless a cancel is asked through the store meanwhile:
        then it is cancelled (a thread a sync tool runs on runs on) and the request's
        ``Cancelled`` raised. Without a store to ask, just the await."""
        asked = self.io.asked
        if asked is None:
            return await awaitable
        import asyncio

        event = self._asked
        if event is None:
            event = self._asked = asyncio.Event()
            loop = asyncio.get_running_loop()
            asked.on_delivery(lambda: loop.call_soon_threadsafe(event.set))
        work = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((work, waiter), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this driving itself was cancelled: nothing runs on
            work.cancel()
            raise
        finally:
            waiter.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait((work,))  # (its CancelledError stays in it)
            asked.check()
        return work.result()

    async def drive(self, steps: Steps) -> None:
        failure: BaseException | None = None
        stopping = False
        chain, perform = self.io.chain, self.perform
        request = next(steps)
        while True:
            try:
                if failure is not None and self.skipped(request):
                    answer = self.fallback(request, failure)
                elif chain is None:
                    answer = await perform(request)
                else:
                    answer = await chain.aperform(request, perform)
            except BaseException as exc:
                if stopping:
                    answer = self.fallback(request, exc)
                    failure = failure or exc
                elif _creates_run(request):
                    steps.close()
                    raise
                else:
                    stopping = True
                    failure = None if self.was_asked(exc) else exc
                    stopped = self.stop(steps, request, exc)
                    if stopped is None:
                        break
                    request = stopped
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
            return self.read_clock(request)
        if isinstance(request, AskModel):
            return await self.ask(request)
        if isinstance(request, CallTool):
            return await self.call_tool(request)
        if isinstance(request, EmitEvents):
            return self.emit(request)
        if isinstance(request, Sleep):
            return await self.sleep(request)
        if io.store is not None and io.store.blocking:
            return await asyncio.to_thread(self.store_op, request)
        return self.store_op(request)

    @answers_async(Sleep)
    async def sleep(self, request: Sleep) -> None:
        import asyncio

        io = self.io
        self.honour()
        if io.sleep is None:
            await self.unless_asked(asyncio.sleep(request.seconds))
        else:
            slept = io.sleep(request.seconds)
            if inspect.isawaitable(slept):
                await self.unless_asked(slept)

    @answers_async(AskModel)
    async def ask(self, request: AskModel) -> Any:
        self.honour()
        deadline = self.io.deadline
        token = set_deadline(None if deadline is None else deadline(self.io.clock()))
        try:
            reply = self.io.model(request.messages, request.tool_specs)
            if inspect.isawaitable(reply):
                reply = await self.unless_asked(reply)
        except BaseException as exc:
            if propagates(exc):
                raise
            return exc
        finally:
            reset_deadline(token)
        return reply

    @answers_async(CallTool)
    async def call_tool(self, request: CallTool) -> ToolOutcome:
        import asyncio

        self.honour()
        tool = self.io.tools(request.tool)  # the run's registry
        if tool is None:
            return _no_tool(request)
        fn: Callable[..., Any] = tool.fn
        timeout = request.timeout_s
        try:
            if getattr(tool, "is_async", False):
                value = await self.unless_asked(asyncio.wait_for(fn(**request.arguments), timeout))
            elif timeout is None:
                value = fn(**request.arguments)
            else:
                future = await self._start_thread(fn, request.arguments, timeout)
                if future is None:
                    return ToolOutcome(
                        "not_started",
                        error=f"no tool thread was free within {timeout:.3f}s; it never started",
                    )
                value = await self.unless_asked(
                    asyncio.wait_for(asyncio.wrap_future(future), timeout)
                )
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
    """Around one driving of one run: the owner token, the lease heartbeat (which brings
    a cancel asked through the store), and at the end the claim released and the trace
    sink closed — whatever stopped the run. ``cancel``: a cancel the store held for the
    run when this driving claimed it (honoured at the first request that would ask the
    world)."""

    def __init__(
        self, store: Store, s: RunState, io: Io, cancel: CancelRequest | None = None
    ) -> None:
        self.store, self.s, self.io, self.cancel = store, s, io, cancel
        self.heartbeat: Heartbeat | None = None
        self.traced: Token[dict[str, str] | None] | None = None

    def __enter__(self) -> Driving:
        io = self.io
        if io.chain is not None:  # a tracer among the interceptors reads and writes it
            self.traced = set_trace_context(self.s.trace_context)
        if io.owner is None:
            io.owner = owners.new_owner()
            owners.hold(io.owner)
        kept = self.s.config.save != "never"
        beats = kept and getattr(self.store, "blocking", False)
        if beats or (kept and self.cancel is not None):
            io.asked = CancelAsked()
            if self.cancel is not None:
                io.asked.deliver(self.cancel)
        if beats:
            assert io.asked is not None
            self.heartbeat = Heartbeat(self.store, self.s.run_id, io.owner, io.asked.deliver)
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
            if self.traced is not None:
                reset_trace_context(self.traced)
            if io.owner is not None:
                owners.drop(io.owner)
            if io.sink is not None:
                io.sink.close()
