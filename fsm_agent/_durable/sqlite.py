"""A durable :class:`~fsm_agent._durable.store.RunStore` in one SQLite file (stdlib ``sqlite3``).

WAL journal with ``synchronous=NORMAL``: a committed transaction survives the process
being killed (SIGKILL included); after a power loss the last few commits may be lost,
but the file stays consistent. Every checkpoint is one short ``BEGIN IMMEDIATE``
transaction that appends the new events and history rows and replaces one small row, so
its cost does not grow with the length of the run. Beginning a write's intent is its own
``BEGIN IMMEDIATE`` compare-and-set, so two runs, two store objects or two processes on
one file never both own one key (R11).

What the loop needs no answer to — a write's result (``commit_intent_behind``), the
checkpoint after a batch of reads or after a keyless write returned (``save_behind``) —
is not committed on its own: it waits in this object and goes into the driving's next
transaction, first, so a round commits as few times as the D rules allow
(``docs/concepts/durable-runs.md``). A refusal there (a lost claim, a commit that
commits nothing) rolls that transaction back whole: nothing is stored past it.

Every stored row carries a CRC-32 of its body, checked on read: a damaged row is a
:class:`~fsm_agent._errors.CorruptRecord`, never data read back silently changed (the
checkpoint also carries its own CRC-32). Every failure is a
:class:`~fsm_agent._errors.StoreError` that names the file and the cause.

The schema version lives in ``PRAGMA user_version`` and is migrated on open; a file
written by a newer fsm-agent is refused rather than guessed at. ``PRAGMA application_id``
marks the file as ours: another program's database, or an existing empty file, is never
written into. ``readonly=True`` opens without writing anything (the CLI's read commands).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import astuple
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fsm_agent._core.intents import IdempotencyRecord, IntentClaim, may_claim
from fsm_agent._core.jsonsafe import c_dumps
from fsm_agent._core.state import SaveMode
from fsm_agent._durable import owners
from fsm_agent._durable.feed import KeyRecord, Watch
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

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStore"]

#: ``PRAGMA application_id`` of an fsm-agent database ("FSMA").
APPLICATION_ID = 0x46534D41

#: Migrations in order: ``_MIGRATIONS[n]`` takes the schema from version n to n + 1.
#: Events and history rows are keyed ``run number << 32 | seq`` in rowid tables with no
#: secondary index, so a checkpoint appends at the right edge of each B-tree and writes
#: few pages (keyed by the text run id, runs interleave and split pages mid-tree: measured
#: 8 pages per commit against about 4 this way).
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        num         INTEGER PRIMARY KEY,
        run_id      TEXT NOT NULL UNIQUE,
        state       TEXT NOT NULL,
        reason      TEXT NOT NULL DEFAULT '',
        pending     INTEGER NOT NULL DEFAULT 0,
        ctx         TEXT NOT NULL,
        owner       TEXT,
        lease_until REAL NOT NULL DEFAULT 0,
        created     REAL NOT NULL,
        updated     REAL NOT NULL
    );
    CREATE TABLE headers (num INTEGER PRIMARY KEY, body TEXT NOT NULL);
    CREATE TABLE events (key INTEGER PRIMARY KEY, type TEXT NOT NULL, body TEXT NOT NULL);
    CREATE TABLE messages (key INTEGER PRIMARY KEY, body TEXT NOT NULL);
    CREATE TABLE approvals (
        num INTEGER NOT NULL, call_id TEXT NOT NULL, tool TEXT NOT NULL,
        digest TEXT NOT NULL, granted REAL NOT NULL, PRIMARY KEY (num, call_id)
    );
    CREATE TABLE idempotency (
        tool        TEXT NOT NULL,
        key         TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        status      TEXT NOT NULL,
        run_id      TEXT NOT NULL,
        call_id     TEXT NOT NULL,
        result      TEXT,
        updated     REAL NOT NULL,
        PRIMARY KEY (tool, key)
    ) WITHOUT ROWID;
    """,
    # 2: row checksums (NULL on rows written by version 1: read unverified), the tool's
    # effect facts on intents, and no separate approvals (they live in the checkpoint).
    """
    ALTER TABLE runs ADD COLUMN sum INTEGER;
    ALTER TABLE headers ADD COLUMN sum INTEGER;
    ALTER TABLE events ADD COLUMN sum INTEGER;
    ALTER TABLE messages ADD COLUMN sum INTEGER;
    ALTER TABLE idempotency ADD COLUMN effect TEXT NOT NULL DEFAULT 'write';
    ALTER TABLE idempotency ADD COLUMN dedup INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE idempotency ADD COLUMN sum INTEGER;
    DROP TABLE approvals;
    """,
    # 3: the uses of limited approvals, one row per (approval, run, call) that holds one
    # (counted by a range scan of the key's prefix).
    """
    CREATE TABLE approval_uses (
        approval_id TEXT NOT NULL,
        run_id      TEXT NOT NULL,
        call_id     TEXT NOT NULL,
        spent       REAL NOT NULL,
        PRIMARY KEY (approval_id, run_id, call_id)
    ) WITHOUT ROWID;
    """,
    # 4: the review server's API keys (a salted hash of each, never the key).
    """
    CREATE TABLE api_keys (
        key_id  TEXT PRIMARY KEY,
        name    TEXT NOT NULL,
        scope   TEXT NOT NULL,
        salt    TEXT NOT NULL,
        digest  TEXT NOT NULL,
        created REAL NOT NULL,
        revoked REAL
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX api_keys_active ON api_keys (name) WHERE revoked IS NULL;
    """,
    # 5: an events row holds the consecutive events of one transaction, one trace line
    # each, joined by newlines (JSON text holds none), keyed by the first one's seq: one
    # insert a checkpoint instead of one an event, most of a round's writing. ``n`` is
    # how many (a row written before holds one).
    """
    ALTER TABLE events ADD COLUMN n INTEGER NOT NULL DEFAULT 1;
    """,
    # 6: a cancel asked of a run while it was driven (or before it is driven again), for
    # its driver: JSON text of ``CancelRequest``, NULL where none was asked. On the runs
    # row, so the heartbeat's renewal returns it in its own statement.
    """
    ALTER TABLE runs ADD COLUMN cancel TEXT;
    """,
)

_SHIFT = 32  # events and messages: key = run number << 32 | seq (or history index)

#: How long checkpoints behind may keep waiting once more than one waits, and how many
#: may wait: a commit costs tens of µs (file locks, the WAL frames written), nothing next
#: to a model call but most of a round that answers at once (a cached or scripted model,
#: a replay). A run whose replies take longer than this commits every second one.
_BEHIND_S = 0.05
_BEHIND_MOST = 32

#: The schema version this code writes.
SCHEMA_VERSION = len(_MIGRATIONS)

#: The states a run never leaves: no cancel is asked of such a run.
_ENDED = frozenset({"done", "budget_exhausted", "protocol_error", "cancelled"})


def _plain_dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


#: Compact JSON by a C encoder built once (``json.dumps`` builds one per call: a third
#: of the cost of a small row, several rows a round). Everything the engine stores is
#: JSON-safe already (core/jsonsafe.py); a value that is not is a bug to surface, not to
#: paper over with repr().
_dumps: Callable[[Any], str] = c_dumps(",", ":") or _plain_dumps


def _sum(text: str | None) -> int | None:
    return None if text is None else zlib.crc32(text.encode("utf-8"))


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


class _Behind(NamedTuple):
    """What waits for its driving's next transaction: a checkpoint (``rows``) or a
    write's result (``tool``, ``key``, ``owner`` of its intent, ``result`` as JSON)."""

    rows: _Rows | None = None
    tool: str = ""
    key: str = ""
    owner: tuple[str, str] = ("", "")
    result: str = ""
    at: float = 0.0  # (a checkpoint: when it was queued, on the monotonic clock)


class SqliteStore:
    """Runs, events, checkpoints and idempotency records in one SQLite file.

    ``timeout``: how long to wait for another process's lock before a ``StoreError``.
    ``lease_s``: how long a claim by an owner this host cannot ask (another host, another
    boot) holds without a heartbeat. ``create=False`` refuses a missing file;
    ``readonly=True`` never writes (no schema, no migration, no claim).
    """

    blocking = True
    keeps_runs = True
    save_mode: SaveMode = "replies"
    #: Events are stored as the driver's chained trace lines (``Checkpoint.event_lines``).
    wants_lines = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 5.0,
        lease_s: float = 300.0,
        create: bool = True,
        readonly: bool = False,
    ) -> None:
        self.path = Path(path)
        self.timeout, self.lease_s, self.readonly = timeout, lease_s, readonly
        self._lock = threading.RLock()
        self._checkpointer: _Checkpointer | None = None
        #: per driving ``(run_id, owner)``: what goes into its next transaction, in order
        self._behind: dict[Fence, list[_Behind]] = {}
        #: drivings whose last checkpoint let their claim go (``save_and_release``)
        self._released: set[Fence] = set()
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a directory, not a database file")
        exists = self.path.exists()
        if not exists and (readonly or not create):
            raise StoreError(f"{self.path}: no such database")
        if exists and self.path.stat().st_size == 0:
            raise StoreError(
                f"{self.path}: an empty file, not an fsm-agent database (remove "
                "it to let fsm-agent create one there)"
            )
        try:
            target = f"{self.path.resolve().as_uri()}?mode=ro" if readonly else str(self.path)
            self._conn = sqlite3.connect(
                target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=readonly
            )
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            self._open()
        except BaseException:
            self._conn.close()
            raise

    def _open(self) -> None:
        try:
            app_id, version = self._conn.execute(
                "SELECT * FROM pragma_application_id, pragma_user_version"
            ).fetchone()
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} is newer than this fsm-agent "
                    f"supports ({SCHEMA_VERSION}); upgrade fsm-agent to open it"
                )
            if app_id not in (0, APPLICATION_ID):
                raise StoreError(
                    f"{self.path}: not an fsm-agent database (application_id {app_id:#x})"
                )
            if app_id == 0:
                tables = self._conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
                ).fetchone()[0]
                if tables:
                    raise StoreError(
                        f"{self.path}: not an fsm-agent database (it holds {tables} other tables)"
                    )
            if self.readonly:
                if version < SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: schema version {version} needs migrating "
                        "to this fsm-agent's; open it writable once"
                    )
                return
            # WAL lets readers (the CLI) work while a run writes; NORMAL syncs at
            # checkpoints of the WAL, not at every commit (crash-safe, not power-safe).
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # A checkpoint fsyncs the file (milliseconds; a commit takes microseconds):
            # it runs on a thread of its own (_Checkpointer), and this connection does
            # one only when the log has grown past what that thread keeps up with.
            self._conn.execute(f"PRAGMA wal_autocheckpoint={_FALLBACK_PAGES}")
            # (And a log that grew that far is cut back when it restarts.)
            self._conn.execute(f"PRAGMA journal_size_limit={4 << 20}")
            self._checkpointer = _Checkpointer(self.path, self.timeout)
            # A store dropped without close() must not leave its thread (and that
            # thread's connection) behind for the rest of the process.
            weakref.finalize(self, self._checkpointer.stop)
            if version < SCHEMA_VERSION:
                self._migrate()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        except UnicodeDecodeError as exc:  # a damaged schema row, read as it is opened
            raise CorruptRecord(
                f"{self.path}: the schema is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); the file is damaged"
            ) from None

    def _migrate(self) -> None:
        with self._write() as c:
            # Re-read under the write lock: another process may have migrated meanwhile.
            current = c.execute("PRAGMA user_version").fetchone()[0]
            for step in range(current, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step].split(";"):
                    if statement.strip():
                        c.execute(statement)
            c.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ── transactions and errors ───────────────────────────────────────────────────

    def _error(self, exc: BaseException) -> StoreError:
        text = str(exc)
        lowered = text.lower()
        if "locked" in lowered or "busy" in lowered:
            return StoreError(
                f"{self.path}: database is locked by another process (waited {self.timeout:g}s)"
            )
        if "full" in lowered:
            return StoreError(
                f"{self.path}: the disk is full ({text}); nothing of this transaction was stored"
            )
        if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
            return CorruptRecord(f"{self.path}: not an SQLite database or corrupt ({text})")
        if "unable to open" in lowered:
            return StoreError(f"{self.path}: cannot open the database file ({text})")
        if "readonly" in lowered or "read-only" in lowered:
            return StoreError(f"{self.path}: the database is read-only ({text})")
        return StoreError(f"{self.path}: {text}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: all of it is committed, or none. A failure
        is reported by its first cause (a ROLLBACK that fails after a full disk must not
        hide why)."""
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only; this command does not write")
        with self._lock:
            c = self._conn
            try:
                c.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            try:
                yield c
                c.execute("COMMIT")
            except BaseException as exc:
                self._rollback(c)
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc) from None
                raise
            if self._checkpointer is not None:  # (under the lock: one thread is started)
                self._checkpointer.committed()

    @contextmanager
    def _driving(
        self, fence: Fence | None, rows: _Rows | None = None, *, release: bool = False
    ) -> Iterator[sqlite3.Connection]:
        """A :meth:`_write` transaction of the driving ``fence`` that stores what waits
        behind it, and ``rows``, its own checkpoint (``release``: with the claim let go),
        before the caller's statements: nothing of it is stored without what waited, and
        a refusal of what waited refuses all of it. Without ``rows``, the caller checks
        the fence itself (what waited is checked here)."""
        with self._write() as c:
            queued = None
            if fence is not None and self._behind:
                with self._lock:
                    queued = self._behind.pop(fence, None)
            if queued or rows is not None:
                assert fence is not None
                self._flush(c, fence, queued or [], rows, release)
            yield c

    def _flush(
        self,
        c: sqlite3.Connection,
        fence: Fence,
        queued: list[_Behind],
        rows: _Rows | None,
        release: bool,
    ) -> None:
        """The run's latest checkpoint replaces its row first (the fenced update names
        the run's number), then every checkpoint's events and history rows go in, in
        order, and the results that waited."""
        run_id, owner = fence
        saved = [b.rows for b in queued if b.rows is not None]
        if rows is not None:
            saved.append(rows)
        if saved:
            num = self._save(c, run_id, owner, saved[-1], release=release)
            events = [e for r in saved for e in r.events]
            messages = [m for r in saved for m in r.messages]
            self._append(c, num, events, messages)
        else:  # only results waited: the fence, checked once for all of them
            self._check_fence(c, fence)
        for b in queued:
            if b.rows is None:
                self._commit(c, b.tool, b.key, b.owner, b.result)

    def _queue(self, fence: Fence, item: _Behind) -> bool:
        """Put ``item`` behind the driving ``fence``; ``False`` (nothing queued) for a
        checkpoint that may wait no longer: one waits already, queued
        :data:`_BEHIND_S` ago or more, or :data:`_BEHIND_MOST` wait. So a crash loses at
        most one reply, or the replies of the last :data:`_BEHIND_S` seconds."""
        with self._lock:
            queue = self._behind.setdefault(fence, [])
            if item.rows is not None:
                waiting = [b for b in queue if b.rows is not None]
                if waiting and (
                    len(waiting) >= _BEHIND_MOST or item.at - waiting[0].at >= _BEHIND_S
                ):
                    return False
            queue.append(item)
            return True

    @staticmethod
    def _rollback(c: sqlite3.Connection) -> None:
        if c.in_transaction:
            # The transaction is gone either way; the first error is what counts.
            with contextlib.suppress(sqlite3.Error):
                c.execute("ROLLBACK")

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            except UnicodeDecodeError as exc:  # a damaged TEXT value
                raise CorruptRecord(
                    f"{self.path}: a stored row is not UTF-8 text ({exc.reason}"
                    f" at byte {exc.start}); the file is damaged"
                ) from None

    def _loads(self, text: Any, stored_sum: Any, what: str) -> Any:
        if not isinstance(text, str) or (stored_sum is not None and _sum(text) != stored_sum):
            raise CorruptRecord(
                f"{self.path}: {what} fails its checksum (the row was changed or damaged)"
            )
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecord(f"{self.path}: {what} is not readable JSON ({exc})") from None

    # ── idempotency ───────────────────────────────────────────────────────────────

    _INTENT = (
        "SELECT args_digest, status, run_id, call_id, result, effect, dedup, sum "
        "FROM idempotency WHERE tool = ? AND key = ?"
    )

    def _intent(self, c: sqlite3.Connection, tool: str, key: str) -> IdempotencyRecord | None:
        row = c.execute(self._INTENT, (tool, key)).fetchone()
        if row is None:
            return None
        digest, status, run_id, call_id, result, effect, dedup, stored_sum = row
        where = f"the idempotency record of {tool!r} key {key!r}"
        body = "|".join((digest, status, run_id, call_id, result or "", effect, str(dedup)))
        if stored_sum is not None and _sum(body) != stored_sum:
            raise CorruptRecord(
                f"{self.path}: {where} fails its checksum (the row was changed or damaged)"
            )
        if status not in ("pending", "committed"):
            raise CorruptRecord(f"{self.path}: {where} has status {status!r}")
        value = None if result is None else self._loads(result, None, where)
        return IdempotencyRecord(
            tool, key, digest, status, run_id, call_id, value, effect, bool(dedup)
        )

    @staticmethod
    def _put_intent(c: sqlite3.Connection, r: IdempotencyRecord, result: str | None) -> None:
        body = "|".join(
            (
                r.args_digest,
                r.status,
                r.run_id,
                r.call_id,
                result or "",
                r.effect,
                str(int(r.dedup)),
            )
        )
        c.execute(
            "INSERT OR REPLACE INTO idempotency (tool, key, args_digest, status, run_id, "
            "call_id, result, updated, effect, dedup, sum) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                r.tool,
                r.key,
                r.args_digest,
                r.status,
                r.run_id,
                r.call_id,
                result,
                time.time(),
                r.effect,
                int(r.dedup),
                _sum(body),
            ),
        )

    def begin_intent(
        self,
        record: IdempotencyRecord,
        *,
        take_over: bool = False,
        fence: Fence | None = None,
        save: RunSave | None = None,
    ) -> IntentClaim:
        rows = None if save is None else _encode(save.events, save.checkpoint)
        driving = fence if save is None else (save.run_id, save.owner)
        with self._driving(driving, rows) as c:
            if fence != driving or rows is None:  # (else the checkpoint's update fenced it)
                self._check_fence(c, fence)
            found = self._intent(c, record.tool, record.key)
            if may_claim(found, record, take_over):
                self._put_intent(c, record, None)
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
        text = _dumps(result)
        with self._driving(fence) as c:
            self._check_fence(c, fence)
            self._commit(c, tool, key, owner, text)

    def commit_intent_behind(
        self, tool: str, key: str, owner: tuple[str, str], result: Any, *, fence: Fence
    ) -> None:
        """:meth:`commit_intent` without a transaction of its own: the result goes into
        the next transaction of the driving ``fence`` (its next checkpoint, intent, or the
        release of its claim), first. A write's result need not be durable before the
        loop goes on (D1): a crash before that transaction resumes to
        ``outcome_unknown``, never to a second run, and nothing after it is stored
        without it. Its refusal (``RunBusy``, ``IntentConflict``) is raised by that
        transaction, which then stores nothing."""
        self._queue(fence, _Behind(None, tool, key, owner, _dumps(result)))

    def _commit(
        self, c: sqlite3.Connection, tool: str, key: str, owner: tuple[str, str], text: str
    ) -> None:
        found = self._intent(c, tool, key)
        if found is not None and found.status == "committed" and found.owner == owner:
            return  # committed already (a reviewer's reconcile)
        if found is None or found.status != "pending":
            raise IntentConflict(
                f"{self.path}: no pending intent for {tool!r} key {key!r} to commit"
            )
        done = IdempotencyRecord(
            tool,
            key,
            found.args_digest,
            "committed",
            found.run_id,
            found.call_id,
            None,
            found.effect,
            found.dedup,
        )
        self._put_intent(c, done, text)

    def abort_intent(
        self, tool: str, key: str, owner: tuple[str, str], *, fence: Fence | None = None
    ) -> None:
        with self._driving(fence) as c:
            self._check_fence(c, fence)
            c.execute(
                "DELETE FROM idempotency WHERE tool = ? AND key = ? AND status = "
                "'pending' AND run_id = ? AND call_id = ?",
                (tool, key, *owner),
            )

    def _check_fence(self, c: sqlite3.Connection, fence: Fence | None) -> None:
        """Inside the intent's own transaction: refuse a driver that lost its claim."""
        if fence is None:
            return
        run_id, owner = fence
        row = c.execute("SELECT owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None or row[0] != owner:
            self._not_owner(c, run_id)

    def get_intent(self, tool: str, key: str) -> IdempotencyRecord | None:
        with self._lock:
            try:
                return self._intent(self._conn, tool, key)
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            except UnicodeDecodeError as exc:
                raise CorruptRecord(
                    f"{self.path}: the idempotency record of {tool!r} key "
                    f"{key!r} is not UTF-8 text ({exc.reason})"
                ) from None

    #: The 0.1 name of :meth:`get_intent`.
    get_idempotency = get_intent

    def find_intents(
        self, *, run_id: str | None = None, tool: str | None = None, args_digest: str | None = None
    ) -> list[IdempotencyRecord]:
        """Idempotency records owned by ``run_id`` and/or of ``tool`` with ``args_digest``
        (``fsm-agent check --db`` compares a run's trace with them). A scan: an audit
        query, not a hot path."""
        where, params = [], []
        for column, value in (("run_id", run_id), ("tool", tool), ("args_digest", args_digest)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT tool, key FROM idempotency"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._lock:
            try:
                keys = self._conn.execute(sql + " ORDER BY tool, key", params).fetchall()
                found = [self._intent(self._conn, t, k) for t, k in keys]
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        return [r for r in found if r is not None]

    # ── runs ──────────────────────────────────────────────────────────────────────

    def create_run(
        self,
        run_id: str,
        header: dict[str, Any],
        owner: str,
        events: list[dict[str, Any]],
        checkpoint: Checkpoint,
    ) -> None:
        now = time.time()
        header_text, rows = _dumps(header), _encode(events, checkpoint)
        with self._write() as c:
            if c.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                raise RunExists(f"run id {run_id!r} is already stored in {self.path}")
            state, reason, pending = rows.columns
            # The header is written once, apart: the runs row stays small because every
            # checkpoint rewrites it.
            num = c.execute(
                "INSERT INTO runs (run_id, state, reason, pending, ctx, owner, lease_until, "
                "created, updated, sum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    state,
                    reason,
                    pending,
                    rows.snapshot,
                    owner,
                    now + self.lease_s,
                    now,
                    now,
                    rows.snapshot_sum,
                ),
            ).lastrowid
            assert num is not None
            c.execute("INSERT INTO headers VALUES (?, ?, ?)", (num, header_text, _sum(header_text)))
            self._append(c, num, rows.events, rows.messages)

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        # (Encoded before the write lock is taken: it is held for the statements alone.)
        self._checkpoint(run_id, owner, _encode(events, checkpoint))

    def save_behind(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        """:meth:`save` without a transaction of its own: the checkpoint goes into the
        driving's next one (as :meth:`commit_intent_behind`). Encoded now: the loop goes on
        changing what the checkpoint refers to. A checkpoint waits behind one other that
        waits, and behind more only while the first of them is younger than
        :data:`_BEHIND_S` (:meth:`_queue`): a run of reads with a model that takes
        longer commits every second reply, one that answers at once every 50 ms."""
        rows = _encode(events, checkpoint)
        if not self._queue((run_id, owner), _Behind(rows, at=time.monotonic())):
            self._checkpoint(run_id, owner, rows)

    def save_and_release(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        """:meth:`save` and :meth:`release` in one transaction: a driving's last
        checkpoint (the run ended, or paused for review) lets the claim go as it is
        committed. The driving's own ``release`` then has nothing left to do."""
        self._checkpoint(run_id, owner, _encode(events, checkpoint), release=True)
        with self._lock:
            self._released.add((run_id, owner))

    def save_if_unchanged(
        self, run_id: str, seen: Head, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> bool:
        """As :meth:`PostgresStore.save_if_unchanged`: one ``BEGIN IMMEDIATE``
        transaction (one commit, where a claim and a save are two) that writes only if
        nobody holds the run and it is still at ``seen``; ``False`` (nothing written)
        otherwise."""
        rows = _encode(events, checkpoint)
        state, reason, pending = rows.columns
        with self._write() as c:
            found = c.execute(
                "SELECT num FROM runs WHERE run_id = ? AND owner IS NULL AND sum = ?",
                (run_id, seen.checksum),
            ).fetchone()
            if found is None:
                return False
            num = int(found[0])
            base = num << _SHIFT
            last = c.execute(
                "SELECT key, n FROM events WHERE key BETWEEN ? AND ? ORDER BY key DESC LIMIT 1",
                (base, base + (1 << _SHIFT) - 1),
            ).fetchone()
            if (-1 if last is None else last[0] - base + last[1] - 1) != seen.seq:
                return False
            now = time.time()
            c.execute(
                "UPDATE runs SET state = ?, reason = ?, pending = ?, ctx = ?, sum = ?, "
                "updated = ?, lease_until = ? WHERE num = ?",
                (state, reason, pending, rows.snapshot, rows.snapshot_sum, now,
                 now + self.lease_s, num),
            )  # fmt: skip
            self._append(c, num, rows.events, rows.messages)
        return True

    def _checkpoint(self, run_id: str, owner: str, rows: _Rows, *, release: bool = False) -> None:
        """Commit a checkpoint (after what waits behind its driving): every transaction
        that commits one goes through here."""
        with self._driving((run_id, owner), rows, release=release):
            pass

    def _save(
        self, c: sqlite3.Connection, run_id: str, owner: str, rows: _Rows, *, release: bool = False
    ) -> int:
        """Replace the run's row with checkpoint ``rows``; the run's number."""
        state, reason, pending = rows.columns
        now = time.time()
        # The fence: only the owner that holds the claim commits anything.
        cur = c.execute(
            "UPDATE runs SET state = ?, reason = ?, pending = ?, ctx = ?, sum = ?, "
            "updated = ?, lease_until = ?, owner = ? WHERE run_id = ? AND owner = ? "
            "RETURNING num",
            (state, reason, pending, rows.snapshot, rows.snapshot_sum, now, now + self.lease_s,
             None if release else owner, run_id, owner),
        )  # fmt: skip
        row = cur.fetchone()
        if row is None:
            self._not_owner(c, run_id)
        return int(row[0])

    @staticmethod
    def _append(
        c: sqlite3.Connection,
        num: int,
        events: list[tuple[int, str, str]],
        messages: list[tuple[int, str, int]],
    ) -> None:
        """Insert the events, in one row (schema 5), and the history rows (a later row of
        one index replaces an earlier: a reviewer's decision replaces a placeholder)."""
        base = num << _SHIFT
        if events:
            seq, kind, _ = events[0]
            body = "\n".join([text for _, _, text in events])
            c.execute(
                "INSERT INTO events (key, type, body, sum, n) VALUES (?, ?, ?, ?, ?)",
                (base + seq, kind, body, _crc(body), len(events)),
            )
        if messages:
            c.executemany(
                "INSERT OR REPLACE INTO messages VALUES (?, ?, ?)",
                [(base + i, text, crc) for i, text, crc in messages],
            )

    def _not_owner(self, c: sqlite3.Connection, run_id: str) -> None:
        row = c.execute("SELECT owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.path}")
        raise RunBusy(
            f"run {run_id!r} was taken over by {row[0] or 'nobody'}; this driver stopped driving it"
        )

    def adopt_run(self, run_id: str, owner: str, header: dict[str, Any]) -> bool:
        """As :meth:`PostgresStore.adopt_run`: a run with no event yet takes its first
        driver's header."""
        header_text = _dumps(header)
        with self._write() as c:
            row = c.execute(
                "SELECT num FROM runs WHERE run_id = ? AND owner = ?", (run_id, owner)
            ).fetchone()
            if row is None:
                self._not_owner(c, run_id)
            num = int(row[0])
            if c.execute(
                "SELECT 1 FROM events WHERE key BETWEEN ? AND ? LIMIT 1",
                (num << _SHIFT, ((num + 1) << _SHIFT) - 1),
            ).fetchone():
                return False
            c.execute(
                "UPDATE headers SET body = ?, sum = ? WHERE num = ?",
                (header_text, _sum(header_text), num),
            )
        return True

    def load_run(self, run_id: str) -> StoredRun:
        with self._lock:
            rows = self._read(
                "SELECT r.num, h.body, h.sum, r.ctx, r.sum, r.cancel FROM runs r JOIN "
                "headers h USING (num) WHERE r.run_id = ?",
                (run_id,),
            )
            if not rows:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            num, header, header_sum, snapshot, snapshot_sum, cancel = rows[0]
            span = (num << _SHIFT, ((num + 1) << _SHIFT) - 1)
            messages = self._read(
                "SELECT key, body, sum FROM messages WHERE key BETWEEN ? AND ? ORDER BY key", span
            )
            events = self._read(
                "SELECT key, body, sum, n FROM events WHERE key BETWEEN ? AND ? ORDER BY key",
                span,
            )
        where = f"run {run_id!r}"
        loaded = self._events(events, span[0], where)
        last = int(loaded[-1]["seq"]) if loaded else -1
        head = None if snapshot_sum is None else Head(last, int(snapshot_sum))
        return StoredRun(
            run_id,
            self._loads(header, header_sum, f"the header of {where}"),
            self._loads(snapshot, snapshot_sum, f"the checkpoint of {where}"),
            [self._loads(b, s, f"history row {k - span[0]} of {where}") for k, b, s in messages],
            loaded,
            head,
            CancelRequest.loads(cancel, f"{self.path}: {where}"),
        )

    def _events(self, rows: list[Any], base: int, where: str) -> list[dict[str, Any]]:
        """The events of ``rows`` (``key, body, sum, n``), each row's checksum and count
        checked."""
        out: list[dict[str, Any]] = []
        for key, body, stored_sum, n in rows:
            what = f"the events from {key - base} of {where}"
            if not isinstance(body, str) or (stored_sum is not None and _sum(body) != stored_sum):
                raise CorruptRecord(
                    f"{self.path}: {what} fail their checksum (the row was changed or damaged)"
                )
            lines = body.split("\n")
            if len(lines) != n:
                raise CorruptRecord(f"{self.path}: {what} are {len(lines)} lines, not {n}")
            out.extend(self._loads(line, None, what) for line in lines)
        return out

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        sql = "SELECT run_id, state, reason, pending, created, updated FROM runs"
        params: tuple[Any, ...] = ()
        if state is not None:
            sql, params = sql + " WHERE state = ?", (state,)
        rows = self._read(sql + " ORDER BY updated DESC", params)
        return [RunSummary(*row) for row in rows]

    # ── change feed and keys (the review server) ──────────────────────────────────

    def events_since(self, run_id: str, seq: int, limit: int = 1000) -> list[dict[str, Any]]:
        """See :meth:`~fsm_agent._durable.feed.FeedStore.events_since`."""
        with self._lock:
            rows = self._read("SELECT num FROM runs WHERE run_id = ?", (run_id,))
            if not rows:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            base = rows[0][0] << _SHIFT
            first = base + max(seq + 1, 0)
            # The row that holds event seq + 1 may begin before it (a row holds several).
            (start,) = self._read(
                "SELECT max(key) FROM events WHERE key BETWEEN ? AND ?", (base, first)
            )[0]
            events = self._read(
                "SELECT key, body, sum, n FROM events WHERE key BETWEEN ? AND ? ORDER BY key "
                "LIMIT ?",
                # (The first row may hold none after seq: one more than asked for.)
                (first if start is None else start, base + (1 << _SHIFT) - 1, max(limit, 0) + 1),
            )
        found = self._events(events, base, f"run {run_id!r}")
        return [e for e in found if e.get("seq", seq + 1) > seq][: max(limit, 0)]

    def watch(self, poll_s: float = 0.02) -> Watch:
        """A watch polling the file every ``poll_s`` seconds (see ``_DataVersionWatch``)."""
        try:
            return _DataVersionWatch(self.path, poll_s)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    _KEY_COLUMNS = "key_id, name, scope, salt, digest, created, revoked"

    def add_key(self, record: KeyRecord) -> None:
        with self._write() as c:
            if c.execute(
                "SELECT 1 FROM api_keys WHERE name = ? AND revoked IS NULL", (record.name,)
            ).fetchone():
                raise ConfigError(f"a key named {record.name!r} exists; revoke it first")
            c.execute(
                f"INSERT INTO api_keys ({self._KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                astuple(record),
            )

    def get_key(self, key_id: str) -> KeyRecord | None:
        rows = self._read(f"SELECT {self._KEY_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,))
        return _key_record(rows[0]) if rows else None

    def list_keys(self) -> list[KeyRecord]:
        rows = self._read(f"SELECT {self._KEY_COLUMNS} FROM api_keys ORDER BY created")
        return [_key_record(row) for row in rows]

    def revoke_key(self, name: str) -> int:
        with self._write() as c:
            cursor = c.execute(
                "UPDATE api_keys SET revoked = ? WHERE name = ? AND revoked IS NULL",
                (time.time(), name),
            )
            return int(cursor.rowcount)

    def claim(self, run_id: str, owner: str) -> None:
        now = time.time()
        with self._write() as c:
            row = c.execute(
                "SELECT owner, lease_until FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            holder, until = row
            if holder not in (None, owner) and owners.is_live(holder, until, now):
                raise RunBusy(
                    f"run {run_id!r} is being driven by {holder}; try again when it stops"
                )
            c.execute(
                "UPDATE runs SET owner = ?, lease_until = ? WHERE run_id = ?",
                (owner, now + self.lease_s, run_id),
            )
        self._claimed(run_id, owner)

    def _claimed(self, run_id: str, owner: str) -> None:
        """``owner`` claimed ``run_id``: what other drivings of it in this object still
        had behind is dropped — their fence would refuse it, as it would have died with
        a process that was killed."""
        with self._lock:
            self._released.discard((run_id, owner))
            for k in [k for k in self._behind if k[0] == run_id and k[1] != owner]:
                del self._behind[k]

    def renew(self, run_id: str, owner: str) -> CancelRequest | None:
        with self._write() as c:
            row = c.execute(
                "UPDATE runs SET lease_until = ? WHERE run_id = ? AND owner = ? RETURNING cancel",
                (time.time() + self.lease_s, run_id, owner),
            ).fetchone()
            if row is None:
                self._not_owner(c, run_id)
        return CancelRequest.loads(row[0], f"{self.path}: run {run_id!r}")

    def request_cancel(self, run_id: str, request: CancelRequest) -> CancelRequest | None:
        """As :meth:`MemoryStore.request_cancel <fsm_agent._durable.memory.MemoryStore.
        request_cancel>`: one ``BEGIN IMMEDIATE`` transaction, whoever holds the run."""
        with self._write() as c:
            row = c.execute("SELECT state, cancel FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            state, stored = row
            if state in _ENDED:
                return None
            if stored is None:
                c.execute("UPDATE runs SET cancel = ? WHERE run_id = ?", (request.dumps(), run_id))
                return request
        return CancelRequest.loads(stored, f"{self.path}: run {run_id!r}")

    def release(self, run_id: str, owner: str) -> None:
        """Give up the claim, with what still waits behind the driving (a run that
        stopped between its checkpoints: what it did is stored)."""
        with self._lock:
            if (run_id, owner) in self._released:  # by its last checkpoint
                self._released.discard((run_id, owner))
                return
        with self._driving((run_id, owner)) as c:
            c.execute(
                "UPDATE runs SET owner = NULL WHERE run_id = ? AND owner = ?", (run_id, owner)
            )

    # ── retention ─────────────────────────────────────────────────────────────────

    # ── approval uses ─────────────────────────────────────────────────────────────

    def consume_approval(self, approval_id: str, max_uses: int, run_id: str, call_id: str) -> bool:
        """See :meth:`~fsm_agent._durable.store.ApprovalStore.consume_approval`: one
        ``BEGIN IMMEDIATE`` transaction, so processes sharing the file count together."""
        with self._write() as c:
            held = c.execute(
                "SELECT 1 FROM approval_uses WHERE approval_id = ? AND run_id = ? AND call_id = ?",
                (approval_id, run_id, call_id),
            ).fetchone()
            if held is not None:
                return True
            (used,) = c.execute(
                "SELECT count(*) FROM approval_uses WHERE approval_id = ?", (approval_id,)
            ).fetchone()
            if used >= max_uses:
                return False
            c.execute(
                "INSERT INTO approval_uses (approval_id, run_id, call_id, spent) "
                "VALUES (?, ?, ?, ?)",
                (approval_id, run_id, call_id, time.time()),
            )
            return True

    def approval_uses(self, approval_id: str) -> int:
        rows = self._read(
            "SELECT count(*) FROM approval_uses WHERE approval_id = ?", (approval_id,)
        )
        return int(rows[0][0])

    def prune(self, older_than_s: float, *, intents: bool = True) -> tuple[int, int]:
        """Delete runs that ended (any terminal state but ``review_required``) more than
        ``older_than_s`` seconds ago and are not being driven, with their events and
        history; with ``intents``, also committed idempotency records that old (a request
        that old runs again instead of replaying). A run waiting for review and a pending
        intent are never pruned. Returns ``(runs, intents)`` deleted."""
        cutoff = time.time() - older_than_s
        with self._write() as c:
            nums = [
                n
                for (n,) in c.execute(
                    "SELECT num FROM runs WHERE updated < ? AND owner IS NULL AND state IN "
                    "('done', 'budget_exhausted', 'protocol_error', 'cancelled')",
                    (cutoff,),
                )
            ]
            for num in nums:
                span = (num << _SHIFT, ((num + 1) << _SHIFT) - 1)
                c.execute("DELETE FROM events WHERE key BETWEEN ? AND ?", span)
                c.execute("DELETE FROM messages WHERE key BETWEEN ? AND ?", span)
                c.execute("DELETE FROM headers WHERE num = ?", (num,))
                c.execute("DELETE FROM runs WHERE num = ?", (num,))
            dropped = 0
            if intents:
                dropped = c.execute(
                    "DELETE FROM idempotency WHERE status = 'committed' AND updated < ?", (cutoff,)
                ).rowcount
        return len(nums), dropped


class _Rows(NamedTuple):
    """A checkpoint as the text its statements write: encoded once, before the
    transaction (the write lock is held for the statements alone), and at once for one
    that waits behind (the loop goes on changing what it refers to)."""

    columns: tuple[str, str, int]
    snapshot: str
    snapshot_sum: int
    events: list[tuple[int, str, str]]  # (seq, type, trace line)
    messages: list[tuple[int, str, int]]  # (history index, text, CRC-32)


def _encode(events: list[dict[str, Any]], checkpoint: Checkpoint) -> _Rows:
    # The JSON text the snapshot was built with (RunState.snapshot), else encoded here.
    snapshot = getattr(checkpoint.snapshot, "text", None) or _dumps(checkpoint.snapshot)
    # The driver's chained lines when it encoded them (the trace file's bytes).
    lines = checkpoint.event_lines
    if lines is None or len(lines) != len(events):
        lines = [_dumps(e) for e in events]
    texts = [(i, _dumps(m)) for i, m in checkpoint.messages]
    return _Rows(
        _columns(checkpoint.snapshot),
        snapshot,
        _crc(snapshot),
        [(e["seq"], e["type"], t) for e, t in zip(events, lines, strict=True)],
        [(i, t, _crc(t)) for i, t in texts],
    )


def _columns(snapshot: dict[str, Any]) -> tuple[str, str, int]:
    body = snapshot.get("body") if isinstance(snapshot, dict) else None
    body = body if isinstance(body, dict) else {}
    return (
        str(body.get("state", "")),
        str(body.get("reason") or ""),
        len(body.get("placeholders") or {}),
    )


#: Commits between two checkpoints asked of the checkpointer's thread (a commit of a
#: round appends about 4 to 8 pages to the log).
_CHECKPOINT_EVERY = 100
#: Log pages past which the writing connection checkpoints itself (SQLite's own
#: default is 1000): only where the thread cannot keep up, as under a writer that never
#: pauses (a checkpoint restarts the log only once it has caught up with it).
_FALLBACK_PAGES = 4000


class _Checkpointer:
    """Copies the WAL back into the database file on a daemon thread with a connection
    of its own (``PRAGMA wal_checkpoint(PASSIVE)``: it never blocks a writer or a
    reader), so that no commit of a round waits for the fsync a checkpoint does. It
    checkpoints when asked (every :data:`_CHECKPOINT_EVERY` commits) and whenever the
    commits pause for :attr:`QUIET_S` (a run's model calls, its end): the log restarts
    from its beginning only after a checkpoint that caught up with it. Caught up, it
    sleeps until the next commit. A checkpoint is crash-safe wherever it is
    interrupted; a process killed meanwhile loses nothing."""

    #: How long the commits must pause for a checkpoint that can catch up.
    QUIET_S = 0.02

    def __init__(self, path: Path, timeout: float) -> None:
        self._path, self._timeout = path, timeout
        self._wake = threading.Event()
        self._stopping = False
        self._idle = False  # the thread sleeps until the next commit
        self._commits = 0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def committed(self) -> None:
        self._commits += 1
        thread = self._thread
        if thread is None or self._pid != os.getpid() or not thread.is_alive():
            # (Started at the first commit, and again in a forked child, which has no
            # thread of its parent's.)
            self._pid = os.getpid()
            self._thread = thread = threading.Thread(
                target=self._run, daemon=True, name="fsm-agent-sqlite-checkpoint"
            )
            thread.start()
        if self._idle or not self._commits % _CHECKPOINT_EVERY:
            self._wake.set()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(
                str(self._path), timeout=self._timeout, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            return  # the writer's own checkpoints (_FALLBACK_PAGES) still bound the log
        try:
            self._loop(conn)
        finally:
            conn.close()

    def _loop(self, conn: sqlite3.Connection) -> None:
        # The commit count at the last checkpoint that caught up, and at the last look.
        last = seen = 0
        while not self._stopping:
            if self._commits == last:  # caught up: sleep until the next commit
                self._idle = True
                if self._commits == last:  # (a commit meanwhile saw _idle, or is seen here)
                    self._wake.wait()
                self._idle = False
                self._wake.clear()
                continue
            asked = self._wake.wait(self.QUIET_S)
            self._wake.clear()
            commits = self._commits
            if not self._stopping and (asked or commits == seen):  # asked, or they paused
                try:
                    _, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error:  # (busy: the writer's fallback still bounds the log)
                    log, done = 1, 0
                if done >= log:
                    last = commits
            seen = commits

    def stop(self) -> None:
        """Ask the thread to end (it closes its connection), without waiting for it."""
        self._stopping = True
        self._wake.set()

    def close(self) -> None:
        self.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._timeout)


class _DataVersionWatch:
    """A watch on an SQLite file: ``PRAGMA data_version`` of a connection that never
    writes changes on every commit by any other connection (this process's store
    included), so polling it is one cheap read of the file header."""

    def __init__(self, path: Path, poll_s: float) -> None:
        self._conn = sqlite3.connect(str(path), check_same_thread=False)
        self._poll_s = poll_s
        self._seen = self._version()

    def _version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            version = self._version()
            if version != self._seen:
                self._seen = version
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self._poll_s, left))

    def close(self) -> None:
        self._conn.close()


def _key_record(row: tuple[Any, ...]) -> KeyRecord:
    return KeyRecord(*row)
