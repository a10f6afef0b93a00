"""The scenario the durable-run tests drive, shared by the test process and the child
process the crash tests kill (``durable_child.py``).

One run: a read and an idempotent write in the first batch, a write without an
idempotency key in the second, then an answer. Every write's side effect is counted in
its own SQLite file, outside the store, so a test can tell how many really happened.
The model decides from the history alone, so a fresh process can resume the run.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from fsm_agent import Interceptor, Runtime, ToolRegistry
from fsm_agent._core.events import Event, Transitioned
from fsm_agent._durable.sqlite import SqliteStore

TOOLS = {"lookup", "create_ticket", "notify"}


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


DECISIONS: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            call("c1", "lookup", {"order_id": "A17"}),
            call("c2", "create_ticket", {"request_id": "R-1", "title": "A17 is late"}),
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("c3", "notify", {"text": "ticket filed"})],
    },
    {"role": "assistant", "content": "Filed ticket R-1 and notified the customer."},
]


def model(messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> Any:
    """Decides from how many decisions the history already holds (no hidden state).
    ``FSM_MODEL_SLEEP`` makes its first answer slow, so a concurrent resume finds the run
    claimed."""
    asked = sum(1 for m in messages if m.get("role") == "assistant")
    if asked == 0:
        time.sleep(float(os.environ.get("FSM_MODEL_SLEEP", "0")))
    return DECISIONS[asked]


def effects(path: Path) -> list[tuple[str, str]]:
    """The side effects that really happened: (tool, argument) rows."""
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return [tuple(r) for r in db.execute("SELECT tool, arg FROM effects ORDER BY rowid")]


def _crash_point() -> tuple[str, int]:
    kind, _, n = os.environ.get("FSM_CRASH", "").partition(":")
    return kind, int(n or 0)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def make_tools(effects_path: Path) -> ToolRegistry:
    crash, _ = _crash_point()
    tools = ToolRegistry()

    def effect(tool: str, arg: str) -> None:
        if crash == f"{tool}_before":
            _die()
        with sqlite3.connect(effects_path, isolation_level=None) as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects (tool TEXT, arg TEXT)")
            db.execute("INSERT INTO effects VALUES (?, ?)", (tool, arg))
        if crash == f"{tool}_after":
            _die()

    @tools.tool(
        schema={
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
        effect="read",
    )
    def lookup(order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "status": "late"}

    @tools.tool(
        schema={
            "type": "object",
            "properties": {"request_id": {"type": "string"}, "title": {"type": "string"}},
            "required": ["request_id", "title"],
        },
        effect="write",
        idempotency_key=lambda a: a["request_id"],
    )
    def create_ticket(request_id: str, title: str) -> dict[str, Any]:
        effect("create_ticket", request_id)
        return {"ticket": request_id}

    @tools.tool(
        schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        effect="write",
    )
    def notify(text: str) -> dict[str, Any]:
        effect("notify", text)
        return {"sent": True}

    return tools


class CrashingStore(SqliteStore):
    """Dies (SIGKILL) right after the N-th checkpoint commits, or just before an
    idempotency intent is written, as ``FSM_CRASH`` says. (Every transaction that
    commits a checkpoint of its own — a save, the last save that lets the claim go, a
    checkpoint behind that could wait no longer — goes through ``_checkpoint``.)"""

    saves = 0

    def _checkpoint(self, *args: Any, **kwargs: Any) -> None:
        super()._checkpoint(*args, **kwargs)
        self.saves += 1
        kind, n = _crash_point()
        if kind == "save" and self.saves == n:
            _die()

    def begin_intent(self, record: Any, **options: Any) -> Any:
        if _crash_point()[0] == "begin":
            _die()
        return super().begin_intent(record, **options)


class TransitionCrash(Interceptor):
    """``FSM_CRASH=transition:N``: die at the N-th transition, before it is saved (its
    event reaches the interceptors before its checkpoint is written)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def on_event(self, event: Event) -> None:
        if isinstance(event, Transitioned):
            self.seen += 1
            if self.seen == self.n:
                _die()


def crash_interceptors() -> list[Interceptor]:
    kind, n = _crash_point()
    return [TransitionCrash(n)] if kind == "transition" else []


def runtime(store: SqliteStore, effects_path: Path) -> Runtime:
    return Runtime(model=model, tools=make_tools(effects_path), allowed_tools=TOOLS, store=store,
                   interceptors=crash_interceptors())  # fmt: skip
