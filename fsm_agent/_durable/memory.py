"""An in-process :class:`~fsm_agent._durable.store.Store` (thread-safe, bounded).

It keeps runs like a durable store does, so a run paused for review, or stopped by an
exception, can be resumed in the same process (nothing survives the process). It saves
checkpoints around writes and at every end, not after each model reply: a resume may ask
the model again, never run a write twice.

Values, not references, where it matters: idempotency results are stored as JSON text
(a tool that mutates what it returned cannot change a later replay), and everything
:meth:`MemoryStore.load_run` returns is a fresh copy. Events, history rows and snapshots
are kept as the loop made them (it never changes one after saving it; copying each
would cost more than the rest of a tool round); don't mutate the dicts of a
``RunResult`` in place if you mean to resume that run in this process.

Memory is bounded, with O(1) work per run:

* runs: at most ``max_runs``. A run that finished (any terminal state but
  ``review_required``) and is not being driven is forgotten oldest-first when room is
  needed. A run *waiting for review* is never forgotten: when every slot holds a paused
  or running run, creating another raises :class:`~fsm_agent._errors.StoreError` (settle
  some reviews, raise ``max_runs``, or use ``SqliteStore``).
* idempotency records: a committed record lives at least ``intent_ttl_s`` seconds and is
  forgotten oldest-first past ``max_intents``; a pending record is never forgotten (it
  blocks its write until someone settles it). A replay is guaranteed within that
  lifetime; past it the same request runs again.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import OrderedDict
from operator import itemgetter
from typing import Any

from fsm_agent._core.intents import IdempotencyRecord, IntentClaim, may_claim
from fsm_agent._core.state import SaveMode
from fsm_agent._durable import owners
from fsm_agent._durable.feed import ConditionWatch, KeyRecord, Watch
from fsm_agent._durable.store import (
    CancelRequest,
    Checkpoint,
    Fence,
    RunSave,
    RunSummary,
    StoredRun,
    summary_of,
)
from fsm_agent._errors import (
    ConfigError,
    IntentConflict,
    RunBusy,
    RunExists,
    RunNotFound,
    StoreError,
)

__all__ = ["MemoryStore"]

_PAUSED = "review_required"
_TERMINAL = frozenset({"done", "budget_exhausted", "protocol_error", "cancelled"})


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class _Run:
    __slots__ = (
        "body",
        "cancel",
        "created",
        "events",
        "header",
        "lease",
        "messages",
        "owner",
        "snapshot",
        "updated",
    )

    def __init__(self, header: str, owner: str, now: float) -> None:
        self.header = header
        self.snapshot: dict[str, Any] = {}
        self.body: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.owner: str | None = owner
        self.lease = 0.0
        self.created = self.updated = now
        self.cancel: CancelRequest | None = None


#: A history row's index and message (``Checkpoint.messages``), read in C.
_INDEX, _ROW = itemgetter(0), itemgetter(1)


class MemoryStore:
    """A store in this process's memory: runs, checkpoints, intents and approvals, gone
    when the process ends (tests, one-off runs; see the module docstring).

    ``keep_runs=False`` keeps idempotency records only: runs are not saved (a little less
    work per round) and cannot be resumed or reviewed."""

    blocking = False
    save_mode: SaveMode = "writes"
    #: Events are kept as the loop made them (dicts): chained only when written out
    #: (``fsm_agent._trace.chain.encode_events``), so the in-memory path pays nothing.
    wants_lines = False

    def __init__(
        self,
        *,
        keep_runs: bool = True,
        max_runs: int = 1000,
        max_intents: int = 100_000,
        intent_ttl_s: float = 24 * 3600.0,
        lease_s: float = 300.0,
    ) -> None:
        self.keeps_runs = keep_runs
        self.max_runs, self.max_intents, self.intent_ttl_s = max_runs, max_intents, intent_ttl_s
        self.lease_s = lease_s
        self._lock = threading.Lock()
        #: bumped on every saved change, under the lock: what a watch waits on.
        self._changed = threading.Condition(self._lock)
        self._version = 0
        self._keys: dict[str, KeyRecord] = {}
        self._pending: dict[tuple[str, str], IdempotencyRecord] = {}
        #: committed records (result as JSON text), oldest commit first.
        self._committed: OrderedDict[tuple[str, str], tuple[IdempotencyRecord, str, float]] = (
            OrderedDict()
        )
        self._runs: dict[str, _Run] = {}
        #: finished, unclaimed runs, oldest first: the ones that may be forgotten.
        self._finished: OrderedDict[str, None] = OrderedDict()
        #: approval id -> the (run id, call id) that hold one of its uses (at most its
        #: ``max_uses``, so bounded; never forgotten, or a use could be spent twice).
        self._approval_uses: dict[str, set[tuple[str, str]]] = {}

    # ── idempotency ───────────────────────────────────────────────────────────────

    def begin_intent(
        self,
        record: IdempotencyRecord,
        *,
        take_over: bool = False,
        fence: Fence | None = None,
        save: RunSave | None = None,
    ) -> IntentClaim:
        where = (record.tool, record.key)
        with self._lock:
            self._check_fence(fence)
            self._save_with(save)
            found = self._get(where)
            if may_claim(found, record, take_over):
                self._pending[where] = record
                return IntentClaim(True, found)
            return IntentClaim(False, found)

    def commit_intent(
        self,
        tool: str,
        key: str,
        owner: tuple[str, str],
        result: Any,
        *,
        fence: Fence | None = None,
    ) -> None:
        text = _text(result)
        with self._lock:
            self._check_fence(fence)
            current = self._pending.get((tool, key))
            if current is None:
                done = self._committed.get((tool, key))
                if done is not None and done[0].owner == owner:
                    return  # committed already (a reviewer's reconcile, a replayed commit)
                raise IntentConflict(f"no pending intent for {tool!r} key {key!r} to commit")
            del self._pending[(tool, key)]
            self._committed[(tool, key)] = (current, text, time.time())
            self._evict_intents()

    def abort_intent(
        self, tool: str, key: str, owner: tuple[str, str], *, fence: Fence | None = None
    ) -> None:
        with self._lock:
            self._check_fence(fence)
            current = self._pending.get((tool, key))
            if current is not None and current.owner == owner:
                del self._pending[(tool, key)]

    def get_intent(self, tool: str, key: str) -> IdempotencyRecord | None:
        with self._lock:
            return self._get((tool, key))

    def _check_fence(self, fence: Fence | None) -> None:
        """Refuse an intent operation of a driver that no longer holds its run's claim."""
        if fence is None or not self.keeps_runs:
            return
        run_id, owner = fence
        row = self._row(run_id)
        if row.owner != owner:
            raise RunBusy(
                f"run {run_id!r} was taken over by {row.owner or 'nobody'}; "
                "this driver stopped driving it"
            )

    #: The 0.1 name of :meth:`get_intent`.
    get_idempotency = get_intent

    def _get(self, where: tuple[str, str]) -> IdempotencyRecord | None:
        pending = self._pending.get(where)
        if pending is not None:
            return pending
        done = self._committed.get(where)
        if done is None:
            return None
        record, text, _ = done
        return IdempotencyRecord(
            record.tool,
            record.key,
            record.args_digest,
            "committed",
            record.run_id,
            record.call_id,
            json.loads(text),
            record.effect,
            record.dedup,
        )

    def _evict_intents(self) -> None:
        cutoff = time.time() - self.intent_ttl_s
        committed = self._committed
        while len(committed) > self.max_intents:
            _, (_, _, when) = next(iter(committed.items()))
            if when > cutoff:
                break  # every record left is younger than its promised lifetime
            committed.popitem(last=False)

    # ── runs ──────────────────────────────────────────────────────────────────────

    def create_run(
        self,
        run_id: str,
        header: dict[str, Any],
        owner: str,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
    ) -> None:
        header_text = _text(header)
        with self._lock:
            if run_id in self._runs:
                raise RunExists(f"run id {run_id!r} is already stored")
            if len(self._runs) >= self.max_runs:
                self._forget_one()
            now = time.time()
            row = _Run(header_text, owner, now)
            row.lease = now + self.lease_s
            self._runs[run_id] = row
            self._store(run_id, row, events, checkpoint, now)

    def _forget_one(self) -> None:
        if not self._finished:
            raise StoreError(
                f"MemoryStore is full: {len(self._runs)} runs are running or waiting for "
                "review (max_runs); settle reviews, raise max_runs or use SqliteStore"
            )
        run_id, _ = self._finished.popitem(last=False)
        del self._runs[run_id]

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        with self._lock:
            row = self._owned_row(run_id, owner)
            self._store(run_id, row, events, checkpoint, time.time())

    def _save_with(self, save: RunSave | None) -> None:
        """A run's save riding with an intent operation (under the lock, first: a fenced
        owner changes nothing at all)."""
        if save is not None:
            row = self._owned_row(save.run_id, save.owner)
            self._store(save.run_id, row, save.events, save.checkpoint, time.time())

    def _owned_row(self, run_id: str, owner: str) -> _Run:
        """The run's row if ``owner`` holds its claim (the lease renewed); else RunBusy."""
        row = self._row(run_id)
        if row.owner != owner:
            raise RunBusy(
                f"run {run_id!r} was taken over by {row.owner or 'nobody'}; "
                "this driver stopped driving it"
            )
        row.lease = time.time() + self.lease_s
        return row

    def _store(
        self,
        run_id: str,
        row: _Run,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
        now: float,
    ) -> None:
        row.events.extend(events)
        messages, rows = row.messages, checkpoint.messages
        start = len(messages)
        if rows and list(map(_INDEX, rows)) == list(range(start, start + len(rows))):
            messages.extend(map(_ROW, rows))  # only new rows, in order: the usual save
            rows = []
        for index, message in rows:
            if index == len(messages):
                messages.append(message)
            elif index < len(messages):
                messages[index] = message
            else:
                raise StoreError(f"run {run_id!r}: history row {index} after a gap")
        row.snapshot = checkpoint.snapshot
        body = checkpoint.snapshot.get("body")
        row.body = (
            {k: body.get(k) for k in ("state", "reason", "placeholders")}
            if isinstance(body, dict)
            else {}
        )
        row.updated = now
        self._finished.pop(run_id, None)
        self._bump()

    def _bump(self) -> None:
        self._version += 1
        self._changed.notify_all()

    def load_run(self, run_id: str) -> StoredRun:
        with self._lock:
            row = self._row(run_id)
            header, snapshot = row.header, _text(row.snapshot)
            messages, events = _text(row.messages), _text(row.events)
            cancel = row.cancel
        return StoredRun(
            run_id,
            json.loads(header),
            json.loads(snapshot),
            json.loads(messages),
            json.loads(events),
            cancel_request=cancel,
        )

    def adopt_run(self, run_id: str, owner: str, header: dict[str, Any]) -> bool:
        """As :meth:`PostgresStore.adopt_run`."""
        header_text = _text(header)
        with self._lock:
            row = self._row(run_id)
            if row.owner != owner:
                raise RunBusy(f"run {run_id!r} was taken over by {row.owner or 'nobody'}")
            if row.events:
                return False
            row.header = header_text
        return True

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        with self._lock:
            out = [
                summary_of(run_id, row.body, row.created, row.updated)
                for run_id, row in self._runs.items()
            ]
        out = [r for r in out if state is None or r.state == state]
        return sorted(out, key=lambda r: r.updated, reverse=True)

    def claim(self, run_id: str, owner: str) -> None:
        now = time.time()
        with self._lock:
            row = self._row(run_id)
            if row.owner not in (None, owner) and owners.is_live(row.owner, row.lease, now):
                raise RunBusy(f"run {run_id!r} is being driven by {row.owner}")
            row.owner, row.lease = owner, now + self.lease_s
            self._finished.pop(run_id, None)

    def renew(self, run_id: str, owner: str) -> CancelRequest | None:
        with self._lock:
            row = self._row(run_id)
            if row.owner != owner:
                raise RunBusy(f"run {run_id!r} was taken over by {row.owner or 'nobody'}")
            row.lease = time.time() + self.lease_s
            return row.cancel

    def request_cancel(self, run_id: str, request: CancelRequest) -> CancelRequest | None:
        """Store ``request`` for the run's driver (see :class:`CancelRequest`) unless one
        is stored already; returns the one stored now (the first: asking again changes
        nothing), or ``None`` if the run has ended (nothing stored). ``RunNotFound`` if
        there is no such run."""
        with self._lock:
            row = self._row(run_id)
            if row.body.get("state") in _TERMINAL:
                return None
            if row.cancel is None:
                row.cancel = request
                self._bump()
            return row.cancel

    def release(self, run_id: str, owner: str) -> None:
        with self._lock:
            row = self._runs.get(run_id)
            if row is None or row.owner != owner:
                return
            row.owner = None
            if row.body.get("state") in _TERMINAL:
                self._finished[run_id] = None

    def _row(self, run_id: str) -> _Run:
        row = self._runs.get(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in this store")
        return row

    # ── approval uses ─────────────────────────────────────────────────────────────

    def consume_approval(self, approval_id: str, max_uses: int, run_id: str, call_id: str) -> bool:
        """See :meth:`~fsm_agent._durable.store.ApprovalStore.consume_approval`."""
        with self._lock:
            holders = self._approval_uses.setdefault(approval_id, set())
            if (run_id, call_id) in holders:
                return True
            if len(holders) >= max_uses:
                return False
            holders.add((run_id, call_id))
            return True

    def approval_uses(self, approval_id: str) -> int:
        with self._lock:
            return len(self._approval_uses.get(approval_id, ()))

    # ── change feed and keys (the review server) ──────────────────────────────────

    def events_since(self, run_id: str, seq: int, limit: int = 1000) -> list[dict[str, Any]]:
        """See :meth:`~fsm_agent._durable.feed.FeedStore.events_since`."""
        with self._lock:
            events = self._row(run_id).events
            # Appended in seq order: bisect for the first one after ``seq``.
            start = bisect.bisect_right(events, seq, key=lambda e: int(e["seq"]))
            text = _text(events[start : start + max(limit, 0)])
        return list(json.loads(text))

    def watch(self) -> Watch:
        return ConditionWatch(self._changed, lambda: self._version)

    def add_key(self, record: KeyRecord) -> None:
        with self._lock:
            if any(k.name == record.name and k.revoked is None for k in self._keys.values()):
                raise ConfigError(f"a key named {record.name!r} exists; revoke it first")
            self._keys[record.key_id] = record

    def get_key(self, key_id: str) -> KeyRecord | None:
        with self._lock:
            return self._keys.get(key_id)

    def list_keys(self) -> list[KeyRecord]:
        with self._lock:
            return sorted(self._keys.values(), key=lambda k: k.created)

    def revoke_key(self, name: str) -> int:
        from dataclasses import replace

        now, count = time.time(), 0
        with self._lock:
            for key_id, k in list(self._keys.items()):
                if k.name == name and k.revoked is None:
                    self._keys[key_id] = replace(k, revoked=now)
                    count += 1
            self._bump()
        return count
