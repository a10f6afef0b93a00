"""Durable runs on PostgreSQL: one driver next to SqliteStore, the in-memory store and
LangGraph with its PostgreSQL checkpointer; a fleet of 1, 2 and 4 worker processes; and
how soon a worker claims a run after a reviewer's decision. All in one process run, so
the ratios compare like with like.

The scenario (``pg_app.py``): each round the model asks for a read and an idempotent
write at once; after ``ROUNDS`` rounds it answers. fsm-agent stores the write's intent
with the checkpoint before the write (the reply's and the read's events in it) and, in
the same round trip, the previous round's result, pipelined ahead of it: one round trip a
round (``pg_network.py`` counts them). LangGraph stores a checkpoint after the model
node and after the tool node, with the writes of each, committed before the next step
(``durability="sync"``; its default, "async", saves while the next step runs, and is
shown too). Both use the same throwaway server (from the installed binaries, or
``FSM_AGENT_PG_DSN``) with ``synchronous_commit=off``: a commit survives a crash of any
process, as SQLite's WAL with ``synchronous=NORMAL`` does; the last commits before a
power loss may be lost, for both. LangGraph is installed only for this
(``pip install -e '.[bench-langgraph]'``); without it its line says so.

Targets (issue "Scale out on PostgreSQL"): a durable round on PostgreSQL at least 3x
faster than LangGraph's on the same server; 4 workers at least 2.5x one worker until the
server's CPU is the limit; p99 claim latency after a review decision under 50 ms.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orders
import pg_app

from fsm_agent import MemoryStore, Runtime, ScriptedModel
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.review import record_review
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent.testing._pgserver import Server

#: LangGraph saving each step's checkpoint before the next step runs, as fsm-agent does
#: (``durability="sync"``: the comparison), and its default, which saves while the next
#: step runs (a crash may lose the last step's checkpoint).
LANGGRAPH = "LangGraph+PostgresSaver"
LANGGRAPH_ASYNC = "  (its default: async)"
ROUNDS = 20
RUNS = 5  # per store, interleaved
FLEET_RUNS = 240  # per fleet size
FLEET_ROUNDS = 5
LATENCY_SAMPLES = 100
SETTINGS = ("-c synchronous_commit=off",)
HERE = Path(__file__).resolve().parent


def script(tag: str) -> list[dict[str, Any]]:
    first = [{"role": "user", "content": pg_app.plan(tag, ROUNDS)}]
    steps = []
    history: list[dict[str, Any]] = list(first)
    for _ in range(ROUNDS + 1):
        reply = pg_app.model(history, [])
        steps.append(reply)
        history.append(reply)
    return steps


def fsm_round_us(store: Any, tag: str) -> float:
    runtime = Runtime(
        model=ScriptedModel(script(tag)),
        tools=pg_app.tools(),
        allowed_tools={"lookup", "record"},
        store=store,
        budget=pg_app.make_runtime(MemoryStore()).budget,
    )
    start = time.perf_counter()
    result = runtime.run(pg_app.plan(tag, ROUNDS))
    elapsed = time.perf_counter() - start
    assert result.status == "done", (result.status, result.reason, result.detail)
    return elapsed / ROUNDS * 1e6


def langgraph_app(dsn: str) -> Any:
    """The same scenario as a LangGraph graph (model node, ToolNode) with PostgresSaver;
    ``None`` where LangGraph is not installed."""
    try:
        from langchain_core.messages import AIMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition
        from psycopg import Connection
        from psycopg.rows import dict_row
    except ImportError:
        return None

    def look_up(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return orders.lookup(order_id)

    def keep_record(order_id: str) -> dict[str, Any]:
        """Record an order."""
        return orders.record(order_id)

    # (Wrapped, not decorated: without LangGraph installed mypy sees `tool` as untyped.)
    lookup = tool("lookup")(look_up)
    record = tool("record")(keep_record)

    def agent(state: MessagesState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        tag = json.loads(str(state["messages"][0].content))["tag"]
        if done >= ROUNDS:
            return {"messages": [AIMessage(content="All recorded.")]}
        calls = [
            {"name": name, "args": {"order_id": f"{tag}-{done}"}, "id": f"{name[0]}{done}"}
            for name in ("lookup", "record")
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup, record]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    conn = Connection.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(conn)
    saver.setup()
    _ = END
    return graph.compile(checkpointer=saver)


def langgraph_round_us(app: Any, tag: str, durability: str) -> float:
    config = {"configurable": {"thread_id": tag}, "recursion_limit": 4 * ROUNDS + 10}
    start = time.perf_counter()
    out = app.invoke(
        {"messages": [("user", pg_app.plan(tag, ROUNDS))]}, config, durability=durability
    )
    elapsed = time.perf_counter() - start
    assert out["messages"][-1].content == "All recorded."
    return elapsed / ROUNDS * 1e6


def one_driver(server: Server, tmp: Path) -> dict[str, float]:
    stores = {
        "in-memory": MemoryStore(),
        "SqliteStore": SqliteStore(tmp / "runs.db"),
        "PostgresStore": PostgresStore(server.dsn, schema="bench_one"),
    }
    graph = langgraph_app(server.dsn)
    times: dict[str, list[float]] = {name: [] for name in stores}
    if graph is not None:
        times[LANGGRAPH] = []
        times[LANGGRAPH_ASYNC] = []
    for repeat in range(RUNS + 1):  # the first round of each warms caches and imports
        for name, store in stores.items():
            t = fsm_round_us(store, f"{name[:2]}{repeat}-{uuid.uuid4().hex[:6]}")
            if repeat:
                times[name].append(t)
        if graph is not None:
            for name, durability in ((LANGGRAPH, "sync"), (LANGGRAPH_ASYNC, "async")):
                t = langgraph_round_us(
                    graph, f"{durability}{repeat}-{uuid.uuid4().hex[:6]}", durability
                )
                if repeat:
                    times[name].append(t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _worker(
    server: Server, schema: str, log: Path, concurrency: int = 8
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    cmd = [sys.executable, "-m", "fsm_agent", "worker", "--db", server.dsn, "--schema", schema,
           "--app", "pg_app:make_runtime", "--concurrency", str(concurrency),
           "--quiet"]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=60)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (and their reaped children)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / tick


def _server_pids() -> list[int]:
    """The PostgreSQL server's processes (the postmaster's reaped backends count in its
    children's times)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm", encoding="ascii") as handle:
                    if handle.read().strip() == "postgres":
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _claimed_any(store: PostgresStore, schema: str) -> bool:
    with store.connection() as conn:
        sql = f"SELECT 1 FROM {schema}.runs WHERE claimed_at IS NOT NULL LIMIT 1"
        return conn.execute(sql).fetchone() is not None


def fleet(server: Server, workers: int, tmp: Path) -> tuple[float, float, float]:
    """Durable rounds per second with ``workers`` processes draining a queue, and the
    cores the server and the workers kept busy meanwhile."""
    schema = f"bench_fleet{workers}"
    store = PostgresStore(server.dsn, schema=schema)
    submitter = pg_app.make_runtime(store)
    for i in range(FLEET_RUNS):
        submitter.submit(pg_app.plan(f"f{workers}-{i}", FLEET_ROUNDS), run_id=f"f{workers}-{i}")
    procs = [_worker(server, schema, tmp / f"fleet{workers}.log") for _ in range(workers)]
    try:
        deadline = time.monotonic() + 300
        while not _claimed_any(store, schema):
            time.sleep(0.01)  # (the workers are starting: imports are not the workload)
        started = time.monotonic()
        cpu = (_cpu_seconds(_server_pids()), _cpu_seconds([p.pid for p in procs]))
        while len(store.list_runs("done")) < FLEET_RUNS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet of {workers} did not finish; see {tmp}")
            time.sleep(0.05)
        busy = time.monotonic() - started
        server_cores = (_cpu_seconds(_server_pids()) - cpu[0]) / busy
        worker_cores = (_cpu_seconds([p.pid for p in procs]) - cpu[1]) / busy
    finally:
        _stop(procs)
    with store.connection() as conn:
        (window,) = conn.execute(
            f"SELECT extract(epoch FROM max(updated) - min(claimed_at))::float8 FROM {schema}.runs"
        ).fetchone()
    store.close()
    return FLEET_RUNS * FLEET_ROUNDS / float(window), server_cores, worker_cores


def claim_latency(server: Server, tmp: Path) -> list[float]:
    """Seconds from a reviewer's approval to a worker's claim of the run (one idle worker
    listening), one decision at a time."""
    schema = "bench_review"
    store = PostgresStore(server.dsn, schema=schema)
    submitter = pg_app.make_runtime(store)
    for i in range(LATENCY_SAMPLES):
        submitter.submit(pg_app.plan(f"a{i}", 1, approval=True), run_id=f"a{i}")
    procs = [_worker(server, schema, tmp / "latency.log", concurrency=4)]
    waits = []
    try:
        deadline = time.monotonic() + 120
        while len(store.list_runs("review_required")) < LATENCY_SAMPLES:
            assert time.monotonic() < deadline, "runs did not reach review"
            time.sleep(0.1)
        time.sleep(1.0)  # the worker is idle, listening
        for i in range(LATENCY_SAMPLES):
            decided = time.time()
            record_review(store, f"a{i}", "a0", "approve")
            while True:
                with store.connection() as conn:
                    row = conn.execute(
                        f"SELECT extract(epoch FROM claimed_at)::float8 FROM {schema}.runs "
                        "WHERE run_id = %s AND claimed_at > to_timestamp(%s)",
                        [f"a{i}", decided],
                    ).fetchone()
                if row is not None:
                    waits.append(row[0] - decided)
                    break
                time.sleep(0.001)
    finally:
        _stop(procs)
        store.close()
    return sorted(waits)


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so the throwaway server is stopped and deleted


def main() -> None:
    signal.signal(signal.SIGTERM, _terminated)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = Server.start(SETTINGS)
        try:
            one = one_driver(server, tmp)
            fleets = {n: fleet(server, n, tmp) for n in (1, 2, 4)}
            waits = claim_latency(server, tmp)
        finally:
            server.stop()
    pg = one["PostgresStore"]
    print(
        f"PostgreSQL: one driver, {ROUNDS} rounds of 2 calls (a read, an idempotent write) "
        f"x {RUNS} runs per store, interleaved, median per round (cores: {os.cpu_count()})"
    )
    for name, us in one.items():
        print(
            f"  {name:<24} {us:8.0f} µs/round  {1e6 / us:7.0f} rounds/s   "
            f"{us / pg:5.2f}x PostgresStore's time"
        )
    lg = one.get(LANGGRAPH)
    if lg is None:
        print("  LangGraph: not installed (pip install -e '.[bench-langgraph]')")
    else:
        print(
            f"  durable round on PostgreSQL: {lg / pg:.1f}x faster than LangGraph's on the same "
            f"server (both committing each step before the next)   target ≥ 3x: "
            f"{'ok' if lg / pg >= 3 else 'MISSED'}"
        )
    base = fleets[1][0]
    print(
        f"fleet: {FLEET_RUNS} runs of {FLEET_ROUNDS} rounds per fleet size; worker processes "
        "driving 8 runs at once each"
    )
    for n, (rate, server_cores, worker_cores) in fleets.items():
        print(
            f"  {n} worker(s) {rate:7.0f} rounds/s   {rate / base:4.2f}x one worker   cores busy: "
            f"server {server_cores:.2f}, workers {worker_cores:.2f} (of {os.cpu_count()})"
        )
    four = fleets[4][0] / base
    print(
        f"  4 workers vs 1: {four:.2f}x   target ≥ 2.5x until the server's CPU is the limit: "
        f"{'ok' if four >= 2.5 else 'MISSED'} (server and workers share this machine's "
        f"{os.cpu_count()} cores with everything else running on it)"
    )
    p50, p99 = waits[len(waits) // 2], waits[max(int(len(waits) * 0.99) - 1, 0)]
    print(
        f"claim after a review decision ({len(waits)} approvals, LISTEN/NOTIFY, loopback): "
        f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {waits[-1] * 1e3:.1f} ms   "
        f"target p99 < 50 ms: {'ok' if p99 < 0.05 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
