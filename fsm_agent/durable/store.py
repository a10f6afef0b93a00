"""Where a runtime keeps what must outlive a single call: idempotency records, runs.

The runtime talks to a :class:`Store`. :class:`MemoryStore` keeps everything for the
life of the process (one per ``Runtime`` by default, so repeated runs share it);
:class:`~fsm_agent.sqlite_store.SqliteStore` keeps it in one SQLite file. Both hold
idempotency records, runs (their trace events and a checkpoint of the state after the
last transition), approvals granted by reviewers, and a claim that lets exactly one
process drive a run at a time (see ``durable.py`` for how runs are saved and resumed).

Idempotency follows Stripe/AWS semantics: a record is written as ``pending`` before a
write runs (intent), then ``committed`` with its result; the same key with the same
arguments replays the result, the same key with different arguments is a conflict,
never an overwrite. A record left ``pending`` means the outcome is unknown.
"""

from __future__ import annotations

import copy
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from fsm_agent.errors import (
    IntentConflict,
    ReviewError,
    RunBusy,
    RunExists,
    RunNotFound,
    StoreError,
)

__all__ = [
    "Checkpoint",
    "IdempotencyRecord",
    "MemoryStore",
    "ReviewError",
    "RunBusy",
    "RunNotFound",
    "RunSummary",
    "Store",
    "StoreError",
    "StoredRun",
    "owner_token",
]


@dataclass(frozen=True)
class IdempotencyRecord:
    tool: str
    key: str
    args_digest: str
    status: Literal["pending", "committed"]
    run_id: str
    call_id: str
    result: Any = None

    @property
    def owner(self) -> tuple[str, str]:
        return (self.run_id, self.call_id)


@dataclass
class Checkpoint:
    """What a run needs to continue, saved atomically with the events that led to it.

    ``ctx`` is the small mutable context (state, counters, the batch position, ...);
    ``messages`` are ``(index, message)`` rows to insert or replace, so the history is
    written append-only except where a reviewer's decision replaces a placeholder.
    ``approvals`` are ``(call_id, tool, digest)`` granted by a reviewer for this run.
    ``intents`` are ``pending`` idempotency records of a write about to run, stored in
    the same transaction as the checkpoint that starts its attempt (a durable store may
    do so to save a transaction; ``begin_idempotency`` then finds them already there).
    """

    ctx: dict[str, Any]
    messages: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    approvals: list[tuple[str, str, str]] = field(default_factory=list)
    intents: list[IdempotencyRecord] = field(default_factory=list)


@dataclass
class StoredRun:
    """A run as stored: its ``run_start`` header, last checkpoint, history and events."""

    run_id: str
    header: dict[str, Any]
    ctx: dict[str, Any]
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    approvals: list[tuple[str, str, str]]


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    state: str
    reason: str
    pending: int
    created: float
    updated: float


def owner_token() -> str:
    """Who is driving a run: ``host:pid:random``; a dead pid on this host frees its claim."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


def claim_is_stale(owner: str | None, expires: float, now: float) -> bool:
    """A claim can be taken over when its process on this host is gone, or, for a
    process on another host (which cannot be asked), when its lease expired."""
    if not owner:
        return True
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return expires <= now
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # another thread of this process: alive by definition
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False


class Store(Protocol):
    """What the runtime needs from a store.

    The idempotency part is required; the run part (``create_run`` and below) is what
    durable runs, resume and review need. A store without it still runs agents.
    """

    def get_idempotency(self, tool: str, key: str) -> IdempotencyRecord | None: ...

    def begin_idempotency(self, record: IdempotencyRecord) -> None:
        """Store the intent (``pending``) before the write runs; replaces only a pending
        record of the same arguments (a retry or a deduplicated re-run)."""

    def commit_idempotency(self, tool: str, key: str, result: Any) -> None:
        """Record the write's result; afterwards the same request replays it."""

    def abort_idempotency(self, tool: str, key: str) -> None:
        """Forget a pending record whose write definitely did not happen."""

    #: True for a store that outlives the process: a checkpoint is also committed after
    #: every model reply. False (memory): only around writes, at ends and on resume.
    checkpoint_every_transition: bool

    def create_run(
        self,
        run_id: str,
        header: dict[str, Any],
        owner: str,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
    ) -> None:
        """Store a new run claimed by ``owner`` with its first events; ``ValueError`` if
        the id is taken."""

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        """Append ``events`` and replace the checkpoint in one transaction; ``RunBusy``
        if ``owner`` no longer holds the claim (nothing is written then)."""

    def load_run(self, run_id: str) -> StoredRun:
        """The stored run; ``RunNotFound`` if there is none."""
        ...

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        """Stored runs, newest first, optionally only those in ``state``."""
        ...

    def claim(self, run_id: str, owner: str) -> None:
        """Make ``owner`` the one driver of the run; ``RunBusy`` if a live one holds it,
        ``RunNotFound`` if there is no such run."""

    def release(self, run_id: str, owner: str) -> None:
        """Give up the claim (no-op if ``owner`` does not hold it)."""


class MemoryStore:
    """An in-process :class:`Store` (thread-safe).

    It keeps runs like a durable store does, so a run paused for review, or abandoned
    by an exception no part of the engine catches, can be resumed in the same process
    (nothing survives the process). It checkpoints around writes and at every end, not
    after each model reply: a resume may ask the model again, never run a write twice.
    """

    checkpoint_every_transition = False

    def __init__(self, *, keep_runs: bool = True, max_runs: int = 1000) -> None:
        #: ``keep_runs=False`` keeps idempotency records only: runs are not saved (about
        #: 8 µs less per tool round) and cannot be resumed or reviewed.
        self.keeps_runs = keep_runs
        #: Past this many runs the oldest finished ones are forgotten (runs waiting for
        #: review and runs being driven are kept), so a long-lived process stays bounded.
        self.max_runs = max_runs
        self._records: dict[tuple[str, str], IdempotencyRecord] = {}
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, Any]] = {}

    def get_idempotency(self, tool: str, key: str) -> IdempotencyRecord | None:
        return self._records.get((tool, key))

    def begin_idempotency(self, record: IdempotencyRecord) -> None:
        with self._lock:
            current = self._records.get((record.tool, record.key))
            if current is not None and (
                current.status == "committed" or current.args_digest != record.args_digest
            ):
                raise IntentConflict(f"idempotency key {record.key!r} of {record.tool!r} is taken")
            self._records[(record.tool, record.key)] = record

    def commit_idempotency(self, tool: str, key: str, result: Any) -> None:
        with self._lock:
            current = self._records.get((tool, key))
            if current is None:
                raise IntentConflict(f"no idempotency record for {tool!r} key {key!r}")
            self._records[(tool, key)] = replace(current, status="committed", result=result)

    def abort_idempotency(self, tool: str, key: str) -> None:
        with self._lock:
            current = self._records.get((tool, key))
            if current is not None and current.status == "pending":
                del self._records[(tool, key)]

    # ── runs ──────────────────────────────────────────────────────────────────────

    def create_run(
        self,
        run_id: str,
        header: dict[str, Any],
        owner: str,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
    ) -> None:
        with self._lock:
            if run_id in self._runs:
                raise RunExists(f"run id {run_id!r} is already stored")
            if len(self._runs) >= self.max_runs:
                self._forget_finished()
            now = time.time()
            self._runs[run_id] = {
                "header": copy.deepcopy(header),
                "ctx": {},
                "messages": [],
                "events": [],
                "approvals": [],
                "owner": owner,
                "created": now,
                "updated": now,
            }
            self._save(self._runs[run_id], events, checkpoint, now)

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        with self._lock:
            row = self._row(run_id)
            if row["owner"] != owner:
                raise RunBusy(
                    f"run {run_id!r} was taken over by {row['owner']}; "
                    "this process stopped driving it"
                )
            self._save(row, events, checkpoint, time.time())

    def _save(
        self, row: dict[str, Any], events: list[dict[str, Any]], checkpoint: Checkpoint, now: float
    ) -> None:
        # References, not copies: a run never mutates an event or message dict once
        # emitted (a replaced placeholder is a new dict) and ``ctx`` is built fresh for
        # every checkpoint; ``load_run`` copies, because a resumed run is live again.
        row["events"].extend(events)
        messages = row["messages"]
        for index, message in checkpoint.messages:
            if index == len(messages):
                messages.append(message)
            else:
                messages[index] = message
        row["ctx"] = checkpoint.ctx
        row["approvals"].extend(checkpoint.approvals)
        for record in checkpoint.intents:  # callers hold self._lock
            self._records[(record.tool, record.key)] = record
        row["updated"] = now

    def _forget_finished(self) -> None:
        excess = len(self._runs) - self.max_runs + 1
        for run_id in [
            r
            for r, row in self._runs.items()  # oldest first
            if row["owner"] is None and row["ctx"].get("state") != "review_required"
        ][:excess]:
            del self._runs[run_id]

    def load_run(self, run_id: str) -> StoredRun:
        with self._lock:
            row = self._row(run_id)
            return StoredRun(
                run_id,
                copy.deepcopy(row["header"]),
                copy.deepcopy(row["ctx"]),
                copy.deepcopy(row["messages"]),
                copy.deepcopy(row["events"]),
                list(row["approvals"]),
            )

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        with self._lock:
            out = [
                RunSummary(
                    run_id,
                    row["ctx"].get("state", ""),
                    row["ctx"].get("reason") or "",
                    len(row["ctx"].get("placeholders") or {}),
                    row["created"],
                    row["updated"],
                )
                for run_id, row in self._runs.items()
            ]
        out = [r for r in out if state is None or r.state == state]
        return sorted(out, key=lambda r: r.updated, reverse=True)

    def claim(self, run_id: str, owner: str) -> None:
        with self._lock:
            row = self._row(run_id)
            if row["owner"] not in (None, owner):
                raise RunBusy(f"run {run_id!r} is being driven by {row['owner']}")
            row["owner"] = owner

    def release(self, run_id: str, owner: str) -> None:
        with self._lock:
            row = self._runs.get(run_id)
            if row is not None and row["owner"] == owner:
                row["owner"] = None

    def _row(self, run_id: str) -> dict[str, Any]:
        row = self._runs.get(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in this store")
        return row
