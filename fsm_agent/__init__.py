"""fsm-agent: LLM tool-calling loops run as explicit, guarded finite-state machines.

The public names below are the contract (SPEC.md §3); everything else may change.
"""

from typing import Any

from fsm_agent.approvals import Approval
from fsm_agent.budget import Budget, RetryPolicy
from fsm_agent.errors import ToolRejected, TraceError, TransientToolError
from fsm_agent.history import check_history
from fsm_agent.machine import MACHINE_HASH, STATES, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.models.scripted import ScriptedModel
from fsm_agent.result import RunResult
from fsm_agent.runtime import Runtime
from fsm_agent.store import (
    IdempotencyRecord,
    MemoryStore,
    ReviewError,
    RunBusy,
    RunNotFound,
    Store,
    StoreError,
)
from fsm_agent.tools import Tool, ToolRegistry
from fsm_agent.trace import JsonlTrace, read_trace

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # SqliteStore is imported on first use: ``import sqlite3`` alone costs ~17 ms cold.
    if name == "SqliteStore":
        from fsm_agent.sqlite_store import SqliteStore

        return SqliteStore
    raise AttributeError(f"module 'fsm_agent' has no attribute {name!r}")


__all__ = [
    "MACHINE_HASH",
    "STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Approval",
    "Budget",
    "IdempotencyRecord",
    "JsonlTrace",
    "MemoryStore",
    "RetryPolicy",
    "ReviewError",
    "RunBusy",
    "RunNotFound",
    "RunResult",
    "Runtime",
    "ScriptedModel",
    "SqliteStore",
    "Store",
    "StoreError",
    "Tool",
    "ToolRegistry",
    "ToolRejected",
    "TraceError",
    "TransientToolError",
    "Transition",
    "__version__",
    "check_history",
    "read_trace",
]
