"""What the loop asks its driver to do, and what comes back.

The loop (``core/loop.py``) is a generator: it yields one of these requests for every
effect it needs and is sent the answer. Nothing else in ``core/`` does I/O, reads a clock
or touches a store. The drivers (``runtime/drivers.py``) perform them synchronously or
asynchronously; a test can perform them by hand (``tests/core/``).

==================  =====================================  ================================
request             the driver                             sends back
==================  =====================================  ================================
``AskModel``        calls the model                        the reply, or the exception
``CallTool``        calls the tool named (with its         a :class:`ToolOutcome`
                    timeout), found in its registry
``Sleep``           waits                                  ``None``
``ReadClock``       reads the run's clock                  seconds (float)
``EmitEvents``      hands events to the run's consumers    ``None``
                    (trace sink, interceptors' on_event)
``SaveCheckpoint``  stores events + checkpoint (one txn)   ``None``
``BeginIntent``     compare-and-set of a write's intent    an :class:`IntentClaim`
                    (and its checkpoint, one txn)
``CommitIntent``    stores the write's result              ``None``
``AbortIntent``     forgets an intent of this call         ``None``
``LoadIntent``      reads an idempotency record            the record or ``None``
``ConsumeApproval`` spends one use of a limited approval   ``True`` (granted) or ``False``
                    (atomic, once per (approval, run,      (refused: no use left)
                    call))
==================  =====================================  ================================

Requests are plain frozen data (names, arguments, numbers: never a live tool or store
object), so one can be logged, compared, or sent to another process. Each declares the
type of its answer as :class:`RequestOf` ``[A]``; a driver answers through
:func:`answers`, so mypy checks every handler against its request's answer type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from fsm_agent._core.intents import IdempotencyRecord, IntentClaim

__all__ = [
    "READ_CLOCK",
    "AbortIntent",
    "AskModel",
    "BeginIntent",
    "CallTool",
    "CommitIntent",
    "ConsumeApproval",
    "EmitEvents",
    "IdempotencyRecord",
    "IntentClaim",
    "LoadIntent",
    "ModelAnswer",
    "OutcomeKind",
    "ReadClock",
    "Request",
    "RequestOf",
    "SaveCheckpoint",
    "Sleep",
    "ToolOutcome",
    "answers",
    "answers_async",
]

A = TypeVar("A")


class RequestOf(Generic[A]):
    """A request whose answer is an ``A`` (the base of every request class)."""

    __slots__ = ()


D = TypeVar("D")
Q = TypeVar("Q")
Handler = Callable[[D, Q], A]


def answers(kind: type[RequestOf[A]]) -> Callable[[Handler[D, Q, A]], Handler[D, Q, A]]:
    """Declare a driver method the handler of request ``kind``: mypy checks that it
    returns ``kind``'s answer type (``A`` is invariant: anything else does not
    type-check). Applied once, when the class is made: it costs nothing per request."""

    def mark(handler: Handler[D, Q, A]) -> Handler[D, Q, A]:
        return handler

    return mark


def answers_async(
    kind: type[RequestOf[A]],
) -> Callable[[Handler[D, Q, Awaitable[A]]], Handler[D, Q, Awaitable[A]]]:
    """:func:`answers` for an ``async def`` handler (it returns an awaitable of ``A``)."""

    def mark(handler: Handler[D, Q, Awaitable[A]]) -> Handler[D, Q, Awaitable[A]]:
        return handler

    return mark


#: What ``AskModel`` is answered with: the model's reply (any JSON-like value, judged by
#: the loop), or the exception the model raised (a failed call is an outcome).
ModelAnswer = Any

OutcomeKind = Literal["ok", "rejected", "transient", "timeout", "error", "not_started"]


@dataclass(slots=True)
class ToolOutcome:
    """What happened when a tool was called: ``ok`` | ``rejected`` | ``transient`` |
    ``timeout`` | ``error`` | ``not_started`` (cancelled before it began: nothing ran)."""

    kind: OutcomeKind
    value: Any = None
    error: str = ""


# The two requests of every tool round set their fields through their slots' own
# setters (``init=False``, same parameters): a frozen dataclass's generated ``__init__``
# calls ``object.__setattr__`` per field, which costs more than the rest of making one.
# Frozen all the same: assigning a field afterwards raises ``FrozenInstanceError``.
# (No ``-> None``: the signature reads as the generated one, docs/reference/surface.md.)


@dataclass(frozen=True, slots=True, init=False)
class AskModel(RequestOf[ModelAnswer]):
    messages: list[dict[str, Any]]
    tool_specs: list[dict[str, Any]]

    def __init__(self, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]):
        _ASK_SET[0](self, messages)
        _ASK_SET[1](self, tool_specs)


@dataclass(frozen=True, slots=True, init=False)
class CallTool(RequestOf[ToolOutcome]):
    """Call the tool named ``tool`` (the driver finds it in its registry) as call
    ``call_id``, with ``arguments`` and at most ``timeout_s`` seconds."""

    call_id: str
    tool: str
    arguments: dict[str, Any]  # a fresh deep copy per attempt (a tool may mutate it)
    timeout_s: float | None

    def __init__(self, call_id: str, tool: str, arguments: dict[str, Any], timeout_s: float | None):
        set_id, set_tool, set_arguments, set_timeout = _CALL_SET
        set_id(self, call_id)
        set_tool(self, tool)
        set_arguments(self, arguments)
        set_timeout(self, timeout_s)


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(vars(cls)[name].__set__ for name in names)


_ASK_SET = _slot_setters(AskModel, "messages", "tool_specs")
_CALL_SET = _slot_setters(CallTool, "call_id", "tool", "arguments", "timeout_s")


@dataclass(frozen=True, slots=True)
class Sleep(RequestOf[None]):
    seconds: float


@dataclass(frozen=True, slots=True)
class ReadClock(RequestOf[float]):
    pass


#: The one ``ReadClock`` request (it carries nothing).
READ_CLOCK = ReadClock()


@dataclass(frozen=True, slots=True)
class EmitEvents(RequestOf[None]):
    events: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SaveCheckpoint(RequestOf[None]):
    """Store ``events`` (appended) and the checkpoint after them, in one transaction.

    ``header`` is set on the run's first save (the store creates the run then).
    ``messages`` are ``(index, message)`` history rows to insert or replace.
    ``behind``: nothing the loop does next depends on this checkpoint being durable
    (D1), so a store may send it with the run's next statement instead of waiting.
    ``last``: the run stopped (it ended, or paused for review): no store request of
    this driving follows, so a store may let the claim go with it.
    """

    events: list[dict[str, Any]]
    snapshot: dict[str, Any]
    messages: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    header: dict[str, Any] | None = None
    behind: bool = False
    last: bool = False


@dataclass(frozen=True, slots=True)
class BeginIntent(RequestOf[IntentClaim]):
    """Begin a write's intent; with ``save``, the run's checkpoint goes in the same
    transaction (the state just before the write is dispatched: a resume that finds this
    run's pending intent knows the write may have started)."""

    record: IdempotencyRecord  # status "pending", owned by this (run, call)
    take_over: bool  # a deduplicating tool may take over another owner's pending intent
    save: SaveCheckpoint | None = None


@dataclass(frozen=True, slots=True)
class CommitIntent(RequestOf[None]):
    tool: str
    key: str
    owner: tuple[str, str]
    result: Any


@dataclass(frozen=True, slots=True)
class AbortIntent(RequestOf[None]):
    tool: str
    key: str
    owner: tuple[str, str]


@dataclass(frozen=True, slots=True)
class LoadIntent(RequestOf[IdempotencyRecord | None]):
    tool: str
    key: str


@dataclass(frozen=True, slots=True)
class ConsumeApproval(RequestOf[bool]):
    """Spend one use of configured approval ``approval_id`` (``max_uses`` in all) on call
    ``call_id`` of run ``run_id``, which is about to start. The store answers atomically:
    ``True`` if this (approval, run, call) already holds a use or one is left (then it is
    recorded), ``False`` if all ``max_uses`` went to other calls. Asking again for the
    same call (a retry, a resume) never spends a second use."""

    approval_id: str
    max_uses: int
    run_id: str
    call_id: str


Request = (
    AskModel
    | CallTool
    | Sleep
    | ReadClock
    | EmitEvents
    | SaveCheckpoint
    | BeginIntent
    | CommitIntent
    | AbortIntent
    | LoadIntent
    | ConsumeApproval
)
