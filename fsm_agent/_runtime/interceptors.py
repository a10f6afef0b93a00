"""Interceptors: one seam around every request a driver performs, and every event.

``Runtime(interceptors=[...])`` takes objects with any of three methods (subclass
:class:`Interceptor` and override what you need; the others cost nothing):

``intercept(request, call_next)``
    around each request the sync driver (``run``/``resume``) performs, in list order
    (the first is outermost). ``call_next(request)`` performs it (through the
    interceptors after this one) and returns its answer; return that answer, or another
    one of the request's answer type (``core/requests.py``) to change what the loop is
    told — fault injection does (``fsm_agent.testing.ToolFaults``).
``aintercept(request, call_next)``
    the same for the async driver (``arun``/``aresume``): an ``async def`` whose
    ``call_next`` must be awaited. The sync driver never calls it, the async driver never
    calls ``intercept``: an interceptor for both kinds of runs defines both.
``requests`` (a class attribute)
    the request types ``intercept``/``aintercept`` are called for (``None``, the default:
    every request); the others pass it by at no cost (the OpenTelemetry interceptor
    wants model and tool calls, not the emits, clock reads and store operations).
``on_event(event)``
    each event of the run, typed (``core/events.py``), the moment the loop records it and
    before the next request is performed, as recorded (after ``Runtime(redact=...)``).

Failures. An ``Exception`` an interceptor raises — in ``on_event``, or in ``intercept``
outside ``call_next`` — is logged on ``logging.getLogger("fsm_agent")``, counted
(:attr:`Runtime.interceptor_errors <fsm_agent.Runtime.interceptor_errors>`), and never
changes the run: the request is performed as if that interceptor were absent (or, if it
raised after ``call_next`` returned, that answer is used). What ``call_next`` raises is the
request's own failure and propagates as it would without interceptors. A
``BaseException`` that is no ``Exception`` (``KeyboardInterrupt``,
``asyncio.CancelledError``, ``fsm_agent.testing.ProcessDied``) belongs to the process: it
stops the run as a crash or Ctrl-C at that point does; that is how a test fakes a crash.

:func:`observing` adds interceptors to every run driven in the current context
(thread or task), whatever runtime drives it: the pytest plugin's transition coverage
uses it. A runtime's own interceptors come first.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from fsm_agent._core.events import Event, typed
from fsm_agent._core.requests import Request
from fsm_agent._errors import ConfigError

__all__ = ["AsyncCallNext", "CallNext", "Chain", "Interceptor", "Interceptors", "observing"]

logger = logging.getLogger("fsm_agent")

CallNext = Callable[[Request], Any]
AsyncCallNext = Callable[[Request], Awaitable[Any]]


class Interceptor:
    """The base of interceptors: every method passes through; override the ones you need."""

    #: The request types ``intercept``/``aintercept`` are called for (``None``: all).
    requests: tuple[type[Request], ...] | None = None

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        return call_next(request)

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        return await call_next(request)

    def on_event(self, event: Event) -> None:
        return None


_AMBIENT: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "fsm_agent_ambient_interceptors", default=()
)


@contextlib.contextmanager
def observing(*interceptors: Any, first: bool = False) -> Iterator[None]:
    """Add ``interceptors`` to every run driven inside the ``with`` block, in this
    context (a test harness's way to watch runs it did not configure). ``first`` puts
    them before the context's earlier ones (still after the runtime's own): a faked
    crash must stop an event before any other observer counts it."""
    ambient = _AMBIENT.get()
    token = _AMBIENT.set((*interceptors, *ambient) if first else (*ambient, *interceptors))
    try:
        yield
    finally:
        _AMBIENT.reset(token)


def watch(interceptor: Any) -> None:
    """Add ``interceptor`` to every run driven from now on in this context, until
    :func:`unwatch` (the pytest plugin's coverage: installed and removed apart, in any
    order, so no token of :func:`observing` can be reset out of turn)."""
    ambient = _AMBIENT.get()
    if not any(i is interceptor for i in ambient):
        _AMBIENT.set((*ambient, interceptor))


def unwatch(interceptor: Any) -> None:
    """Remove ``interceptor`` (and only it) from this context's ambient interceptors."""
    _AMBIENT.set(tuple(i for i in _AMBIENT.get() if i is not interceptor))


def _overrides(obj: Any, name: str) -> bool:
    """Whether ``obj`` has its own ``name`` (not :class:`Interceptor`'s pass-through)."""
    method = getattr(type(obj), name, None)
    return method is not None and method is not getattr(Interceptor, name)


def _wants(interceptor: Any, kind: type) -> bool:
    """Whether ``interceptor`` is called for requests of type ``kind``."""
    kinds = getattr(interceptor, "requests", None)
    return kinds is None or issubclass(kind, kinds)


_METHODS = ("intercept", "aintercept", "on_event")


def _checked(interceptors: Iterable[Any]) -> tuple[Any, ...]:
    """The interceptors as a tuple, or a :class:`ConfigError` naming the one at fault."""
    if isinstance(interceptors, (str, bytes)) or not isinstance(interceptors, Iterable):
        raise ConfigError(
            f"interceptors must be a list of interceptor objects, got {interceptors!r}"
        )
    found = tuple(interceptors)
    for n, each in enumerate(found):
        where = f"interceptors[{n}] ({type(each).__name__})"
        if not any(callable(getattr(each, name, None)) for name in _METHODS):
            raise ConfigError(
                f"{where} has none of intercept, aintercept, on_event: subclass "
                "fsm_agent.Interceptor and override the ones you need"
            )
        kinds = getattr(each, "requests", None)
        if kinds is not None and not (
            isinstance(kinds, tuple) and all(isinstance(k, type) for k in kinds)
        ):
            raise ConfigError(
                f"{where}: requests must be None (every request) or a tuple of request "
                f"classes (fsm_agent._core.requests: AskModel, CallTool, ...), got {kinds!r}"
            )
        if inspect.iscoroutinefunction(getattr(each, "intercept", None)):
            raise ConfigError(
                f"{where}: intercept is an async def; name it aintercept (arun and "
                "aresume await it) and keep intercept for run and resume"
            )
    return found


class _Inner:
    """What ``call_next`` of one link did: its answer, or the exception it raised."""

    __slots__ = ("answer", "called", "failure")

    def __init__(self) -> None:
        self.called = False
        self.answer: Any = None
        self.failure: BaseException | None = None


class Interceptors:
    """The interceptors of one runtime, split by what each overrides, and the count of
    their failures (shared by every run of the runtime)."""

    def __init__(self, interceptors: Iterable[Any] = ()) -> None:
        self.all = _checked(interceptors)
        self._lock = threading.Lock()
        self.errors = 0

    def for_run(self) -> Chain | None:
        """The chain one driving uses (with the context's :func:`observing` ones), or
        ``None`` when there is nothing to call: the driver then pays nothing."""
        every = self.all + _AMBIENT.get()
        if not every:
            return None
        return Chain(self, every)

    def failed(self, interceptor: Any, where: str, subject: str, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
        logger.error(
            "interceptor %s raised in %s (%s); the run goes on as if it were absent",
            type(interceptor).__name__,
            where,
            subject,
            exc_info=exc,
        )


class Chain:
    """The interceptors one driving of one run calls."""

    def __init__(self, owner: Interceptors, every: Sequence[Any]) -> None:
        self.owner = owner
        self.around = [i for i in every if _overrides(i, "intercept")]
        self.around_async = [i for i in every if _overrides(i, "aintercept")]
        self.watchers = [i for i in every if _overrides(i, "on_event")]
        #: Per request type, the interceptors that want it (``Interceptor.requests``).
        self._sync_for: dict[type, list[Any]] = {}
        self._async_for: dict[type, list[Any]] = {}

    @property
    def wants_events(self) -> bool:
        return bool(self.watchers)

    # ── requests ──────────────────────────────────────────────────────────────────

    @staticmethod
    def _wanting(kind: type, every: list[Any], cache: dict[type, list[Any]]) -> list[Any]:
        found = cache.get(kind)
        if found is None:
            found = cache[kind] = [i for i in every if _wants(i, kind)]
        return found

    def perform(self, request: Request, perform: CallNext) -> Any:
        """``perform(request)`` through every ``intercept``, outermost first."""
        if not self.around:
            return perform(request)
        around = self._wanting(type(request), self.around, self._sync_for)
        return self._link(around, 0, request, perform) if around else perform(request)

    def _link(self, around: list[Any], i: int, request: Request, perform: CallNext) -> Any:
        if i == len(around):
            return perform(request)
        interceptor = around[i]
        inner = _Inner()

        def call_next(given: Request) -> Any:
            inner.called = True
            try:
                inner.answer = self._link(around, i + 1, given, perform)
            except BaseException as exc:
                inner.failure = exc
                raise
            return inner.answer

        try:
            return interceptor.intercept(request, call_next)
        except Exception as exc:
            if exc is not inner.failure:
                self.owner.failed(interceptor, "intercept", type(request).__name__, exc)
            if inner.failure is not None:
                raise inner.failure from None  # the request's own failure, as it was
            return inner.answer if inner.called else self._link(around, i + 1, request, perform)

    async def aperform(self, request: Request, perform: AsyncCallNext) -> Any:
        """``await perform(request)`` through every ``aintercept``, outermost first."""
        if not self.around_async:
            return await perform(request)
        around = self._wanting(type(request), self.around_async, self._async_for)
        if not around:
            return await perform(request)
        return await self._alink(around, 0, request, perform)

    async def _alink(
        self, around: list[Any], i: int, request: Request, perform: AsyncCallNext
    ) -> Any:
        if i == len(around):
            return await perform(request)
        interceptor = around[i]
        inner = _Inner()

        async def call_next(given: Request) -> Any:
            inner.called = True
            try:
                inner.answer = await self._alink(around, i + 1, given, perform)
            except BaseException as exc:
                inner.failure = exc
                raise
            return inner.answer

        try:
            return await interceptor.aintercept(request, call_next)
        except Exception as exc:
            if exc is not inner.failure:
                self.owner.failed(interceptor, "aintercept", type(request).__name__, exc)
            if inner.failure is not None:
                raise inner.failure from None
            if inner.called:
                return inner.answer
            return await self._alink(around, i + 1, request, perform)

    # ── events ────────────────────────────────────────────────────────────────────

    def deliver(
        self, run_id: str, events: Iterable[dict[str, Any]], *, built: bool = False
    ) -> None:
        """Each event, typed, to every ``on_event`` in order (``built``: the engine's
        own dicts, no redaction hook between: ``core/events.typed``)."""
        for data in events:
            event = typed(data, run_id, built=built)
            for watcher in self.watchers:
                try:
                    watcher.on_event(event)
                except Exception as exc:
                    self.owner.failed(watcher, "on_event", f"{event.type} seq {event.seq}", exc)
