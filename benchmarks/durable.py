"""Durable runs: µs per tool round with SqliteStore next to the in-memory store.

The scenario of ``overhead.py`` (100 tool rounds, one read call per round, then an
answer) runs with (a) the default in-memory store and (b) ``SqliteStore`` on a fresh
file in a temporary directory (WAL, ``synchronous=NORMAL``), which checkpoints after
every transition: five transactions per round. A third line runs rounds whose call is an
idempotent write (intent and result records add two transactions per round). Both are
measured in the same process run. Target (issue "Durable runs"): ≤ 500 µs per tool round
durable.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fsm_agent import Budget, MemoryStore, Runtime, ScriptedModel, ToolRegistry
from fsm_agent.sqlite_store import SqliteStore

ROUNDS = 100
REPEATS = 10
SCHEMA = {"type": "object", "required": ["order_id"], "additionalProperties": False,
          "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 80}}}


def lookup(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "status": "in_transit"}


def record(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "recorded": True}


TOOLS = ToolRegistry()
TOOLS.register(lookup, schema=SCHEMA, effect="read")
TOOLS.register(record, schema=SCHEMA, effect="write",
               idempotency_key=lambda args: args["order_id"])


def script(tool: str, tag: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call-{i}", "type": "function",
             "function": {"name": tool, "arguments": json.dumps({"order_id": f"{tag}{i}"})}}]}
        for i in range(ROUNDS)]
    steps.append({"role": "assistant", "content": "All orders are in transit."})
    return steps


def per_round(store: Any, tool: str) -> float:
    """Median µs per tool round over REPEATS full runs (run set-up included)."""
    samples = []
    for repeat in range(REPEATS):
        steps = script(tool, f"{tool}-{repeat}-")
        runtime = Runtime(model=ScriptedModel(steps), tools=TOOLS, allowed_tools={tool},
                          store=store, budget=Budget(max_tool_rounds=ROUNDS,
                                                     max_model_calls=ROUNDS + 1,
                                                     max_total_calls=ROUNDS,
                                                     max_calls_per_round=1))
        start = time.perf_counter()
        result = runtime.run("Where are my orders?")
        samples.append((time.perf_counter() - start) / ROUNDS * 1e6)
        assert result.status == "done", (result.status, result.reason)
    return statistics.median(samples)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(Path(tmp) / "runs.db")
        memory = MemoryStore()
        per_round(memory, "lookup")  # warm caches and lazy imports once
        per_round(sqlite, "lookup")
        mem = per_round(memory, "lookup")
        dur = per_round(sqlite, "lookup")
        mem_w = per_round(memory, "record")
        dur_w = per_round(sqlite, "record")
        size = (Path(tmp) / "runs.db").stat().st_size + (Path(tmp) / "runs.db-wal").stat(
            ).st_size
        sqlite.close()
    print(f"durable runs: {ROUNDS} tool rounds x {REPEATS} runs, median per round")
    for label, m, d in (("read call ", mem, dur), ("write call", mem_w, dur_w)):
        print(f"  {label} in-memory store {m:8.1f} µs/round   SqliteStore {d:8.1f} µs/round   "
              f"ratio {d / m:5.2f}x   target ≤ 500 µs: {'ok' if d <= 500 else 'MISSED'}")
    print(f"  database after {4 * REPEATS * ROUNDS} durable rounds: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
