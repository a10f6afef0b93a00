"""Shared pieces for the engine's own tests: a small tool backend and decision builders."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from fsm_agent import (
    Approval,
    Budget,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    ToolRegistry,
    ToolRejected,
    TransientToolError,
)
from fsm_agent._core.table import STATES
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent.testing._assertions import assert_history_valid, assert_trace_legal

# In CI (``CI`` set, as .ci/run does) every Hypothesis test draws the same examples on
# every run, so a landing never hangs on a lucky draw; run locally, each run draws new
# ones, and `make fuzz` draws many. A failure found either way is kept as an @example.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def call(call_id: Any, name: str, args: Any = None, **kwargs: Any) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args if args is not None else kwargs)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(*tool_calls: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(tool_calls), **extra}


def say(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


class FakeClock:
    """A clock that only moves when told to: deadlines and backoffs without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Backend:
    """Tools with observable side effects and faults on command."""

    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.writes: list[dict[str, Any]] = []
        self.fail_reads: list[BaseException] = []  # raised by lookup, in order
        self.fail_writes: list[tuple[BaseException, bool]] = []  # (error, after side effect?)
        self.clock: FakeClock | None = None
        self.read_cost_s = 0.0
        self.output = "in_transit"

    def lookup(self, order_id: str) -> dict[str, Any]:
        self.lookups.append(order_id)
        if self.clock is not None:
            self.clock.now += self.read_cost_s
        if self.fail_reads:
            raise self.fail_reads.pop(0)
        return {"order_id": order_id, "status": self.output}

    def write(self, request_id: str, title: str) -> dict[str, Any]:
        if self.fail_writes:
            error, after = self.fail_writes.pop(0)
            if after:
                self.writes.append({"request_id": request_id, "title": title})
            raise error
        self.writes.append({"request_id": request_id, "title": title})
        return {"ticket": f"T-{len(self.writes)}"}

    def registry(
        self, *, approval: bool = False, dedup: bool = False, keyed: bool = True
    ) -> ToolRegistry:
        tools = ToolRegistry()
        tools.register(
            self.lookup,
            name="lookup",
            effect="read",
            schema={
                "type": "object",
                "required": ["order_id"],
                "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 80}},
            },
        )
        tools.register(
            self.write,
            name="write",
            effect="write",
            requires_approval=approval,
            idempotency_key=(lambda a: a["request_id"]) if keyed else None,
            dedup=dedup,
            schema={
                "type": "object",
                "required": ["request_id", "title"],
                "properties": {
                    "request_id": {"type": "string"},
                    "title": {"type": "string", "maxLength": 50},
                },
            },
        )
        tools.register(
            lambda: {"secret": 1}, name="admin", effect="read", schema={"type": "object"}
        )
        return tools


def make_runtime(
    script: list[Any],
    backend: Backend | None = None,
    *,
    allowed: tuple[str, ...] = ("lookup", "write"),
    approval: bool = False,
    dedup: bool = False,
    keyed: bool = True,
    clock: FakeClock | None = None,
    **options: Any,
) -> Runtime:
    backend = backend or Backend()
    clock = clock or FakeClock()
    backend.clock = clock
    options.setdefault("retry", RetryPolicy(max_attempts=2, backoff_s=0.5))
    return Runtime(
        model=ScriptedModel(script),
        tools=backend.registry(approval=approval, dedup=dedup, keyed=keyed),
        allowed_tools=allowed,
        clock=clock,
        sleep=clock.sleep,
        **options,
    )


def edges(result: Any) -> list[tuple[str, str, str]]:
    return [
        (e["trigger"], e["source"], e["dest"]) for e in result.events if e["type"] == "transition"
    ]


def assert_valid_run(result: Any) -> None:
    """What must hold after every run, whatever it did: a provider-valid history, a
    terminal status, and a trace the one checker (``fsm-agent check``) accepts."""
    assert result.status in STATES
    assert_history_valid(result)
    assert_trace_legal(result)
    assert result.events[-1]["type"] == "run_end"
    assert result.events[-1]["status"] == result.status


__all__ = [
    "Approval",
    "Backend",
    "Budget",
    "FakeClock",
    "RetryPolicy",
    "ToolRejected",
    "TransientToolError",
    "assert_valid_run",
    "call",
    "calls",
    "edges",
    "make_runtime",
    "say",
]


@pytest.fixture
def backend() -> Backend:
    return Backend()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A real PostgreSQL server for the session: ``FSM_AGENT_PG_DSN``, else a throwaway
    cluster from the installed binaries, else the test is skipped saying why."""

    from fsm_agent.testing import _pgserver as pgserver

    reason = pgserver.unavailable()
    if reason:
        pytest.skip(reason)
    server = pgserver.Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_schema(pg_server: Any) -> Iterator[str]:
    """A schema name of its own for one test (dropped afterwards)."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def pg_store(pg_server: Any, pg_schema: str) -> Iterator[Any]:
    from fsm_agent._durable.postgres import PostgresStore

    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        yield store


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each durable test runs against every store (PostgreSQL: a real server)."""
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "sqlite":
        with SqliteStore(tmp_path / "runs.db") as sqlite:
            yield sqlite
    else:
        yield request.getfixturevalue("pg_store")
