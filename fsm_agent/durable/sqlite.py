"""A durable :class:`~fsm_agent.store.Store` in one SQLite file (stdlib ``sqlite3``).

WAL journal with ``synchronous=NORMAL``: a committed transaction survives the process
being killed (SIGKILL included); after a power loss the last few commits may be lost,
but the file stays consistent. Every checkpoint is one short ``BEGIN IMMEDIATE``
transaction that appends the new events and messages and replaces one small context row,
so its cost does not grow with the length of the run.

The schema version lives in ``PRAGMA user_version`` and is migrated on open; a file
written by a newer fsm-agent is refused rather than guessed at. ``PRAGMA application_id``
marks the file as ours, so another program's database is never written into.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fsm_agent.durable.store import (
    Checkpoint,
    IdempotencyRecord,
    RunSummary,
    StoredRun,
    claim_is_stale,
)
from fsm_agent.errors import IntentConflict, RunBusy, RunExists, RunNotFound, StoreError

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
    CREATE TABLE headers (
        num  INTEGER PRIMARY KEY,
        body TEXT NOT NULL
    );
    CREATE TABLE events (
        key  INTEGER PRIMARY KEY,
        type TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE TABLE messages (
        key  INTEGER PRIMARY KEY,
        body TEXT NOT NULL
    );
    CREATE TABLE approvals (
        num     INTEGER NOT NULL,
        call_id TEXT NOT NULL,
        tool    TEXT NOT NULL,
        digest  TEXT NOT NULL,
        granted REAL NOT NULL,
        PRIMARY KEY (num, call_id)
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
)

_SHIFT = 32  # events and messages: key = run number << 32 | seq (or history index)

#: The schema version this code writes.
SCHEMA_VERSION = len(_MIGRATIONS)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


class SqliteStore:
    """Runs, events, checkpoints, approvals and idempotency records in one SQLite file.

    ``timeout`` is how long to wait for another process's lock before failing with a
    :class:`StoreError`; ``lease_s`` is how long a claim by a process on another host
    holds without a checkpoint (on this host a claim holds exactly while its process
    lives). ``create=False`` refuses to create a missing file (the CLI uses it).
    """

    checkpoint_every_transition = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 5.0,
        lease_s: float = 300.0,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.lease_s = lease_s
        self._lock = threading.RLock()
        if not create and not self.path.exists():
            raise StoreError(f"{self.path}: no such database")
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a directory, not a database file")
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=timeout, isolation_level=None, check_same_thread=False
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
            if app_id == 0 and version == 0:
                tables = self._conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
                ).fetchone()[0]
                if tables:
                    raise StoreError(
                        f"{self.path}: not an fsm-agent database (it holds {tables} other tables)"
                    )
            # WAL lets readers (the CLI) work while a run writes; NORMAL syncs at
            # checkpoints of the WAL, not at every commit (crash-safe, not power-safe).
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=OFF")
            if version < SCHEMA_VERSION:
                self._migrate(version)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _migrate(self, version: int) -> None:
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
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ── transactions and errors ───────────────────────────────────────────────────

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreError(
                f"{self.path}: database is locked by another process (waited {self.timeout:g}s)"
            )
        if (
            "not a database" in text
            or "malformed" in text
            or (isinstance(exc, sqlite3.DatabaseError) and "corrupt" in text)
        ):
            return StoreError(f"{self.path}: not an SQLite database or corrupt ({text})")
        if "unable to open" in text:
            return StoreError(f"{self.path}: cannot open the database file ({text})")
        return StoreError(f"{self.path}: {text}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: all of it is committed, or none."""
        with self._lock:
            c = self._conn
            try:
                c.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            try:
                yield c
            except sqlite3.Error as exc:
                c.execute("ROLLBACK")
                raise self._error(exc) from None
            except BaseException:
                c.execute("ROLLBACK")
                raise
            try:
                c.execute("COMMIT")
            except sqlite3.Error as exc:
                c.execute("ROLLBACK")
                raise self._error(exc) from None

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    # ── idempotency ───────────────────────────────────────────────────────────────

    def get_idempotency(self, tool: str, key: str) -> IdempotencyRecord | None:
        rows = self._read(
            "SELECT args_digest, status, run_id, call_id, result FROM "
            "idempotency WHERE tool = ? AND key = ?",
            (tool, key),
        )
        if not rows:
            return None
        digest, status, run_id, call_id, result = rows[0]
        return IdempotencyRecord(
            tool,
            key,
            digest,
            status,
            run_id,
            call_id,
            None if result is None else json.loads(result),
        )

    def begin_idempotency(self, record: IdempotencyRecord) -> None:
        current = self.get_idempotency(record.tool, record.key)
        if (
            current is not None
            and current.status == "pending"
            and (current.args_digest, current.owner) == (record.args_digest, record.owner)
        ):
            return  # stored with the checkpoint that started this attempt
        with self._write() as c:
            self._begin(c, record)

    @staticmethod
    def _begin(c: sqlite3.Connection, record: IdempotencyRecord) -> None:
        row = c.execute(
            "SELECT status, args_digest FROM idempotency WHERE tool = ? AND key = ?",
            (record.tool, record.key),
        ).fetchone()
        if row is not None and (row[0] == "committed" or row[1] != record.args_digest):
            raise IntentConflict(f"idempotency key {record.key!r} of {record.tool!r} is taken")
        c.execute(
            "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?, 'pending', ?, ?, NULL, ?)",
            (
                record.tool,
                record.key,
                record.args_digest,
                record.run_id,
                record.call_id,
                time.time(),
            ),
        )

    def commit_idempotency(self, tool: str, key: str, result: Any) -> None:
        with self._write() as c:
            cur = c.execute(
                "UPDATE idempotency SET status = 'committed', result = ?, "
                "updated = ? WHERE tool = ? AND key = ?",
                (_dumps(result), time.time(), tool, key),
            )
            if cur.rowcount != 1:
                raise IntentConflict(f"no idempotency record for {tool!r} key {key!r}")

    def abort_idempotency(self, tool: str, key: str) -> None:
        with self._write() as c:
            c.execute(
                "DELETE FROM idempotency WHERE tool = ? AND key = ? AND status = 'pending'",
                (tool, key),
            )

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
        with self._write() as c:
            if c.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                raise RunExists(f"run id {run_id!r} is already stored in {self.path}")
            ctx = checkpoint.ctx
            # The header is written once, apart: the runs row stays small because every
            # checkpoint rewrites it.
            num = c.execute(
                "INSERT INTO runs (run_id, state, reason, pending, ctx, owner, lease_until, "
                "created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    ctx.get("state", ""),
                    ctx.get("reason") or "",
                    len(ctx.get("placeholders") or ()),
                    _dumps(ctx),
                    owner,
                    now + self.lease_s,
                    now,
                    now,
                ),
            ).lastrowid
            assert num is not None
            c.execute("INSERT INTO headers VALUES (?, ?)", (num, _dumps(header)))
            self._append(c, num, events, checkpoint)

    def save(
        self, run_id: str, owner: str, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        ctx = checkpoint.ctx
        now = time.time()
        with self._write() as c:
            num = self._num(c, run_id)
            cur = c.execute(
                "UPDATE runs SET state = ?, reason = ?, pending = ?, ctx = ?, updated = ?, "
                "lease_until = ? WHERE num = ? AND owner = ?",
                (
                    ctx.get("state", ""),
                    ctx.get("reason") or "",
                    len(ctx.get("placeholders") or ()),
                    _dumps(ctx),
                    now,
                    now + self.lease_s,
                    num,
                    owner,
                ),
            )
            if cur.rowcount != 1:
                self._not_owner(c, run_id)
            self._append(c, num, events, checkpoint)

    def _num(self, c: sqlite3.Connection, run_id: str) -> int:
        row = c.execute("SELECT num FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.path}")
        return int(row[0])

    @classmethod
    def _append(
        cls, c: sqlite3.Connection, num: int, events: list[dict[str, Any]], checkpoint: Checkpoint
    ) -> None:
        for record in checkpoint.intents:
            cls._begin(c, record)
        base = num << _SHIFT
        if events:
            c.executemany(
                "INSERT INTO events VALUES (?, ?, ?)",
                [(base + e["seq"], e["type"], _dumps(e)) for e in events],
            )
        if checkpoint.messages:
            c.executemany(
                "INSERT OR REPLACE INTO messages VALUES (?, ?)",
                [(base + i, _dumps(m)) for i, m in checkpoint.messages],
            )
        if checkpoint.approvals:
            now = time.time()
            c.executemany(
                "INSERT OR REPLACE INTO approvals VALUES (?, ?, ?, ?, ?)",
                [
                    (num, call_id, tool, digest, now)
                    for call_id, tool, digest in checkpoint.approvals
                ],
            )

    def _not_owner(self, c: sqlite3.Connection, run_id: str) -> None:
        row = c.execute("SELECT owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.path}")
        raise RunBusy(
            f"run {run_id!r} was taken over by {row[0] or 'nobody'}; this process "
            "stopped driving it"
        )

    def load_run(self, run_id: str) -> StoredRun:
        with self._lock:
            rows = self._read(
                "SELECT r.num, h.body, r.ctx FROM runs r JOIN headers h "
                "USING (num) WHERE r.run_id = ?",
                (run_id,),
            )
            if not rows:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            num, header, ctx = rows[0]
            span = (num << _SHIFT, ((num + 1) << _SHIFT) - 1)
            messages = self._read(
                "SELECT body FROM messages WHERE key BETWEEN ? AND ? ORDER BY key", span
            )
            events = self._read(
                "SELECT body FROM events WHERE key BETWEEN ? AND ? ORDER BY key", span
            )
            approvals = self._read(
                "SELECT call_id, tool, digest FROM approvals WHERE num = ? ORDER BY granted", (num,)
            )
        return StoredRun(
            run_id,
            json.loads(header),
            json.loads(ctx),
            [json.loads(m) for (m,) in messages],
            [json.loads(e) for (e,) in events],
            [(a, b, d) for a, b, d in approvals],
        )

    def list_runs(self, state: str | None = None) -> list[RunSummary]:
        sql = "SELECT run_id, state, reason, pending, created, updated FROM runs"
        params: tuple[Any, ...] = ()
        if state is not None:
            sql, params = sql + " WHERE state = ?", (state,)
        rows = self._read(sql + " ORDER BY updated DESC", params)
        return [RunSummary(*row) for row in rows]

    def claim(self, run_id: str, owner: str) -> None:
        now = time.time()
        with self._write() as c:
            row = c.execute(
                "SELECT owner, lease_until FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in {self.path}")
            holder, until = row
            if holder not in (None, owner) and not claim_is_stale(holder, until, now):
                raise RunBusy(
                    f"run {run_id!r} is being driven by {holder}; try again when it stops"
                )
            c.execute(
                "UPDATE runs SET owner = ?, lease_until = ? WHERE run_id = ?",
                (owner, now + self.lease_s, run_id),
            )

    def release(self, run_id: str, owner: str) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE runs SET owner = NULL WHERE run_id = ? AND owner = ?", (run_id, owner)
            )
