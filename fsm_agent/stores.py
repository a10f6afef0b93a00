"""Where runs are kept: the store protocols and the three stores.

:class:`MemoryStore` (one process, tests), :class:`SqliteStore` (one machine; imported on
first use, since ``import sqlite3`` costs ~17 ms cold) and :class:`PostgresStore` (a
fleet; needs the ``postgres`` extra when opened). A store of your own implements
:class:`Store` (checkpoints and intents) and, for ``submit``, workers, review and the
server, :class:`RunStore`; ``supports_runs`` and ``supports_approvals`` tell which a
store offers. ``docs/concepts/durable-runs.md`` gives the rules every store keeps.
"""

from typing import TYPE_CHECKING, Any

from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.store import (
    ApprovalStore,
    CancelRequest,
    Checkpoint,
    Fence,
    Head,
    IdempotencyRecord,
    IntentClaim,
    RunSave,
    RunStore,
    RunSummary,
    Store,
    StoredRun,
    supports_approvals,
    supports_runs,
)

if TYPE_CHECKING:  # for type checkers; at run time both are imported on first use
    from fsm_agent._durable.postgres import PostgresStore
    from fsm_agent._durable.sqlite import SqliteStore

__all__ = [
    "ApprovalStore",
    "CancelRequest",
    "Checkpoint",
    "Fence",
    "Head",
    "IdempotencyRecord",
    "IntentClaim",
    "MemoryStore",
    "PostgresStore",
    "RunSave",
    "RunStore",
    "RunSummary",
    "SqliteStore",
    "Store",
    "StoredRun",
    "supports_approvals",
    "supports_runs",
]


def __getattr__(name: str) -> Any:
    if name == "SqliteStore":
        from fsm_agent._durable.sqlite import SqliteStore

        return SqliteStore
    if name == "PostgresStore":
        from fsm_agent._durable.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'fsm_agent.stores' has no attribute {name!r}")
