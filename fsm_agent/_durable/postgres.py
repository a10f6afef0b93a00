"""A :class:`~fsm_agent._durable.store.RunStore` on PostgreSQL, shared by a fleet of workers.

``PostgresStore(dsn)`` keeps what :class:`~fsm_agent._durable.sqlite.SqliteStore` keeps —
runs, append-only trace events, history rows, checksummed checkpoints, idempotency
intents — with the same semantics, so ``Runtime``, resume, review and ``fsm-agent runs``
work on it unchanged; and a queue of runs that workers on any number of hosts claim
(``fsm_agent._runtime.worker``). Install with ``pip install 'fsm-agent[postgres]'``
(psycopg 3 and psycopg-pool).

Exactly once across the fleet (R11):

* A write's intent is begun by one server-side compare-and-set (``pg_schema.py``): two
  workers never both own one key.
* A run is driven by one owner at a time. A claim sets the owner and increments the run's
  **epoch** (the fencing token); the owner holds it with a lease, judged by the server's
  clock and renewed by heartbeats. Every commit of a driver — a checkpoint, an intent
  begun, committed or aborted, a renewal — names its owner and epoch and is refused
  (:class:`~fsm_agent._errors.RunBusy`, nothing written) once another owner took the run:
  a worker stalled past its lease (a GC pause, SIGSTOP, a network cut) commits nothing
  after that. A write it had in flight is settled by the outcome-unknown rule.
* Unlike a single host, a live process is no proof of a live owner (a stopped process
  lives): a claim lapses with its lease alone, or at once when its process is known dead
  on this host (``owners.is_dead``).

Every failure is a one-line :class:`~fsm_agent._errors.StoreError` naming the server
(never the password) and the cause: a bad DSN, a server that is down or restarting, a
connection cut, a statement timeout, a schema from a newer fsm-agent, a schema of another
program. A statement that fails is not retried: whether it committed may be unknown, and
the run continues from its last checkpoint under the usual rules.

Each checkpoint is one SQL statement (the fenced update of the run row and the inserts of
its events and history rows, in one implicit transaction): one round trip. A write's
result goes *behind* (``commit_intent_behind``): the driver does not wait for it; it is
sent with the driving's next statement, pipelined in the same round trip and the same
transaction (psycopg's pipeline mode, one Sync). A batch of reads' checkpoint goes
*ahead* (``save_behind``): sent at once as its own transaction on the driving's
pipelined connection, its answer read with the driving's next statement that waits. So
a durable round waits on the fewest round trips the D rules allow
(``docs/concepts/durable-runs.md``).
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from typing import Any

from fsm_agent._core.actions import BLOCKING
from fsm_agent._core.requests import IdempotencyRecord, IntentClaim
from fsm_agent._core.state import SaveMode
from fsm_agent._durable import owners, pg_sql
from fsm_agent._durable.feed import KeyRecord, Watch
from fsm_agent._durable.pg_conn import alive, conninfo, is_postgres_dsn, store_error
from fsm_agent._durable.pg_schema import SCHEMA_VERSION, open_schema
from fsm_agent._durable.store import (
    CancelRequest,
    Checkpoint,
    Fence,
    Head,
    RunSave,
    RunSummary,
    StoredRun,
)
from fsm_agent._errors import (
    ConfigError,
    CorruptRecord,
    IntentConflict,
    RunBusy,
    RunExists,
    RunNotFound,
    StoreError,
)

__all__ = ["SCHEMA_VERSION", "Claim", "PostgresStore", "is_postgres_dsn"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_FINISHED = ("done", "budget_exhausted", "protocol_error", "cancelled")
#: At most this many checkpoints a driving sends ahead before it reads their answers
#: (``PostgresStore.save_behind``): the next waits for them all. It bounds what a driver
#: that lost its claim spends before it learns so (the worker's heartbeat learns it too).
_AHEAD = 16
#: A running worker reports at least this often (``runtime/worker.py``); one silent for
#: longer than this and the lease is listed as ``lost``.
_REPORTS_S = 5.0


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _sum(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _intent_sum(digest: str, run_id: str, call_id: str, effect: str, dedup: bool) -> int:
    return _sum("|".join((digest, run_id, call_id, effect, "1" if dedup else "0")))


def _result_sum(status: str, result: str | None) -> int:
    return _sum(f"{status}|{result or ''}")


def runnable(body: dict[str, Any]) -> bool:
    """Whether a worker may drive a run with this checkpoint now: a working state, or a
    review whose every blocking call has a reviewer's decision (``loop.settled``)."""
    state = body.get("state")
    if state in _FINISHED:
        return False
    if state != "review_required":
        return True
    reviews = body.get("reviews") or {}
    placeholders = body.get("placeholders") or {}
    return bool(reviews) and all(
        call_id in reviews
        for call_id, entry in placeholders.items()
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[1] in BLOCKING
    )


def _columns(snapshot: dict[str, Any]) -> dict[str, Any]:
    body = snapshot.get("body") if isinstance(snapshot, dict) else None
    body = body if isinstance(body, dict) else {}
    return {
        "state": str(body.get("state", "")),
        "reason": str(body.get("reason") or ""),
        "pending": len(body.get("placeholders") or {}),
        "runnable": runnable(body),
    }


@dataclass(frozen=True)
class Claim:
    """A run a worker claimed from the queue: drive it as ``owner`` (fencing epoch
    ``epoch``). ``why``: ``new``, ``reviewed`` (its reviews are settled), ``orphaned``
    (its owner's lease expired) or ``released`` (an owner let it go unfinished)."""

    run_id: str
    owner: str
    epoch: int
    why: str


@dataclass(frozen=True)
class _Behind:
    """A statement waiting to go with its driving's next one: a write's result
    (``tool``, ``key``, ``owner`` of its intent) or a checkpoint (``tool`` is None)."""

    sql: str
    params: dict[str, Any]
    tool: str | None = None
    key: str = ""
    owner: tuple[str, str] = ("", "")
    #: a checkpoint's last event (whether it landed is read from the run's events)
    seq: int | None = None


@dataclass
class _Pipe:
    """A driving's connection in pipeline mode while it has checkpoints sent ahead:
    ``sent``, one transaction each, their answers not read yet. No Sync is sent until
    the driving's next statement that waits: a statement the server refuses makes it
    skip everything after it until that Sync, so nothing is stored past a refusal."""

    stack: contextlib.ExitStack
    conn: Any = None
    sent: list[list[_Behind]] | None = None


class PostgresStore:
    """Runs, events, checkpoints, intents and the run queue in one PostgreSQL schema.

    ``dsn``: a libpq connection string or ``postgresql://`` URI. ``schema``: the
    PostgreSQL schema that holds fsm-agent's tables (created on first use; a schema that
    holds anything else is never written into). ``lease_s``: how long a claim holds
    without a heartbeat (the heartbeat renews it every third of that). ``timeout``: how
    long to wait for a connection. ``statement_timeout_s``: the server cancels a statement
    that runs longer. ``pool_size``: connections kept open. ``create=False`` refuses a
    database where fsm-agent's schema does not exist yet; ``readonly=True`` opens
    read-only sessions (the CLI's read commands).
    """

    blocking = True
    keeps_runs = True
    save_mode: SaveMode = "replies"
    #: Events are stored as the driver's chained trace lines (``Checkpoint.event_lines``).
    wants_lines = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fsm_agent",
        lease_s: float = 30.0,
        timeout: float = 5.0,
        statement_timeout_s: float = 30.0,
        pool_size: int = 8,
        create: bool = True,
        readonly: bool = False,
    ) -> None:
        try:
            import psycopg  # noqa: F401
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise ConfigError(
                "PostgresStore needs psycopg 3 and psycopg-pool: pip install 'fsm-agent[postgres]'"
            ) from None
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(f"schema must be a lower-case SQL identifier, got {schema!r}")
        self.schema, self.lease_s, self.timeout = schema, lease_s, timeout
        #: the most connections it opens (a server bounds its concurrent reads by it)
        self.pool_size, self.readonly = max(pool_size, 1), readonly
        self.statement_timeout_s, self._lock = statement_timeout_s, threading.Lock()
        self.channel = f"{schema}_work"
        self.conninfo, self.name = conninfo(dsn, statement_timeout_s, readonly, timeout)
        self.sql = pg_sql.Statements(f'"{schema}"')
        #: the epoch each owner token of this process claimed at (its fencing token)
        self._epochs: dict[str, int] = {}
        #: per driving ``(run_id, owner)``: the statements that go with its next one
        self._behind: dict[tuple[str, str], list[_Behind]] = {}
        #: drivings whose last checkpoint released their claim (``save_and_release``)
        self._released: set[tuple[str, str]] = set()
        #: the runs ``claim_next`` read with their claims, until ``load_claimed``; per
        #: driving, its connection while checkpoints it sent ahead are unanswered
        self._picked: dict[tuple[str, str], Any] = {}
        self._pipes: dict[tuple[str, str], _Pipe] = {}
        timeouts = (timeout, statement_timeout_s)
        open_schema(self.conninfo, self.name, schema, readonly=readonly, create=create,
                    timeouts=timeouts)  # fmt: skip
        self._pool = ConnectionPool(
            self.conninfo,
            kwargs={"autocommit": True},
            min_size=1,
            max_size=max(pool_size, 1),
            timeout=timeout,
            open=False,
            name=f"fsm-agent {self.name}",
            check=alive,
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
        except Exception as exc:
            self._pool.close()
            raise self._error(exc) from None

    # ── opening ───────────────────────────────────────────────────────────────────

    def close(self) -> None:
        with self._lock:
            pipes, self._pipes = list(self._pipes.values()), {}
        for pipe in pipes:  # (drivings that did not end): their answers read, if any come
            try:
                pipe.stack.close()
                self._pool.putconn(pipe.conn)
            except Exception:
                self._discard(pipe)
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ── connections and errors ────────────────────────────────────────────────────

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection (autocommit); any driver error becomes a ``StoreError``."""
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            with self._pool.connection(timeout=self.timeout) as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            if isinstance(exc, psycopg.OperationalError):
                # Drop the pool's other connections that died with this one (a server
                # restart kills them all), so the next operation gets a fresh one.
                threading.Thread(target=self._pool.check, daemon=True).start()
            raise self._error(exc) from None

    def _one(self, sql: str, params: Any = None) -> Any:
        with self.connection() as conn:
            return conn.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Any = None) -> list[Any]:
        with self.connection() as conn:
            return list(conn.execute(sql, params).fetchall())

    # ── statements behind ─────────────────────────────────────────────────────────

    def _queued(self, fence: Fence) -> list[_Behind]:
        """Take what waits behind the driving ``fence`` (in its order)."""
        if not self._behind:  # the common case: nothing waits, no lock taken
            return []
        with self._lock:
            return self._behind.pop(fence, [])

    def _claimed(self, run_id: str, owner: str, epoch: int) -> None:
        """``owner`` claimed ``run_id`` at ``epoch``: what other drivings of it in this
        process still had behind is dropped — the claim refuses it anyway, as it
        would have died with a process that was killed."""
        with self._lock:
            self._epochs[owner] = epoch
            self._released.discard((run_id, owner))
            if self._behind:
                for k in [k for k in self._behind if k[0] == run_id and k[1] != owner]:
                    del self._behind[k]
            stale = [k for k in self._pipes if k[0] == run_id and k[1] != owner]
            pipes = [self._pipes.pop(k) for k in stale]
        for pipe in pipes:
            self._discard(pipe)

    def _one_after(self, fence: Fence | None, sql: str, params: Any) -> Any:
        """``_one(sql, params)`` after what waits behind the driving ``fence``: all in
        one round trip and one transaction (after its checkpoints sent ahead, on their
        connection: that round trip reads their answers too)."""
        if fence is None:
            return self._one(sql, params)
        pipe = self._live(fence, self._pipes.get(fence)) if self._pipes else None
        queued = self._queued(fence)
        if pipe is not None:
            return self._on_pipe(fence, pipe, queued, sql, params)
        return self._flush(queued, sql, params)

    # ── checkpoints sent ahead ────────────────────────────────────────────────────

    def _pipe(self, fence: Fence) -> _Pipe | None:
        """The driving's pipelined connection, opened if the pool can spare one (two
        stay for everything else: a driving holds its pipe through a model call)."""
        import psycopg
        from psycopg_pool import PoolTimeout

        live = self._live(fence, self._pipes.get(fence))
        if live is not None:
            return live
        with self._lock:
            if len(self._pipes) >= self.pool_size - 2:
                return None
            pipe = self._pipes[fence] = _Pipe(contextlib.ExitStack(), sent=[])
        try:
            pipe.conn = self._pool.getconn(timeout=self.timeout)
            pipe.stack.enter_context(pipe.conn.pipeline())
        except (psycopg.Error, PoolTimeout) as exc:
            self._drop(fence, pipe)
            raise self._error(exc) from None
        return pipe

    def _live(self, fence: Fence, pipe: _Pipe | None) -> _Pipe | None:
        """``pipe``, if its connection still holds. One the server closed between two
        statements (a restart, an administrator, an idle timeout) is discarded, as the
        pool discards an idle connection it finds closed: nothing was sent on it since,
        and what it had sent that did not land goes with the driving's next statement
        (the events' primary key refuses a transaction that landed twice)."""
        if pipe is None or pipe.conn is None or _holds(pipe.conn):
            return pipe
        sent = pipe.sent or []
        self._drop(fence, pipe, broken=True)
        threading.Thread(target=self._pool.check, daemon=True).start()
        again = self._settle_refused([], sent, lost=True)
        if again:
            with self._lock:
                self._behind.setdefault(fence, [])[:0] = again
        return None

    def _send_ahead(self, fence: Fence, pipe: _Pipe, items: list[_Behind]) -> None:
        """Send ``items`` (what rode behind, then a checkpoint) as one transaction on
        the driving's pipe, without waiting for the answer: the server commits it as
        it arrives, and a statement of it that is refused stops everything after it."""
        import psycopg

        assert pipe.sent is not None
        conn = pipe.conn
        try:
            conn.execute("BEGIN")
            for b in items:
                conn.execute(b.sql, b.params)
            conn.execute("COMMIT")
            _flushed(conn)
        except psycopg.Error as exc:  # an answer read meanwhile: a refusal, a cut
            again = self._broken(fence, pipe, exc, items)
            with self._lock:
                self._behind.setdefault(fence, [])[:0] = again
            return
        pipe.sent.append(items)
        if len(pipe.sent) >= _AHEAD:
            self._on_pipe(fence, pipe, [], None, None)

    def _on_pipe(
        self, fence: Fence, pipe: _Pipe, queued: list[_Behind], sql: str | None, params: Any
    ) -> Any:
        """``queued`` and ``sql`` after the checkpoints sent ahead, then the Sync: one
        round trip answers them all, and the connection goes back to the pool."""
        import psycopg

        conn = pipe.conn
        try:
            for b in queued:
                conn.execute(b.sql, b.params)
            cursor = None if sql is None else conn.execute(sql, params)
            pipe.stack.close()  # the Sync, and every answer read
            row = None if cursor is None else cursor.fetchone()
        except psycopg.Error as exc:
            again = self._broken(fence, pipe, exc, queued)
            if sql is None:  # (the bound of _AHEAD): they ride with the next statement
                with self._lock:
                    self._behind.setdefault(fence, [])[:0] = again
                return None
            return self._flush(again, sql, params)
        self._drop(fence, pipe)
        return row

    def _broken(
        self, fence: Fence, pipe: _Pipe, exc: BaseException, queued: list[_Behind]
    ) -> list[_Behind]:
        """A pipe whose server refused a statement (or that failed): discarded, and
        what of it and of ``queued`` is to be sent again (see ``_settle_refused``)."""
        import psycopg

        sent = pipe.sent or []
        self._drop(fence, pipe, broken=True)
        if isinstance(exc, psycopg.OperationalError):
            threading.Thread(target=self._pool.check, daemon=True).start()
        if not (
            isinstance(exc, psycopg.errors.InvalidTextRepresentation) and pg_sql.REFUSED in str(exc)
        ):
            raise self._error(exc) from None
        return self._settle_refused(queued, sent)

    def _drop(self, fence: Fence, pipe: _Pipe, *, broken: bool = False) -> None:
        with self._lock:
            if self._pipes.get(fence) is pipe:
                del self._pipes[fence]
        if broken:
            self._discard(pipe)
        elif pipe.conn is not None:
            self._pool.putconn(pipe.conn)

    def _discard(self, pipe: _Pipe) -> None:
        """Close a pipe's connection unread (the pool replaces it): what it had sent is
        refused or committed by the server alone."""
        if pipe.conn is None:
            return
        # (A stale driving of this process may be in the middle of a call on it: it is
        # let finish that call, which its lost claim refuses anyway.)
        locked = pipe.conn.lock.acquire(timeout=self.timeout)
        try:
            with contextlib.suppress(Exception):
                pipe.conn.close()
        finally:
            if locked:
                pipe.conn.lock.release()
        with contextlib.suppress(Exception):
            pipe.stack.close()
        with contextlib.suppress(Exception):
            self._pool.putconn(pipe.conn)

    def _flush(self, queued: list[_Behind], sql: str, params: Any) -> Any:
        """The ``queued`` statements, then ``sql``, pipelined: one round trip, one
        implicit transaction (one Sync), so ``sql`` is written only with them. One that
        writes nothing raises, which rolls all of it back; the store then asks why:
        ``RunBusy`` (the claim was lost), ``IntentConflict`` (no such pending intent), or
        committed already by the same owner (dropped, and the rest sent again)."""
        import psycopg

        while queued:
            with self.connection() as conn:
                try:
                    with conn.pipeline():
                        for b in queued:
                            conn.execute(b.sql, b.params)
                        cursor = conn.execute(sql, params)
                    return cursor.fetchone()
                except psycopg.errors.InvalidTextRepresentation as exc:
                    if pg_sql.REFUSED not in str(exc):
                        raise
            queued = self._settle_refused(queued)
        return self._one(sql, params)

    def _settle_refused(
        self, queued: list[_Behind], sent: list[list[_Behind]] | None = None, lost: bool = False
    ) -> list[_Behind]:
        """The queued commits to send again after one of them committed nothing (and
        so none did), or the error that stops the driving. Of the transactions
        ``sent`` ahead, those whose checkpoint's events are stored landed; from the
        first that did not, nothing did. ``lost``: their connection was closed, not
        refused (any of them may be to send again)."""
        if sent:
            row = self._one(self.sql.last_seq, [sent[0][-1].params["run_id"]])
            stored = -1 if row is None or row[0] is None else row[0]
            unlanded = [s for s in sent if s[-1].seq is None or s[-1].seq > stored]
            queued = [b for s in unlanded for b in s] + queued
        if not queued:
            return []
        first = queued[0].params
        fence = {"frun": first["run_id"], "fowner": first["owner"], "fepoch": first["epoch"]}
        if self._one(self.sql.fence_holds, fence) is None:
            self._not_owner(fence["frun"])
        again = []
        for b in queued:
            if b.tool is None:  # a checkpoint is refused only by the fence
                again.append(b)
                continue
            found = self.get_intent(b.tool, b.key)
            if found is not None and found.status == "committed" and found.owner == b.owner:
                continue  # committed already (a reviewer's reconcile): nothing to send
            if found is None or found.status != "pending":
                raise IntentConflict(
                    f"{self.name}: no pending intent for {b.tool!r} key {b.key!r} to commit"
                )
            again.append(b)
        if len(again) == len(queued) and not lost:  # (cannot be: one committed nothing)
            raise IntentConflict(f"{self.name}: a commit behind run {fence['frun']!r} was refused")
        return again

    def _error(self, exc: BaseException) -> StoreError:
        return store_error(self.name, exc, self.timeout, self.statement_timeout_s)

    def _loads(self, text: Any, stored_sum: Any, what: str) -> Any:
        if not isinstance(text, str) or (stored_sum is not None and _sum(text) != stored_sum):
            raise CorruptRecord(
                f"{self.name}: {what} fails its checksum (the row was changed or damaged)"
            )
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecord(f"{self.name}: {what} is not readable JSON ({exc})") from None

    def _fence_params(self, fence: Fence | None) -> dict[str, Any]:
        if fence is None:
            return {"fenced": False, "frun": None, "fowner": None, "fepoch": None}
        run_id, owner = fence
        with self._lock:
            epoch = self._epochs.get(owner)
        return {"fenced": True, "frun": run_id, "fowner": owner, "fepoch": epoch}

    def _epoch(self, owner: str) -> int | None:
        with self._lock:
            return self._epochs.get(owner)

    def _not_owner(self, run_id: str) -> None:
        row = self._one(self.sql.owner_of, [run_id])
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.name}")
        raise RunBusy(
            f"run {run_id!r} was taken over by {row[0] or 'nobody'} (epoch {row[1]}); "
            "this driver stopped driving it"
        )

    # ── idempotency ───────────────────────────────────────────────────────────────

    def begin_intent(
        self,
        record: IdempotencyRecord,
        *,
        take_over: bool = False,
        fence: Fence | None = None,
        save: RunSave | None = None,
    ) -> IntentClaim:
        r = record
        intent = {
            "tool": r.tool, "key": r.key, "digest": r.args_digest, "crun": r.run_id,
            "call": r.call_id, "effect": r.effect, "dedup": r.dedup, "take_over": take_over,
            "isum": _intent_sum(r.args_digest, r.run_id, r.call_id, r.effect, r.dedup),
            "rsum": _result_sum("pending", None),
        }  # fmt: skip
        if save is None:
            f = self._fence_params(fence)
            row = self._one_after(fence, self.sql.begin_intent, {**intent, **f})
            if row[0] == "fenced":
                self._not_owner(f["frun"])
        else:
            # The run's checkpoint and the intent in one statement: both or neither.
            if fence is not None and fence != (save.run_id, save.owner):
                raise ValueError("begin_intent: a save rides only under its own fence")
            saved = self._save_params(save.run_id, save.owner, save.events, save.checkpoint)
            row = self._one_after(
                (save.run_id, save.owner), self.sql.save_begin_intent, {**intent, **saved}
            )
            if row is None:
                self._not_owner(save.run_id)
        found = None if row[1] is None else self._record(r.tool, r.key, row[1:])
        return IntentClaim(row[0] == "owned", found)

    def _record(self, tool: str, key: str, row: Any) -> IdempotencyRecord:
        digest, status, run_id, call_id, result, effect, dedup, stored_sum, result_sum = row
        where = f"the idempotency record of {tool!r} key {key!r}"
        if (
            stored_sum is not None
            and _intent_sum(digest, run_id, call_id, effect, dedup) != stored_sum
        ) or (result_sum is not None and _result_sum(status, result) != result_sum):
            raise CorruptRecord(
                f"{self.name}: {where} fails its checksum (the row was changed or damaged)"
            )
        if status not in ("pending", "committed"):
            raise CorruptRecord(f"{self.name}: {where} has status {status!r}")
        value = None if result is None else self._loads(result, None, where)
        return IdempotencyRecord(tool, key, digest, status, run_id, call_id, value, effect, dedup)

    def commit_intent(
        self,
        tool: str,
        key: str,
        owner: tuple[str, str],
        result: Any,
        *,
        fence: Fence | None = None,
    ) -> None:
        text = _dumps(result)
        params = {
            "tool": tool,
            "key": key,
            "result": text,
            "rsum": _result_sum("committed", text),
            **self._fence_params(fence),
        }
        if self._one_after(fence, self.sql.commit_intent, params) is not None:
            return
        if fence is not None and self._one(self.sql.fence_holds, params) is None:
            self._not_owner(fence[0])
        found = self.get_intent(tool, key)
        if found is not None and found.status == "committed" and found.owner == owner:
            return  # committed already
        raise IntentConflict(f"{self.name}: no pending intent for {tool!r} key {key!r} to commit")

    def commit_intent_behind(
        self, tool: str, key: str, owner: tuple[str, str], result: Any, *, fence: Fence
    ) -> None:
        """:meth:`commit_intent` without waiting: the commit is sent with the next
        statement of the driving ``fence`` (its next checkpoint, intent, or the release
        of its claim), pipelined in the same round trip and the same transaction. A write's
        result need not be durable before the loop goes on (D1): a crash before it is
        sent resumes to ``outcome_unknown``, never to a second run; and nothing after it
        is stored without it. Its refusal (``RunBusy``, ``IntentConflict``) is raised by
        that next statement, which is then not written either."""
        text = _dumps(result)
        run_id, token = fence
        params = {
            "tool": tool,
            "key": key,
            "result": text,
            "rsum": _result_sum("committed", text),
            "run_id": run_id,
            "owner": token,
            "epoch": self._epoch(token),
        }
        with self._lock:
            self._behind.setdefault(fence, []).append(
                _Behind(self.sql.commit_behind, params, tool, key, owner)
            )

    def abort_intent(
        self, tool: str, key: str, owner: tuple[str, str], *, fence: Fence | None = None
    ) -> None:
        params = {
            "tool": tool,
            "key": key,
            "run": owner[0],
            "call": owner[1],
            **self._fence_params(fence),
        }
        if (
            self._one_after(fence, self.sql.abort_intent, params) is None
            and fence is not None
            and self._one(self.sql.fence_holds, params) is None
        ):
            self._not_owner(fence[0])

    def get_intent(self, tool: str, key: str) -> IdempotencyRecord | None:
        # What is durable: a commit still behind a driving is not (yet) in the answer.
        row = self._one(self.sql.get_intent, [tool, key])
        return None if row is None else self._record(tool, key, row)

    def find_intents(
        self, *, run_id: str | None = None, tool: str | None = None, args_digest: str | None = None
    ) -> list[IdempotencyRecord]:
        """As :meth:`SqliteStore.find_intents`: the records ``fsm-agent check --db``
        compares a run's trace with (an audit query, not a hot path)."""
        rows = self._all(
            self.sql.find_intents, {"run_id": run_id, "tool": tool, "digest": args_digest}
        )
        return [self._record(row[0], row[1], row[2:]) for row in rows]

    # ── runs ──────────────────────────────────────────────────────────────────────

    def _rows(self, events: list[dict[str, Any]], checkpoint: Checkpoint) -> dict[str, Any]:
        # The driver's chained lines when it encoded them (the trace file's bytes).
        texts = checkpoint.event_lines
        if texts is None or len(texts) != len(events):
            texts = [_dumps(e) for e in events]
        messages = [(i, _dumps(m)) for i, m in checkpoint.messages]
        # The JSON text the snapshot was built with (RunState.snapshot), else encoded here.
        snapshot = getattr(checkpoint.snapshot, "text", None) or _dumps(checkpoint.snapshot)
        return {
            **_columns(checkpoint.snapshot),
            "ctx": snapshot,
            "sum": _sum(snapshot),
            "lease": self.lease_s,
            "seqs": [e["seq"] for e in events],
            "types": [e["type"] for e in events],
            "bodies": texts,
            "sums": [_sum(t) for t in texts],
            "idx": [i for i, _ in messages],
            "mbodies": [t for _, t in messages],
            "msums": [_sum(t) for _, t in messages],
        }

    def create_run(
        self,
        run_id: str,
        header: dict[str, Any],
        owner: str,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
    ) -> None:
        header_text = _dumps(header)
        params = {
            **self._rows(events, checkpoint),
            "run_id": run_id,
            "owner": owner,
            "header": header_text,
            "hsum": _sum(header_text),
        }
        row = self._one(self.sql.create_run, params)
        if row is None:
            raise RunExists(f"run id {run_id!r} is already stored in {self.name}")
        with self._lock:
            self._epochs[owner] = row[1]

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        # The fence: the run row is updated (and the events and history rows inserted)
        # only where this owner still holds the claim at the epoch it claimed at.
        params = self._save_params(run_id, owner, events, checkpoint)
        if self._one_after((run_id, owner), self.sql.save, params) is None:
            self._not_owner(run_id)

    def save_and_release(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        """:meth:`save` and :meth:`release` in one statement: a driving's last checkpoint
        (the run ended, or paused for review) gives up the claim as it lands. The
        driving's own ``release`` then has nothing left to do."""
        params = {**self._save_params(run_id, owner, events, checkpoint), "channel": self.channel}
        if self._one_after((run_id, owner), self.sql.save_release, params) is None:
            self._not_owner(run_id)
        with self._lock:
            self._epochs.pop(owner, None)
            self._released.add((run_id, owner))

    def save_if_unchanged(
        self, run_id: str, seen: Head, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> bool:
        """Append ``events`` and replace the checkpoint only if nobody holds the run and
        it is still at ``seen`` (a decision judged on that version:
        ``record_review(..., seen=)``), leaving it as a claim and a release would; one
        round trip (the row locked, then the conditional save, pipelined in one
        transaction). ``False``: the run moved on or is held, nothing was written."""
        params = {
            **self._rows(events, checkpoint),
            "run_id": run_id,
            "seen_seq": seen.seq,
            "seen_sum": seen.checksum,
            "channel": self.channel,
        }
        with self.connection() as conn:
            with conn.pipeline():
                conn.execute(self.sql.lock_row, [run_id])
                saved = conn.execute(self.sql.save_if_at, params)
            return saved.fetchone() is not None

    def save_behind(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        """:meth:`save` without waiting: sent now, with what rides behind, as one
        transaction on the driving's connection in pipeline mode, its answer read with
        the driving's next statement that waits (at most ``_AHEAD`` unread). Where the
        pool cannot spare a connection (or there is no event to tell whether it landed)
        it rides with the next statement instead, behind at most one other."""
        params = self._save_params(run_id, owner, events, checkpoint)
        seq = max((int(e["seq"]) for e in events), default=None)
        item = _Behind(self.sql.save_behind, params, seq=seq)
        fence = (run_id, owner)
        pipe = None if seq is None else self._pipe(fence)
        if pipe is not None:
            self._send_ahead(fence, pipe, [*self._queued(fence), item])
            return
        with self._lock:
            queue = self._behind.setdefault((run_id, owner), [])
            waits = any(b.tool is None for b in queue)
            if not waits:
                queue.append(item)
                return
        self.save(run_id, owner, events, checkpoint)

    def _save_params(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> dict[str, Any]:
        return {
            **self._rows(events, checkpoint),
            "run_id": run_id,
            "owner": owner,
            "epoch": self._epoch(owner),
        }

    def adopt_run(self, run_id: str, owner: str, header: dict[str, Any]) -> bool:
        """Replace the header of a run that has no event yet (submitted, never driven)
        with its first driver's, whose ``run_start`` comes with its first save; ``False``
        (nothing changed) once the run has events. ``RunBusy`` unless ``owner`` holds the
        claim."""
        header_text = _dumps(header)
        params = {
            "run_id": run_id,
            "owner": owner,
            "epoch": self._epoch(owner),
            "header": header_text,
            "hsum": _sum(header_text),
        }
        owned, events = self._one(self.sql.adopt_run, params)
        if not owned:
            self._not_owner(run_id)
        return bool(events == 0)

    def load_run(self, run_id: str) -> StoredRun:
        return self._stored(run_id, self._one(self.sql.load_run, [run_id]))

    def _stored(self, run_id: str, row: Any) -> StoredRun:
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.name}")
        header, header_sum, snapshot, snapshot_sum, mi, mb, ms, es, eb, esum, cancel = row
        where = f"run {run_id!r}"
        mi, mb, ms = mi or [], mb or [], ms or []
        if mi != list(range(len(mi))):
            raise CorruptRecord(f"{self.name}: the history of {where} has gaps")
        return StoredRun(
            run_id,
            self._loads(header, header_sum, f"the header of {where}"),
            self._loads(snapshot, snapshot_sum, f"the checkpoint of {where}"),
            [
                self._loads(b, s, f"history row {i} of {where}")
                for i, b, s in zip(mi, mb, ms, strict=True)
            ],
            [
                self._loads(b, s, f"event {q} of {where}")
                for q, b, s in zip(es or [], eb or [], esum or [], strict=True)
            ],
            None if snapshot_sum is None else Head(es[-1] if es else -1, int(snapshot_sum)),
            CancelRequest.loads(cancel, f"{self.name}: {where}"),
        )

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        rows = self._all(self.sql.list_runs, {"state": state})
        return [RunSummary(*row) for row in rows]

    # ── claims ────────────────────────────────────────────────────────────────────

    def claim(self, run_id: str, owner: str) -> None:
        with self.connection() as conn, conn.transaction():
            row = conn.execute(self.sql.lock_run, [run_id]).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in {self.name}")
            holder, expired = row
            # A claim this process still drives holds even past its lease (a store
            # outage); one that is certainly dead here is taken at once.
            if holder not in (None, owner) and (
                owners.drives_here(holder) or (not expired and not owners.is_dead(holder))
            ):
                raise RunBusy(
                    f"run {run_id!r} is being driven by {holder}; try again when it stops"
                )
            (epoch,) = conn.execute(
                self.sql.take_run, {"run_id": run_id, "owner": owner, "lease": self.lease_s}
            ).fetchone()
        self._claimed(run_id, owner, epoch)

    def claim_and_load(self, run_id: str, owner: str) -> StoredRun:
        """:meth:`claim`, then :meth:`load_run`: one round trip where nobody holds the
        run (the common case: a resume, a review), the claim and the read pipelined in
        one transaction. A run someone holds is judged as :meth:`claim` judges it."""
        params = {"run_id": run_id, "owner": owner, "lease": self.lease_s}
        with self.connection() as conn:
            with conn.pipeline():
                took = conn.execute(self.sql.take_free, params)
                loaded = conn.execute(self.sql.load_run, [run_id])
            row, stored = took.fetchone(), loaded.fetchone()
        if row is None:
            self.claim(run_id, owner)
            return self.load_run(run_id)
        self._claimed(run_id, owner, row[0])
        try:
            return self._stored(run_id, stored)
        except BaseException:
            self.release(run_id, owner)
            raise

    def claim_next(self, owner: str, skip: tuple[str, ...] = ()) -> Claim | None:
        """Claim the oldest run a worker may drive now — new, its reviews settled, or
        orphaned by an expired lease — skipping rows other workers are claiming
        (``FOR UPDATE SKIP LOCKED``) and the run ids in ``skip``; ``None`` if there is
        none."""
        dead = self._claim_from_the_dead(owner, skip)
        if dead is not None:
            return dead
        row = self._one(
            self.sql.claim_next, {"owner": owner, "lease": self.lease_s, "skip": list(skip)}
        )
        if row is None:
            return None
        run_id, epoch, state, previous, first = row[:5]
        self._claimed(run_id, owner, epoch)
        with self._lock:
            self._picked[(run_id, owner)] = row[5:]
        why = (
            "orphaned"
            if previous is not None
            else "new"
            if first
            else "reviewed"
            if state == "review_required"
            else "released"
        )
        return Claim(run_id, owner, epoch, why)

    def load_claimed(self, run_id: str, owner: str) -> StoredRun:
        """:meth:`load_run` for ``owner``, which :meth:`claim_next` gave this run: as
        that claim read it, in the same statement (nobody could change it since), or
        from the server."""
        with self._lock:
            row = self._picked.pop((run_id, owner), None)
        return self.load_run(run_id) if row is None else self._stored(run_id, row)

    def _claim_from_the_dead(self, owner: str, skip: tuple[str, ...]) -> Claim | None:
        """A run claimed in this PID space by another process that is gone (SIGKILL,
        OOM, a crash): taken at once, not at the end of its lease — as ``claim`` does. A
        live owner, stalled or not, keeps its claim until its lease runs out; so does
        this process's own (the worker settles those itself)."""
        prefix = owners.here_prefix()
        if prefix is None:
            return None
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        for run_id, holder in self._all(
            self.sql.held_here, {"prefix": pattern, "skip": list(skip)}
        ):
            if not owners.process_gone(holder):
                continue
            row = self._one(
                self.sql.take_from,
                {"owner": owner, "run_id": run_id, "dead": holder, "lease": self.lease_s},
            )
            if row is not None:
                self._claimed(run_id, owner, row[1])
                return Claim(run_id, owner, row[1], "orphaned")
        return None

    def renew(self, run_id: str, owner: str) -> CancelRequest | None:
        params = {
            "run_id": run_id,
            "owner": owner,
            "epoch": self._epoch(owner),
            "lease": self.lease_s,
        }
        row = self._one(self.sql.renew, params)
        if row is None:
            self._not_owner(run_id)
        return CancelRequest.loads(row[0], f"{self.name}: run {run_id!r}")

    def request_cancel(self, run_id: str, request: CancelRequest) -> CancelRequest | None:
        """As :meth:`MemoryStore.request_cancel <fsm_agent._durable.memory.MemoryStore.
        request_cancel>`: one statement, under the run row's lock, whoever holds it."""
        params = {"run_id": run_id, "cancel": request.dumps(), "ended": list(_FINISHED),
                  "channel": self.channel}  # fmt: skip
        row = self._one(self.sql.request_cancel, params)
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.name}")
        state, stored, _ = row
        if state in _FINISHED:
            return None
        return CancelRequest.loads(stored, f"{self.name}: run {run_id!r}")

    def release(self, run_id: str, owner: str) -> None:
        """Give up the claim; a run a worker may drive (not finished, not waiting for a
        reviewer) is announced on the work channel for the next worker."""
        with self._lock:
            self._picked.pop((run_id, owner), None)
            if (run_id, owner) in self._released:  # by its last checkpoint
                self._released.discard((run_id, owner))
                return
        try:
            params = {"run_id": run_id, "owner": owner, "channel": self.channel}
            self._one_after((run_id, owner), self.sql.release, params)
        finally:
            with self._lock:
                self._epochs.pop(owner, None)

    # ── the fleet ─────────────────────────────────────────────────────────────────

    def report_worker(
        self, worker: str, state: str, concurrency: int, active: int, counts: dict[str, int]
    ) -> None:
        """Record a worker's state and counts (``fsm-agent worker --status``)."""
        host, _, rest = worker.partition(":")
        pid = int(rest.partition(":")[0] or 0)
        self._all(
            self.sql.report_worker,
            {
                "worker": worker,
                "host": host,
                "pid": pid,
                "concurrency": concurrency,
                "state": state,
                "active": active,
                **counts,
            },
        )

    def fleet(self) -> dict[str, Any]:
        """Workers as last reported (``seen_s``: seconds since) and the runs by state
        (``queued``: unclaimed and runnable; ``claimed``: held under a live lease;
        ``orphaned``: runnable with an expired lease)."""
        names = ("worker", "state", "concurrency", "active", "claimed", "finished",
                 "released", "failed", "fenced", "seen_s", "started")  # fmt: skip
        workers = [dict(zip(names, row, strict=True)) for row in self._all(self.sql.workers)]
        for w in workers:
            # A worker killed outright never reports "stopped": silent for longer than
            # the lease, it holds no claim any more (its leases lapsed) and is listed so.
            if w["state"] != "stopped" and w["seen_s"] > max(self.lease_s, _REPORTS_S):
                w["state"] = "lost"
        runs = {
            state: {"runs": n, "queued": q, "claimed": c, "orphaned": o}
            for state, n, q, c, o in self._all(self.sql.queue)
        }
        return {"workers": workers, "runs": runs}

    # ── approval uses ─────────────────────────────────────────────────────────────

    def consume_approval(self, approval_id: str, max_uses: int, run_id: str, call_id: str) -> bool:
        """See :meth:`~fsm_agent._durable.store.ApprovalStore.consume_approval`: one
        server-side function, atomic across the fleet (``pg_schema``'s version 2)."""
        params = {"approval": approval_id, "max": max_uses, "run": run_id, "call": call_id}
        return bool(self._one(self.sql.consume_approval, params)[0])

    def approval_uses(self, approval_id: str) -> int:
        return int(self._one(self.sql.approval_uses, {"approval": approval_id})[0])

    # ── change feed and keys (the review server) ──────────────────────────────────

    def events_since(self, run_id: str, seq: int, limit: int = 1000) -> list[dict[str, Any]]:
        """See :meth:`~fsm_agent._durable.feed.FeedStore.events_since` (one indexed range
        read of the events' primary key)."""
        rows = self._all(self.sql.events_since, {"run_id": run_id, "seq": seq, "limit": limit})
        if not rows:
            if self._one(self.sql.owner_of, [run_id]) is None:
                raise RunNotFound(f"no run {run_id!r} in {self.name}")
            return []
        where = f"run {run_id!r}"
        return [self._loads(b, s, f"event {q} of {where}") for q, b, s in rows]

    def watch(self) -> Watch:
        """A watch that LISTENs on ``<schema>_changes`` on a connection of its own."""
        import psycopg

        try:
            conn = psycopg.connect(self.conninfo, autocommit=True)
            conn.execute(f'LISTEN "{self.schema}_changes"')
        except psycopg.Error as exc:
            raise self._error(exc) from None
        return _ListenWatch(conn, self)

    _KEY_COLUMNS = "key_id, name, scope, salt, digest, created, revoked"

    def add_key(self, record: KeyRecord) -> None:
        if not self._all(self.sql.add_key, [*astuple(record), record.name]):
            raise ConfigError(f"a key named {record.name!r} exists; revoke it first")

    def get_key(self, key_id: str) -> KeyRecord | None:
        row = self._one(self.sql.get_key, [key_id])
        return KeyRecord(*row) if row else None

    def list_keys(self) -> list[KeyRecord]:
        return [KeyRecord(*row) for row in self._all(self.sql.list_keys)]

    def revoke_key(self, name: str) -> int:
        return len(self._all(self.sql.revoke_key, [time.time(), name]))

    # ── retention ─────────────────────────────────────────────────────────────────

    def prune(self, older_than_s: float, *, intents: bool = True) -> tuple[int, int]:
        """As :meth:`SqliteStore.prune`: finished, unclaimed runs older than
        ``older_than_s`` go with their events and history; with ``intents``, committed
        idempotency records that old too. Never a run waiting for review, never a
        pending intent. Returns ``(runs, intents)`` deleted."""
        with self.connection() as conn, conn.transaction():
            nums = [
                n
                for (n,) in conn.execute(
                    self.sql.prune_runs, {"age": older_than_s, "finished": list(_FINISHED)}
                ).fetchall()
            ]
            if nums:
                conn.execute(self.sql.prune_rows, {"nums": nums})
            dropped = 0
            if intents:
                dropped = conn.execute(self.sql.prune_intents, {"age": older_than_s}).rowcount
        return len(nums), dropped


def _holds(conn: Any) -> bool:
    """Whether a pipe's connection still holds, without a round trip: a server that
    closed it said so (its last message, then the end of the stream). (What it reads
    stays in libpq's buffer for the next answer: a refusal is raised there.)"""
    import psycopg

    pgconn = conn.pgconn
    try:
        for _ in range(8):  # (its last message, then the end: two reads)
            readable, _, _ = select.select([pgconn.socket], [], [], 0)
            if not readable:
                break
            pgconn.consume_input()
    except (psycopg.OperationalError, OSError, ValueError):
        return False
    return bool(pgconn.status == psycopg.pq.ConnStatus.OK)


def _flushed(conn: Any) -> None:
    """Hand what psycopg left in libpq's buffer to the kernel: a transaction half sent
    would keep its row lock, uncommitted, through the model call. (Reading what
    arrives meanwhile, so neither side blocks on a full buffer.)"""
    pgconn = conn.pgconn
    while pgconn.flush():
        readable, _, _ = select.select([pgconn.socket], [pgconn.socket], [])
        if readable:
            pgconn.consume_input()


class _ListenWatch:
    """A watch on PostgreSQL notifications; reconnects once on a lost connection (a
    wake-up is reported then: something may have changed while it was down).

    Each notification names the run whose row changed: ``changed`` is the runs the last
    wake-up named, so a server wakes only those runs' streams (``None``: it cannot tell,
    after a reconnect: every run may have changed)."""

    def __init__(self, conn: Any, store: PostgresStore) -> None:
        self._conn, self._store = conn, store
        self.changed: frozenset[str] | None = frozenset()

    def wait(self, timeout: float) -> bool:
        import psycopg

        try:
            # Read to the end of what arrived (a packet may hold several: one closed
            # early would drop the rest, and with them the wake-up of their runs).
            got = list(self._conn.notifies(timeout=timeout, stop_after=1))
            if got:
                got += self._conn.notifies(timeout=0.0)  # what else is already here
            self.changed = frozenset(n.payload for n in got)
            return bool(got)
        except psycopg.Error:
            with contextlib.suppress(Exception):
                self._conn.close()
            time.sleep(min(timeout, 0.5))
            replacement = self._store.watch()
            assert isinstance(replacement, _ListenWatch)
            self._conn = replacement._conn
            self.changed = None
            return True

    def close(self) -> None:
        self._conn.close()
