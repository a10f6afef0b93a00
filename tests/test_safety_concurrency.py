"""Exactly once under races (R11): runs racing on one idempotency key never both run it.

Two (or more) runs ask for the same write, with the same key and arguments, at the same
time: through one store object shared by threads, through several store objects on one
SQLite file, from several processes, and from asyncio tasks. An independent ledger (the
tool's own log: a list, or a SQLite file written outside fsm-agent) counts how often each
key really took effect. Whatever the interleaving — the thread switch interval is lowered
to force many — each key takes effect exactly once, and every run ends ``done`` (it ran
the write or replayed it) or ``review_required/outcome_unknown`` (the other run's write
was still in flight), never silently twice.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import MemoryStore, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._durable.sqlite import SqliteStore

KEYS = 150  # trials per variant: one key each, raced by every worker
SCHEMA = {"type": "object", "required": ["key"], "properties": {"key": {"type": "string"}}}


@contextmanager
def switch_often() -> Iterator[None]:
    """Make the interpreter switch threads every microsecond: races show up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def tools(ledger: Callable[[str], None]) -> ToolRegistry:
    registry = ToolRegistry()

    def pay(key: str) -> dict[str, Any]:
        ledger(key)
        time.sleep(0.0005)  # the write takes a moment: the other run can start meanwhile
        return {"paid": key}

    registry.register(
        pay, name="pay", effect="write", idempotency_key=lambda a: a["key"], schema=SCHEMA
    )
    return registry


def script(key: str) -> list[dict[str, Any]]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "pay", "arguments": json.dumps({"key": key})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "Paid."},
    ]


def race(runtimes: list[Runtime], worker_name: str) -> list[tuple[str, str]]:
    """Every runtime runs a run per key, all at once (one thread each); the outcomes."""
    outcomes: list[tuple[str, str]] = []
    lock = threading.Lock()
    go = threading.Barrier(len(runtimes))

    def work(n: int, rt: Runtime) -> None:
        go.wait()
        for k in range(KEYS):
            result = rt.run(
                "pay", run_id=f"{worker_name}-{n}-{k}", model=ScriptedModel(script(f"K{k}"))
            )
            with lock:
                outcomes.append((result.status, result.reason))

    threads = [threading.Thread(target=work, args=(n, rt)) for n, rt in enumerate(runtimes)]
    with switch_often():
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    return outcomes


def assert_once(ledger: list[str], outcomes: list[tuple[str, str]], workers: int) -> None:
    counts = Counter(ledger)
    assert len(counts) == KEYS, "every key was written"
    assert set(counts.values()) == {1}, [k for k, n in counts.items() if n > 1]
    assert len(outcomes) == KEYS * workers
    assert set(outcomes) <= {("done", "final_answer"), ("review_required", "outcome_unknown")}


def _runtime(store: Any, ledger: Callable[[str], None]) -> Runtime:
    return Runtime(model=ScriptedModel([]), tools=tools(ledger), allowed_tools={"pay"}, store=store)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_threads_sharing_one_store_object(tmp_path: Path, kind: str) -> None:
    ledger: list[str] = []
    store: Any = (
        MemoryStore(max_runs=10_000) if kind == "memory" else SqliteStore(tmp_path / "runs.db")
    )
    outcomes = race([_runtime(store, ledger.append) for _ in range(3)], kind)
    assert_once(ledger, outcomes, 3)


def test_several_store_objects_on_one_file(tmp_path: Path) -> None:
    ledger: list[str] = []
    stores = [SqliteStore(tmp_path / "runs.db", timeout=30) for _ in range(3)]
    outcomes = race([_runtime(s, ledger.append) for s in stores], "files")
    assert_once(ledger, outcomes, 3)


def test_asyncio_tasks_sharing_a_store() -> None:
    ledger: list[str] = []
    store = MemoryStore(max_runs=10_000)

    async def pay(key: str) -> dict[str, Any]:
        ledger.append(key)
        await asyncio.sleep(0)  # let the other task in while the write is in flight
        return {"paid": key}

    registry = ToolRegistry()
    registry.register(
        pay, name="pay", effect="write", idempotency_key=lambda a: a["key"], schema=SCHEMA
    )
    rt = Runtime(model=ScriptedModel([]), tools=registry, allowed_tools={"pay"}, store=store)

    async def main() -> list[Any]:
        runs = [
            rt.arun("pay", run_id=f"a-{n}-{k}", model=ScriptedModel(script(f"K{k}")))
            for k in range(KEYS)
            for n in range(3)
        ]
        return list(await asyncio.gather(*runs))

    results = asyncio.run(main())
    assert_once(ledger, [(r.status, r.reason) for r in results], 3)


WORKER = """
import json, sqlite3, sys, time
from fsm_agent import Runtime, ScriptedModel, ToolRegistry
from fsm_agent._durable.sqlite import SqliteStore
db, ledger, name, keys = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.setswitchinterval(1e-6)

def pay(key):
    with sqlite3.connect(ledger, timeout=30, isolation_level=None) as c:
        c.execute("INSERT INTO paid VALUES (?, ?)", (key, name))
    time.sleep(0.0005)
    return {"paid": key}

tools = ToolRegistry()
schema = {"type": "object", "required": ["key"], "properties": {"key": {"type": "string"}}}
tools.register(pay, name="pay", effect="write", idempotency_key=lambda a: a["key"],
               schema=schema)
rt = Runtime(model=ScriptedModel([]), tools=tools, allowed_tools={"pay"},
             store=SqliteStore(db, timeout=30))
out = []
for k in range(keys):
    arguments = json.dumps({"key": f"K{k}"})
    call = {"id": "c1", "type": "function", "function": {"name": "pay", "arguments": arguments}}
    model = ScriptedModel([{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "assistant", "content": "Paid."}])
    r = rt.run("pay", run_id=f"{name}-{k}", model=model)
    out.append([r.status, r.reason])
print(json.dumps(out))
"""


def test_several_processes_on_one_file(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    with sqlite3.connect(ledger) as c:
        c.execute("CREATE TABLE paid (key TEXT, worker TEXT)")
    SqliteStore(tmp_path / "runs.db").close()  # created once, so the workers race on runs
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(tmp_path / "runs.db"),
                str(ledger),
                f"p{n}",
                str(KEYS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    outcomes: list[tuple[str, str]] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outcomes += [tuple(x) for x in json.loads(out)]
    with sqlite3.connect(ledger) as c:
        paid = [k for (k,) in c.execute("SELECT key FROM paid")]
    assert_once(paid, outcomes, 3)
