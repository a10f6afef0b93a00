"""What the loop asks its driver to do, and what comes back.

The loop (``core/loop.py``) is a generator: it yields one of these requests for every
effect it needs and is sent the answer. Nothing else in ``core/`` does I/O, reads a clock
or touches a store. The drivers (``runtime/drivers.py``) perform them synchronously or
asynchronously; a test can perform them by hand (``tests/core/``).

==================  =====================================  ================================
request             the driver                             sends back
==================  =====================================  ================================
``AskModel``        calls the model                        the reply, or the exception
``CallTool``        calls the tool (with its timeout)      a :class:`ToolOutcome`
``Sleep``           waits                                  ``None``
``ReadClock``       reads the run's clock                  seconds (float)
``EmitEvents``      writes events to the trace sink        ``None``
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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fsm_agent.core.intents import IdempotencyRecord, IntentClaim

if TYPE_CHECKING:
    from fsm_agent.core.decision import PreparedCall

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
    "OutcomeKind",
    "ReadClock",
    "Request",
    "SaveCheckpoint",
    "Sleep",
    "ToolOutcome",
]

OutcomeKind = Literal["ok", "rejected", "transient", "timeout", "error", "not_started"]


@dataclass(slots=True)
class ToolOutcome:
    """What happened when a tool was called: ``ok`` | ``rejected`` | ``transient`` |
    ``timeout`` | ``error`` | ``not_started`` (cancelled before it began: nothing ran)."""

    kind: OutcomeKind
    value: Any = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class AskModel:
    messages: list[dict[str, Any]]
    tool_specs: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class CallTool:
    call: PreparedCall
    arguments: dict[str, Any]  # a fresh deep copy per attempt (a tool may mutate it)
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class ReadClock:
    pass


#: The one ``ReadClock`` request (it carries nothing).
READ_CLOCK = ReadClock()


@dataclass(frozen=True, slots=True)
class EmitEvents:
    events: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SaveCheckpoint:
    """Store ``events`` (appended) and the checkpoint after them, in one transaction.

    ``header`` is set on the run's first save (the store creates the run then).
    ``messages`` are ``(index, message)`` history rows to insert or replace.
    """

    events: list[dict[str, Any]]
    snapshot: dict[str, Any]
    messages: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    header: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class BeginIntent:
    """Begin a write's intent; with ``save``, the run's checkpoint goes in the same
    transaction (the state just before the write is dispatched: a resume that finds this
    run's pending intent knows the write may have started)."""

    record: IdempotencyRecord  # status "pending", owned by this (run, call)
    take_over: bool  # a deduplicating tool may take over another owner's pending intent
    save: SaveCheckpoint | None = None


@dataclass(frozen=True, slots=True)
class CommitIntent:
    tool: str
    key: str
    owner: tuple[str, str]
    result: Any


@dataclass(frozen=True, slots=True)
class AbortIntent:
    tool: str
    key: str
    owner: tuple[str, str]


@dataclass(frozen=True, slots=True)
class LoadIntent:
    tool: str
    key: str


@dataclass(frozen=True, slots=True)
class ConsumeApproval:
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
