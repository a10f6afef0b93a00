"""The store protocol: where a runtime keeps what must outlive a single call.

A store holds idempotency records (write-ahead intents and their results), runs (their
trace events, history rows and the checkpoint after the last saved transition) and a
claim that lets exactly one owner drive a run at a time. :class:`~fsm_agent._durable.
memory.MemoryStore` keeps them for the life of the process;
:class:`~fsm_agent._durable.sqlite.SqliteStore` in one SQLite file;
:class:`~fsm_agent._durable.postgres.PostgresStore` in PostgreSQL, shared by a fleet of
workers on many hosts. Every store raises
only :class:`~fsm_agent._errors.StoreError` and its subclasses, naming the store and the
cause.

Idempotency follows Stripe/AWS semantics and is exactly-once across runs, threads,
processes and hosts sharing a store (R7, R11): :meth:`Store.begin_intent` is one atomic
compare-and-set that both reads what is under the key and, if nothing blocks, writes this
call's ``pending`` intent; the write runs only if this call owns the intent; the result
is then ``committed``; the same key with the same arguments replays it, with different
arguments it is a conflict, never an overwrite. A record left ``pending`` means the
outcome is unknown: no other call runs that write until a trusted party settles it.
Pending records are never evicted; committed ones live at least as long as the store's
documented intent lifetime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeGuard, runtime_checkable

from fsm_agent._core.intents import IdempotencyRecord, IntentClaim
from fsm_agent._core.state import SaveMode
from fsm_agent._errors import CorruptRecord

__all__ = [
    "ApprovalStore",
    "CancelRequest",
    "Checkpoint",
    "Fence",
    "Head",
    "IdempotencyRecord",
    "IntentClaim",
    "RunSave",
    "RunStore",
    "RunSummary",
    "Store",
    "StoredRun",
    "supports_approvals",
    "supports_runs",
]


#: ``(run_id, owner)``: the run being driven and the owner token that must still hold its
#: claim for an intent operation to be accepted (see :meth:`Store.begin_intent`).
Fence = tuple[str, str]


@dataclass
class Checkpoint:
    """What a run needs to continue, saved atomically with the events that led to it.

    ``snapshot`` is :meth:`RunState.snapshot` (versioned, checksummed); ``messages`` are
    ``(index, message)`` history rows to insert or replace, so the history is written
    append-only except where a reviewer's decision replaces a placeholder.

    ``event_lines``, when set, are the saved events' trace lines, one per event in the
    same order: each event encoded once, with its run id and chain link
    (``trace/chain.py``), the very bytes the run's trace file gets. A store that keeps
    events as JSON text (``wants_lines = True``) stores these lines verbatim instead of
    encoding the events itself; a store that keeps dicts ignores them.
    """

    snapshot: dict[str, Any]
    messages: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    event_lines: list[str] | None = None


@dataclass(frozen=True)
class RunSave:
    """A run's save riding with another store operation (see ``begin_intent``)."""

    run_id: str
    owner: str
    events: list[dict[str, Any]]
    checkpoint: Checkpoint


class Head(NamedTuple):
    """Which version of a run a read saw: its last event's ``seq`` (-1: none) and the
    stored checksum of its checkpoint's text. Every save that changes the run changes
    one of them (a claim changes neither: it changes who holds the run, not the run)."""

    seq: int
    checksum: int


@dataclass(frozen=True)
class CancelRequest:
    """A cancel asked of a run its store keeps (the review server, ``fsm-agent runs
    cancel``) while a driver held it or before one continues it: stored with the run, it
    reaches the driver with its lease renewal (``Heartbeat``) or with its claim, and the
    driver stops the run through the ``cancel`` trigger with these fields, as a direct
    cancel records them. ``at``: when it was asked (ISO-8601 UTC)."""

    at: str
    by: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, str]:
        """The request as the API shows it and the store keeps it (absent, not null,
        where not given)."""
        given = {"by": self.by, "at": self.at, "note": self.note}
        return {k: v for k, v in given.items() if v is not None}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def loads(cls, text: Any, where: str) -> CancelRequest | None:
        """The request a store kept as :meth:`dumps` text (``None``: there is none);
        :class:`~fsm_agent._errors.CorruptRecord`, naming ``where``, if it is not one."""
        if text is None:
            return None
        try:
            data = json.loads(text)
            at, by, note = data["at"], data.get("by"), data.get("note")
        except (ValueError, TypeError, KeyError):
            raise CorruptRecord(f"{where}: the stored cancel request is unreadable") from None
        texts = isinstance(at, str) and all(v is None or isinstance(v, str) for v in (by, note))
        if not texts:
            raise CorruptRecord(f"{where}: the stored cancel request is unreadable")
        return cls(at, by, note)


@dataclass
class StoredRun:
    """A run as stored: its header (the caller's settings), last checkpoint, history and
    trace events, and the cancel asked of it, if any (:class:`CancelRequest`). ``head``:
    the version read, where the store can tell it (SQLite, PostgreSQL): a decision judged
    on this read is written only while the run is still at it (``record_review(...,
    seen=)``)."""

    run_id: str
    header: dict[str, Any]
    snapshot: dict[str, Any]
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    head: Head | None = None
    cancel_request: CancelRequest | None = None

    @property
    def body(self) -> dict[str, Any]:
        """The checkpoint's fields (unverified: for listing, never for resuming)."""
        body = self.snapshot.get("body") if isinstance(self.snapshot, dict) else None
        return body if isinstance(body, dict) else {}


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    state: str
    reason: str
    pending: int
    created: float
    updated: float


class Store(Protocol):
    """The idempotency part every store has (a store may keep no runs)."""

    #: Its operations block (file or network I/O): the async driver runs them in a
    #: worker thread so the event loop never waits on them.
    blocking: bool

    def begin_intent(
        self,
        record: IdempotencyRecord,
        *,
        take_over: bool = False,
        fence: Fence | None = None,
        save: RunSave | None = None,
    ) -> IntentClaim:
        """Atomically: read what is under ``(record.tool, record.key)``; if nothing, or a
        pending intent of this very owner, or (``take_over``, for a deduplicating tool) a
        pending intent of another owner with the same arguments, make ``record`` the
        pending intent and answer ``owned=True``; otherwise leave the record and answer
        ``owned=False``. ``found`` is what was there before.

        ``fence`` (a store that keeps runs): ``(run_id, owner)`` of the driving that asks.
        In the same atomic step the store checks that ``owner`` still holds the claim on
        that run, and changes nothing (:class:`~fsm_agent._errors.RunBusy`) if it does not:
        a driver that lost its claim (stalled past its lease) can begin, commit or abort
        no write after another driver took the run over.

        ``save`` (a store that keeps runs): also store the run's events and checkpoint,
        exactly as :meth:`RunStore.save` would, in the same transaction — all of it or
        none. It is fenced by its own ``(run_id, owner)``, which ``fence`` (if given)
        must be."""
        ...

    def commit_intent(
        self,
        tool: str,
        key: str,
        owner: tuple[str, str],
        result: Any,
        *,
        fence: Fence | None = None,
    ) -> None:
        """Record the write's result (the pending intent becomes ``committed``);
        :class:`~fsm_agent._errors.IntentConflict` if no intent with those arguments is
        there. ``fence`` as for :meth:`begin_intent`."""

    def abort_intent(
        self, tool: str, key: str, owner: tuple[str, str], *, fence: Fence | None = None
    ) -> None:
        """Forget ``owner``'s pending intent: its write definitely did not happen.
        ``fence`` as for :meth:`begin_intent`."""

    def get_intent(self, tool: str, key: str) -> IdempotencyRecord | None: ...


@runtime_checkable
class RunStore(Store, Protocol):
    """A store that also keeps runs: durable runs, resume and review need this part."""

    keeps_runs: bool
    #: Optional (absent means False): the store keeps events as JSON text, so the driver
    #: hands it each event's chained trace line in ``Checkpoint.event_lines`` and the
    #: store keeps those bytes. Events it loads back then carry ``run`` and ``chain``.
    wants_lines: bool
    #: When runs save checkpoints: ``writes`` (around writes and at ends: a store that
    #: dies with the process) or ``replies`` (also after each model reply).
    save_mode: SaveMode
    #: How long a claim holds without renewal, for owners this host cannot ask.
    lease_s: float

    def create_run(
        self,
        run_id: str,
        header: dict[str, Any],
        owner: str,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
    ) -> None:
        """Store a new run claimed by ``owner`` with its first events;
        :class:`~fsm_agent._errors.RunExists` if the id is taken."""

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        """Append ``events`` and replace the checkpoint in one transaction;
        :class:`~fsm_agent._errors.RunBusy` if ``owner`` no longer holds the claim
        (nothing is written then: a fenced owner commits nothing)."""

    def load_run(self, run_id: str) -> StoredRun:
        """The stored run; :class:`~fsm_agent._errors.RunNotFound` if there is none."""
        ...

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        """Stored runs, newest first, optionally only those in ``state``."""
        ...

    def claim(self, run_id: str, owner: str) -> None:
        """Make ``owner`` the one driver of the run; ``RunBusy`` if a live owner holds it
        (``durable/owners.py``), ``RunNotFound`` if there is no such run."""

    def renew(self, run_id: str, owner: str) -> CancelRequest | None:
        """Extend ``owner``'s lease (a heartbeat); ``RunBusy`` if it lost the claim. Returns
        the run's :class:`CancelRequest` if one is stored (in the renewal's own statement:
        the driver learns of a cancel without a read of its own), else ``None``."""

    def release(self, run_id: str, owner: str) -> None:
        """Give up the claim (no-op if ``owner`` does not hold it)."""


@runtime_checkable
class ApprovalStore(Protocol):
    """A store that counts the uses of limited approvals (``Approval(max_uses=...)``),
    for every runtime, process and host that shares it (R8)."""

    def consume_approval(self, approval_id: str, max_uses: int, run_id: str, call_id: str) -> bool:
        """Atomically: if call ``call_id`` of run ``run_id`` holds a use of ``approval_id``
        already, answer ``True`` (a retry or a resume never spends twice); else, if fewer
        than ``max_uses`` calls hold one, record this call's and answer ``True``; else
        change nothing and answer ``False``. The count never exceeds ``max_uses``, however
        many drivers ask at once."""
        ...

    def approval_uses(self, approval_id: str) -> int:
        """How many calls hold a use of ``approval_id``."""
        ...


def supports_approvals(store: object) -> TypeGuard[ApprovalStore]:
    """Whether ``store`` counts approval uses (a limited approval needs one that does)."""
    return isinstance(store, ApprovalStore)


def supports_runs(store: object) -> TypeGuard[RunStore]:
    """Whether ``store`` keeps runs (stores may keep idempotency records only)."""
    if not getattr(store, "keeps_runs", False):
        return False
    kind = type(store)
    if kind in _RUN_STORES:
        return True
    # A protocol's isinstance walks its every member: costlier than a short run. A
    # class found to have them all keeps them (a store that lacks one is asked again).
    if isinstance(store, RunStore):
        _RUN_STORES.add(kind)
        return True
    return False


_RUN_STORES: set[type] = set()


def summary_of(run_id: str, body: dict[str, Any], created: float, updated: float) -> RunSummary:
    return RunSummary(
        run_id,
        str(body.get("state", "")),
        str(body.get("reason") or ""),
        len(body.get("placeholders") or {}),
        created,
        updated,
    )


Status = Literal["pending", "committed"]
