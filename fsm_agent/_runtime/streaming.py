"""``Runtime.stream`` / ``Runtime.astream``: a run's typed events, live, in ``seq`` order.

The run is driven exactly as ``run()``/``arun()`` drive it; streaming adds two observers
and nothing that decides. Lifecycle events reach the consumer through an ambient
interceptor's ``on_event`` (:func:`~fsm_agent._runtime.interceptors.observing`); the
deltas of a streaming adapter (``text_delta``, ``reasoning_delta``, ``tool_args_delta``)
through the delta sink of :mod:`fsm_agent._runtime.context`. The decision is still
taken once, on the folded message.

Back-pressure. Between the driver and the consumer sits a bounded queue (``capacity``
events, default 256). Lifecycle events are never dropped nor merged. When the queue is
full, a delta of the same block as the newest queued one (same type, ``index`` and
``call_id``) is appended to it — the consumer then gets fewer, longer deltas whose text
joins to the same string — and any other delta or request waits for room: the sync
driver blocks, the async adapter awaits between chunks, and the driver waits before
each request it performs. A slow consumer therefore slows the run; memory stays bounded
by ``capacity`` plus the events of one transition.

A delta's ``seq`` is that of the lifecycle event it follows (the stream is in
non-decreasing ``seq`` order); deltas are not recorded events: the trace keeps, in the
decision's ``message.streamed``, each block's length, delta count and digest, and with
``trace_deltas=True`` the deltas themselves (``core/streamed.py``; ``check`` folds them).

Cancellation. Leaving the block before the run ended, :meth:`StreamRun.cancel`, or
cancelling the task that consumes :meth:`Runtime.astream` stops the run at the next
delta, event or request: the loop takes its ``cancel`` edge (every open call answered,
partial text dropped: an unfinished reply never becomes a message) and ends
``cancelled``, with its trace written to the end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fsm_agent._core.events import Event, ReasoningDelta, TextDelta, ToolArgsDelta
from fsm_agent._core.requests import Request
from fsm_agent._runtime.context import (
    reset_delta_sink,
    set_delta_sink,
    set_room,
    set_trace_deltas,
)
from fsm_agent._runtime.interceptors import Interceptor, observing
from fsm_agent._runtime.result import RunResult

__all__ = ["AsyncStreamRun", "StreamCancelled", "StreamRun"]


_DELTAS: dict[str, type[Event]] = {
    "text_delta": TextDelta,
    "reasoning_delta": ReasoningDelta,
    "tool_args_delta": ToolArgsDelta,
}


class StreamCancelled(BaseException):
    """Raised inside the driver when the consumer cancelled: a ``BaseException``, so
    the driver stops the run as Ctrl-C does (the ``cancel`` edge), never a tool's error."""


def _merge(last: Event, new: Event) -> Event | None:
    """``new`` appended to ``last`` when both are deltas of one block, else ``None``."""
    if type(last) is not type(new) or not isinstance(new, tuple(_DELTAS.values())):
        return None
    if isinstance(new, ToolArgsDelta) and isinstance(last, ToolArgsDelta):
        if (last.call_id, last.index) != (new.call_id, new.index):
            return None
        return dataclasses.replace(last, fragment=last.fragment + new.fragment)
    assert isinstance(new, (TextDelta, ReasoningDelta))
    assert isinstance(last, (TextDelta, ReasoningDelta))
    if last.index != new.index:
        return None
    return dataclasses.replace(last, text=last.text + new.text)


class _Buffer:
    """The queue's content and policy, shared by the sync and async streams."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"stream capacity must be a whole number >= 1, got {capacity!r}")
        self.capacity = capacity
        self.items: collections.deque[Event] = collections.deque()
        self.run_id = ""
        self.last_seq = 0
        self.cancelled = False
        self.stopped = False  # StreamCancelled was raised in the driver once
        self.finished = False
        self.coalesced = 0
        self.high_water = 0

    @property
    def full(self) -> bool:
        return len(self.items) >= self.capacity

    def delta(self, kind: str, fields: dict[str, Any]) -> Event:
        cls = _DELTAS[kind]
        return cls(seq=self.last_seq, run_id=self.run_id, **fields)

    def append(self, event: Event, *, coalesce: bool) -> bool:
        """Queue ``event``; ``False`` when it had to be merged and could not (wait)."""
        if coalesce and self.full and self.items:
            merged = _merge(self.items[-1], event)
            if merged is not None:
                self.items[-1] = merged
                self.coalesced += 1
                return True
            return False
        self.items.append(event)
        self.high_water = max(self.high_water, len(self.items))
        return True

    def check(self) -> None:
        """Raise :class:`StreamCancelled` the first time the driver passes after a cancel."""
        if self.cancelled and not self.stopped:
            self.stopped = True
            raise StreamCancelled


class _Watch(Interceptor):
    """The lifecycle events to the buffer (never dropped), and a wait for room before
    each request the sync driver performs."""

    def __init__(self, stream: StreamRun) -> None:
        self.stream = stream

    def intercept(self, request: Request, call_next: Callable[[Request], Any]) -> Any:
        self.stream._wait_room()
        return call_next(request)

    def on_event(self, event: Event) -> None:
        self.stream._put(event)


class StreamRun:
    """What ``with runtime.stream(task) as run:`` gives: iterate it for the events;
    ``run.result`` once the block is left (or the iteration ended); ``run.cancel()``."""

    def __init__(
        self,
        runtime: Any,  # the Runtime (typed loosely: runtime.py imports this module)
        task: Any,
        *,
        run_id: str | None,
        trace: Any,
        model: Any,
        capacity: int,
        trace_deltas: bool = False,
        context: dict[str, Any] | None = None,
    ) -> None:
        self._buffer = _Buffer(capacity)
        self._trace_deltas = trace_deltas
        self._cond = threading.Condition()
        self._runtime, self._task = runtime, task
        self._args = {"run_id": run_id, "trace": trace, "model": model, "context": context}
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ── the driver's side (its thread) ─────────────────────────────────────────────

    def _put(self, event: Event) -> None:
        with self._cond:
            buffer = self._buffer
            buffer.run_id = event.run_id or buffer.run_id
            buffer.last_seq = max(buffer.last_seq, event.seq)
            buffer.append(event, coalesce=False)
            self._cond.notify_all()
        self._buffer.check()

    def _delta(self, kind: str, fields: dict[str, Any]) -> None:
        with self._cond:
            buffer = self._buffer
            event = buffer.delta(kind, fields)
            while not buffer.cancelled and not buffer.append(event, coalesce=True):
                self._cond.wait()
            self._cond.notify_all()
        buffer.check()

    def _wait_room(self) -> None:
        with self._cond:
            while self._buffer.full and not self._buffer.cancelled:
                self._cond.wait()
        self._buffer.check()

    def _drive(self) -> None:
        runtime, a = self._runtime, self._args
        token = set_delta_sink(self._delta)
        set_trace_deltas(self._trace_deltas)  # this thread's own context copy
        try:
            with observing(_Watch(self)):
                self._result = runtime._stream_drive(self._task, **a)
        except BaseException as exc:
            self._error = exc
        finally:
            reset_delta_sink(token)
            with self._cond:
                self._buffer.finished = True
                self._cond.notify_all()

    # ── the consumer's side ────────────────────────────────────────────────────────

    def __enter__(self) -> StreamRun:
        # A fresh context: the run's own deadline and sink, none of the caller's.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._drive,), name="fsm-agent-stream", daemon=True
        )
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[Event]:
        while True:
            with self._cond:
                while not self._buffer.items and not self._buffer.finished:
                    self._cond.wait()
                if not self._buffer.items:
                    return
                event = self._buffer.items.popleft()
                self._cond.notify_all()
            yield event

    def cancel(self) -> None:
        """Stop the run: it ends ``cancelled`` at the next delta, event or request."""
        with self._cond:
            self._buffer.cancelled = True
            self._cond.notify_all()

    def __exit__(self, *exc: object) -> None:
        if not self._buffer.finished:
            self.cancel()
        assert self._thread is not None
        self._thread.join()
        error = self._error
        if error is not None and not isinstance(error, StreamCancelled):
            raise error

    @property
    def result(self) -> RunResult:
        """The run's result (``status == "cancelled"`` if it was stopped)."""
        if self._result is None:
            raise RuntimeError(
                "run.result is there once the run ended: after the `with` block, or once "
                "iterating the stream ended"
            )
        return self._result

    @property
    def coalesced(self) -> int:
        """How many deltas were merged into the one before them under back-pressure."""
        return self._buffer.coalesced

    @property
    def high_water(self) -> int:
        """The most events the queue held at once (``capacity`` + one transition's)."""
        return self._buffer.high_water


class _AWatch(Interceptor):
    def __init__(self, stream: AsyncStreamRun) -> None:
        self.stream = stream

    async def aintercept(self, request: Request, call_next: Any) -> Any:
        await self.stream._room()
        return await call_next(request)

    def on_event(self, event: Event) -> None:
        self.stream._put(event)


class AsyncStreamRun:
    """What ``async with runtime.astream(task) as run:`` gives (see :class:`StreamRun`)."""

    def __init__(
        self,
        runtime: Any,  # the Runtime (typed loosely: runtime.py imports this module)
        task: Any,
        *,
        run_id: str | None,
        trace: Any,
        model: Any,
        capacity: int,
        trace_deltas: bool = False,
        context: dict[str, Any] | None = None,
    ) -> None:
        self._buffer = _Buffer(capacity)
        self._trace_deltas = trace_deltas
        self._runtime, self._task = runtime, task
        self._args = {"run_id": run_id, "trace": trace, "model": model, "context": context}
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _put(self, event: Event) -> None:
        buffer = self._buffer
        buffer.run_id = event.run_id or buffer.run_id
        buffer.last_seq = max(buffer.last_seq, event.seq)
        buffer.append(event, coalesce=False)
        self._notify()

    def _delta(self, kind: str, fields: dict[str, Any]) -> None:
        # Never waits (it runs inside the adapter's loop): merged when it can be, else
        # queued; the adapter awaits room after each chunk (context.wait_room).
        buffer = self._buffer
        event = buffer.delta(kind, fields)
        if not buffer.append(event, coalesce=True):
            buffer.append(event, coalesce=False)
        self._notify()

    async def _room(self) -> None:
        while self._buffer.full and not self._buffer.finished and not self._buffer.cancelled:
            await self._wait()

    async def _drive(self) -> None:
        sink = set_delta_sink(self._delta)
        set_room(self._room)  # in this task's own context copy: gone with the task
        set_trace_deltas(self._trace_deltas)
        try:
            with observing(_AWatch(self)):
                self._result = await self._runtime._astream_drive(self._task, **self._args)
        except BaseException as exc:  # CancelledError included: the run ended cancelled
            self._error = exc
        finally:
            reset_delta_sink(sink)
            self._buffer.finished = True
            self._notify()

    async def __aenter__(self) -> AsyncStreamRun:
        # The task runs in a copy of this context: the sink and room it sets stay its own.
        self._run_task = asyncio.create_task(self._drive())
        return self

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        buffer = self._buffer
        while True:
            while not buffer.items and not buffer.finished:
                await self._wait()
            if not buffer.items:
                return
            event = buffer.items.popleft()
            self._notify()
            yield event

    def cancel(self) -> None:
        """Stop the run: it ends ``cancelled`` where it is awaiting."""
        self._buffer.cancelled = True
        if self._run_task is not None and not self._run_task.done():
            self._run_task.cancel()

    async def __aexit__(self, *exc: object) -> None:
        task = self._run_task
        assert task is not None
        if not task.done():
            self.cancel()
        # The run finishes its cancel edge even if our own task is being cancelled.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
        if not task.done():
            await asyncio.wait({task})
        error = self._error
        if error is not None and not isinstance(error, (asyncio.CancelledError, StreamCancelled)):
            raise error

    @property
    def result(self) -> RunResult:
        if self._result is None:
            raise RuntimeError("run.result is there once the run ended: after `async with`")
        return self._result

    @property
    def coalesced(self) -> int:
        return self._buffer.coalesced
