"""fsm-agent: LLM tool-calling loops run as explicit, guarded finite-state machines.

The names exported here are the public contract (docs/reference/api.md); import them from
``fsm_agent``. The package is layered; each layer imports only the layers above it in
this list (``tests/test_layering.py`` enforces it)::

    errors      one exception tree under FsmAgentError
    rules/      your own rules: Rule values, a RuleSet compiled and type-checked once, CEL
                conditions, judgements as pure functions (below core, so the loop can judge)
    core/       the transition table, guards, edge selection, run state, decisions and the
                sans-IO loop: no I/O, no clock, no store
    trace/      trace events, JSON Lines reading and writing, the one checker
    durable/    the store protocol, MemoryStore, SqliteStore, PostgresStore (and its run
                queue), checkpoints, resume, review
    tools/      the tool registry, MCP servers as tools
    runtime/    configuration, the sync and async drivers (the only I/O), Runtime
    models/     scripted models and provider adapters (OpenAI, Anthropic)
    otel/       every run as OpenTelemetry GenAI spans (an interceptor; extra ``[otel]``)
    render/     diagrams and replay drawn from the table
    testing/    the pytest toolkit: fault tools, scenarios per edge, assertions, coverage
    server/     the review server: JSON API, live change feed (SSE), keys, web UI
    cli/        the ``fsm-agent`` command line
"""

from typing import Any

from fsm_agent import _compat
from fsm_agent._version import __version__
from fsm_agent.core.approvals import Approval
from fsm_agent.core.budget import Budget, RetryPolicy
from fsm_agent.core.events import Event
from fsm_agent.core.history import check_history
from fsm_agent.core.table import MACHINE_HASH, STATES, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.durable.memory import MemoryStore
from fsm_agent.durable.store import IdempotencyRecord, Store
from fsm_agent.errors import (
    ConfigError,
    FsmAgentError,
    ReviewError,
    RunBusy,
    RunNotFound,
    StoreError,
    ToolRejected,
    TraceError,
    TransientToolError,
)
from fsm_agent.models.scripted import KeyedScriptedModel, ScriptedModel, StreamingScriptedModel
from fsm_agent.rules import Rule
from fsm_agent.runtime.interceptors import Interceptor
from fsm_agent.runtime.result import RunResult
from fsm_agent.runtime.runtime import Runtime
from fsm_agent.tools.registry import Tool, ToolRegistry
from fsm_agent.trace.io import JsonlTrace, read_trace

_compat.install()


def __getattr__(name: str) -> Any:
    # SqliteStore is imported on first use: ``import sqlite3`` alone costs ~17 ms cold.
    if name == "SqliteStore":
        from fsm_agent.durable.sqlite import SqliteStore

        return SqliteStore
    if name == "PostgresStore":  # needs the postgres extra (psycopg) only when opened
        from fsm_agent.durable.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'fsm_agent' has no attribute {name!r}")


__all__ = [
    "MACHINE_HASH",
    "STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Approval",
    "Budget",
    "ConfigError",
    "Event",
    "FsmAgentError",
    "IdempotencyRecord",
    "Interceptor",
    "JsonlTrace",
    "KeyedScriptedModel",
    "MemoryStore",
    "PostgresStore",
    "RetryPolicy",
    "ReviewError",
    "Rule",
    "RunBusy",
    "RunNotFound",
    "RunResult",
    "Runtime",
    "ScriptedModel",
    "SqliteStore",
    "Store",
    "StoreError",
    "StreamingScriptedModel",
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
