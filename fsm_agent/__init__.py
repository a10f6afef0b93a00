"""fsm-agent: LLM tool-calling loops run as explicit, guarded finite-state machines.

The names exported here are the public contract (docs/reference/api.md); import them from
``fsm_agent``. The other public namespaces are

    fsm_agent.sansio    the hand-driving API: RunState, ``steps``, requests, events, machines
    fsm_agent.stores    the store protocol and the memory, SQLite and PostgreSQL stores
    fsm_agent.models    scripted models and the provider adapters
    fsm_agent.tools     the tool registry and MCP servers as tools
    fsm_agent.testing   the pytest toolkit
    fsm_agent.otel      OpenTelemetry (extra ``[otel]``); fsm_agent.server, the review server

Every other module is private (a leading underscore in its path) and may change without
notice; ``tests/test_exports.py`` holds the public namespaces to this. The package is
layered; each layer imports only the layers above it in this list
(``tests/test_layering.py`` enforces it)::

    _errors     one exception tree under FsmAgentError
    _rules/     your own rules: Rule values, a RuleSet compiled and type-checked once, CEL
                conditions, judgements as pure functions (below core, so the loop can judge)
    _core/      the transition table, guards, edge selection, run state, decisions and the
                sans-IO loop: no I/O, no clock, no store
    _trace/     trace events, JSON Lines reading and writing, the one checker
    _durable/   the store protocol, MemoryStore, SqliteStore, PostgresStore (and its run
                queue), checkpoints, resume, review
    tools/      the tool registry, MCP servers as tools
    _runtime/   configuration, the sync and async drivers (the only I/O), Runtime
    models/     scripted models and provider adapters (OpenAI, Anthropic)
    otel/       every run as OpenTelemetry GenAI spans (an interceptor; extra ``[otel]``)
    _render/    diagrams and replay drawn from the table
    testing/    the pytest toolkit: fault tools, scenarios per edge, assertions, coverage
    server/     the review server: JSON API, live change feed (SSE), keys, web UI
    _cli/       the ``fsm-agent`` command line
    sansio, stores   facades over _core and _durable (nothing imports them)
"""

import importlib
from typing import TYPE_CHECKING, Any

from fsm_agent._core.approvals import Approval
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.events import Event
from fsm_agent._core.history import check_history
from fsm_agent._core.table import MACHINE_HASH, STATES, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.store import IdempotencyRecord, Store
from fsm_agent._errors import (
    ArgumentsError,
    ConfigError,
    CorruptRecord,
    FsmAgentError,
    HistoryError,
    IntentConflict,
    MachineMismatch,
    McpServerStartError,
    McpToolError,
    ModelArgsError,
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelUnavailableError,
    RenderError,
    ReviewError,
    RunBusy,
    RunExists,
    RunNotFound,
    StepError,
    StoreError,
    ToolRejected,
    ToolSignal,
    TraceError,
    TransientToolError,
    UsageError,
)
from fsm_agent._rules import Facts, Rule
from fsm_agent._runtime.interceptors import Interceptor, observing
from fsm_agent._runtime.result import RunResult
from fsm_agent._runtime.runtime import Runtime
from fsm_agent._trace.io import JsonlTrace, read_trace
from fsm_agent._version import __version__
from fsm_agent.models._scripted import KeyedScriptedModel, ScriptedModel, StreamingScriptedModel
from fsm_agent.tools._registry import Tool, ToolRegistry

if TYPE_CHECKING:  # for type checkers; at run time each is imported on first use
    from fsm_agent._durable.postgres import PostgresStore
    from fsm_agent._durable.sqlite import SqliteStore
    from fsm_agent._runtime.worker import Worker
    from fsm_agent._trace.checker import check_trace


#: Imported on first use: ``import sqlite3`` alone costs ~17 ms cold, ``PostgresStore`` needs
#: the postgres extra only when opened, the checker replays the engine, and a worker loads
#: asyncio.
_LAZY = {
    "SqliteStore": "fsm_agent._durable.sqlite",
    "PostgresStore": "fsm_agent._durable.postgres",
    "check_trace": "fsm_agent._trace.checker",
    "Worker": "fsm_agent._runtime.worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsm_agent' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "MACHINE_HASH",
    "STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Approval",
    "ArgumentsError",
    "Budget",
    "ConfigError",
    "CorruptRecord",
    "Event",
    "Facts",
    "FsmAgentError",
    "HistoryError",
    "IdempotencyRecord",
    "IntentConflict",
    "Interceptor",
    "JsonlTrace",
    "KeyedScriptedModel",
    "MachineMismatch",
    "McpServerStartError",
    "McpToolError",
    "MemoryStore",
    "ModelArgsError",
    "ModelAuthError",
    "ModelError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelUnavailableError",
    "PostgresStore",
    "RenderError",
    "RetryPolicy",
    "ReviewError",
    "Rule",
    "RunBusy",
    "RunExists",
    "RunNotFound",
    "RunResult",
    "Runtime",
    "ScriptedModel",
    "SqliteStore",
    "StepError",
    "Store",
    "StoreError",
    "StreamingScriptedModel",
    "Tool",
    "ToolRegistry",
    "ToolRejected",
    "ToolSignal",
    "TraceError",
    "TransientToolError",
    "Transition",
    "UsageError",
    "Worker",
    "__version__",
    "check_history",
    "check_trace",
    "observing",
    "read_trace",
]
