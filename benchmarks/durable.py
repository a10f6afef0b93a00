"""Durable runs: µs per tool round with SqliteStore next to the in-memory store.

The scenario of ``overhead.py`` (100 tool rounds, one read call per round, then an
answer) runs with (a) the default in-memory store and (b) ``SqliteStore`` on a fresh
file in a temporary directory (WAL, ``synchronous=NORMAL``, the WAL checkpointed on the
store's own thread): the reply's checkpoint rides with the next commit, and waits
behind more than one other only while the first is younger than 50 ms, so this
scenario's instant model commits about once in 32 read rounds (a model slower than
50 ms: every second round). The second line runs rounds whose
call is an idempotent write: one commit per round (its intent, carrying the reply's
checkpoint and the previous round's result, which rode behind). Both stores are measured
in the same process run, interleaved; the commits are counted from the statements the
store runs. Targets: ≤ 500 µs per tool round durable (issue "Durable runs"); ≤ 3× the
in-memory round with no more commits than the durability rules require (issue 18).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from orders import SCHEMA, lookup, record

from fsm_agent import Budget, MemoryStore, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._durable.sqlite import SqliteStore

ROUNDS = 100
REPEATS = 10
#: CPU µs per round of each run, in order (a loaded machine moves the wall clock of a
#: round that makes system calls more than that of one that makes none).
CPU: list[float] = []

TOOLS = ToolRegistry()
TOOLS.register(lookup, schema=SCHEMA, effect="read")
TOOLS.register(record, schema=SCHEMA, effect="write", idempotency_key=lambda args: args["order_id"])


def script(tool: str, tag: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call-{i}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({"order_id": f"{tag}{i}"})},
                }
            ],
        }
        for i in range(ROUNDS)
    ]
    steps.append({"role": "assistant", "content": "All orders are in transit."})
    return steps


def one_run(store: Any, tool: str, tag: str) -> float:
    """µs per tool round of one full run (run set-up included); the process's CPU time
    a round (all its threads) goes to ``CPU``."""
    steps = script(tool, tag)
    runtime = Runtime(
        model=ScriptedModel(steps),
        tools=TOOLS,
        allowed_tools={tool},
        store=store,
        budget=Budget(
            max_tool_rounds=ROUNDS,
            max_model_calls=ROUNDS + 1,
            max_total_calls=ROUNDS,
            max_calls_per_round=1,
        ),
    )
    start, cpu = time.perf_counter(), time.process_time()
    result = runtime.run("Where are my orders?")
    elapsed = (time.perf_counter() - start) / ROUNDS * 1e6
    CPU.append((time.process_time() - cpu) / ROUNDS * 1e6)
    assert result.status == "done", (result.status, result.reason)
    return elapsed


def commits_per_round(sqlite: SqliteStore, tool: str) -> float:
    """COMMITs a round, from the statements the store's connection runs: a run of
    ROUNDS rounds less one of 10, per round between them (the run's own commits, its
    creation and its end, cancel out)."""

    def commits(rounds: int) -> int:
        global ROUNDS
        statements: list[str] = []
        saved, ROUNDS = ROUNDS, rounds
        sqlite._conn.set_trace_callback(statements.append)
        try:
            one_run(sqlite, tool, f"c{rounds}-")
        finally:
            sqlite._conn.set_trace_callback(None)
            ROUNDS = saved
        return statements.count("COMMIT")

    return (commits(ROUNDS) - commits(10)) / (ROUNDS - 10)


def compare(memory: Any, sqlite: Any, tool: str) -> tuple[float, float, float, float]:
    """Median µs per round for each store, runs interleaved so both see the same load
    (the machine is shared), the best durable run, and the ratio of their median CPU
    time a round."""
    mem, dur, mem_cpu, dur_cpu = [], [], [], []
    for repeat in range(REPEATS):
        mem.append(one_run(memory, tool, f"m{repeat}-"))
        mem_cpu.append(CPU[-1])
        dur.append(one_run(sqlite, tool, f"s{repeat}-"))
        dur_cpu.append(CPU[-1])
    cpu = statistics.median(dur_cpu) / statistics.median(mem_cpu)
    return statistics.median(mem), statistics.median(dur), min(dur), cpu


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(Path(tmp) / "runs.db")
        memory = MemoryStore()
        compare(memory, sqlite, "lookup")  # warm caches, lazy imports and the WAL once
        rows = [
            ("read call ", *compare(memory, sqlite, "lookup")),
            ("write call", *compare(memory, sqlite, "record")),
        ]
        size = sum(f.stat().st_size for f in Path(tmp).iterdir())
        commits = [commits_per_round(sqlite, "lookup"), commits_per_round(sqlite, "record")]
        sqlite.close()
    print(
        f"durable runs: {ROUNDS} tool rounds x {REPEATS} runs per store, interleaved, "
        "median per round"
    )
    for (label, m, d, best, cpu), n in zip(rows, commits, strict=True):
        print(
            f"  {label} in-memory store {m:7.1f} µs/round   SqliteStore {d:7.1f} µs/round "
            f"(best run {best:5.0f})   ratio {d / m:4.2f}x (target ≤ 3x: "
            f"{'ok' if d <= 3 * m else 'MISSED'}; CPU time {cpu:4.2f}x)   "
            f"{n:.2f} commits/round   target ≤ 500 µs: {'ok' if d <= 500 else 'MISSED'}"
        )
    print(
        f"  database after {3 * REPEATS * ROUNDS} durable rounds: {size / 1e6:.1f} MB "
        "(WAL included)"
    )


if __name__ == "__main__":
    main()
