"""Durable runs: the store protocol, the in-memory and SQLite stores, owners and leases,
resume and review. ``SqliteStore`` is imported on first use (``import sqlite3`` costs
~17 ms cold)."""

from typing import Any

from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.store import (
    Checkpoint,
    IdempotencyRecord,
    IntentClaim,
    RunStore,
    RunSummary,
    Store,
    StoredRun,
    supports_runs,
)

__all__ = [
    "Checkpoint",
    "IdempotencyRecord",
    "IntentClaim",
    "MemoryStore",
    "RunStore",
    "RunSummary",
    "SqliteStore",
    "Store",
    "StoredRun",
    "supports_runs",
]


def __getattr__(name: str) -> Any:
    if name == "SqliteStore":
        from fsm_agent._durable.sqlite import SqliteStore

        return SqliteStore
    raise AttributeError(f"module 'fsm_agent._durable' has no attribute {name!r}")
