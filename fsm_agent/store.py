"""Where a runtime keeps what must outlive a single call: idempotency records.

The runtime talks to a :class:`Store`. :class:`MemoryStore` keeps records for the life
of the process (one per ``Runtime`` by default, so repeated runs share them). A durable
store (SQLite) implements the same protocol and adds runs, events and approvals.

Idempotency follows Stripe/AWS semantics: a record is written as ``pending`` before a
write runs (intent), then ``committed`` with its result; the same key with the same
arguments replays the result, the same key with different arguments is a conflict,
never an overwrite. A record left ``pending`` means the outcome is unknown.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

__all__ = ["IdempotencyRecord", "MemoryStore", "Store"]


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


class Store(Protocol):
    """What the runtime needs from a store."""

    def get_idempotency(self, tool: str, key: str) -> IdempotencyRecord | None: ...

    def begin_idempotency(self, record: IdempotencyRecord) -> None:
        """Store the intent (``pending``) before the write runs; replaces only a pending
        record of the same arguments (a retry or a deduplicated re-run)."""

    def commit_idempotency(self, tool: str, key: str, result: Any) -> None:
        """Record the write's result; afterwards the same request replays it."""

    def abort_idempotency(self, tool: str, key: str) -> None:
        """Forget a pending record whose write definitely did not happen."""


class MemoryStore:
    """An in-process :class:`Store` (thread-safe)."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], IdempotencyRecord] = {}
        self._lock = threading.Lock()

    def get_idempotency(self, tool: str, key: str) -> IdempotencyRecord | None:
        return self._records.get((tool, key))

    def begin_idempotency(self, record: IdempotencyRecord) -> None:
        with self._lock:
            current = self._records.get((record.tool, record.key))
            if current is not None and (
                current.status == "committed" or current.args_digest != record.args_digest
            ):
                raise ValueError(f"idempotency key {record.key!r} of {record.tool!r} is taken")
            self._records[(record.tool, record.key)] = record

    def commit_idempotency(self, tool: str, key: str, result: Any) -> None:
        with self._lock:
            current = self._records.get((tool, key))
            if current is None:
                raise KeyError(f"no idempotency record for {tool!r} key {key!r}")
            self._records[(tool, key)] = replace(current, status="committed", result=result)

    def abort_idempotency(self, tool: str, key: str) -> None:
        with self._lock:
            current = self._records.get((tool, key))
            if current is not None and current.status == "pending":
                del self._records[(tool, key)]
