"""The review server's change feed: time from a review committed to the store to every
SSE subscriber of that run receiving its ``review`` event, on loopback.

For each round a run is paused (a write waiting for approval), ``N`` subscribers open its
event stream and read what is there, then a review is recorded straight into the store
(``durable/review.record``, another connection than the server's watch); the clock
stops at each subscriber when the ``review`` event arrives. Prints p50/p99 per store and
subscriber count, and the server's peak resident memory. Usage:

    python benchmarks/server_latency.py [--subscribers 1,100] [--rounds 20] [--pg DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx
from conftest import Backend, call, calls, make_runtime, say
from server_harness import LiveServer

from fsm_agent.durable.feed import make_key
from fsm_agent.durable.review import record
from fsm_agent.durable.sqlite import SqliteStore


async def _subscriber(
    url: str, key: str, run_id: str, ready: asyncio.Event, got: list[float], n: int
) -> None:
    headers = {"authorization": f"Bearer {key}", "accept": "text/event-stream"}
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as c,
        c.stream("GET", f"/api/runs/{run_id}/events", headers=headers) as r,
    ):
        seen = 0
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                seen += 1
                if line == "event: review":
                    got.append(time.perf_counter())
                    return
                if seen == n:
                    ready.set()


async def _round(url: str, key: str, store: Any, run_id: str, subs: int) -> list[float]:
    n = len(store.load_run(run_id).events)
    got: list[float] = []
    readies = [asyncio.Event() for _ in range(subs)]
    tasks = [asyncio.create_task(_subscriber(url, key, run_id, ready, got, n)) for ready in readies]
    await asyncio.gather(*(r.wait() for r in readies))
    committed: list[float] = []

    def decide() -> None:
        record(store, run_id, "c1", "approve", reviewer="bench")
        committed.append(time.perf_counter())

    thread = threading.Thread(target=decide)
    start = time.perf_counter()
    thread.start()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    thread.join()
    # the commit ends inside record(); the time it returns bounds it from above
    return [max(t - start, 0.0) * 1000 for t in got]


def _measure(store: Any, subs: int, rounds: int) -> list[float]:
    key, rec = make_key(f"bench{subs}{time.time_ns()}", "read")
    store.add_key(rec)
    live = LiveServer(store).start()
    latencies: list[float] = []
    try:
        for i in range(rounds):
            run_id = f"b{subs}-{i}-{time.time_ns()}"
            rt = make_runtime(
                [calls(call("c1", "write", request_id="R", title="t")), say("ok")],
                Backend(),
                store=store,
                approval=True,
            )
            rt.run("go", run_id=run_id)
            latencies += asyncio.run(_round(live.url, key, store, run_id, subs))
    finally:
        live.stop()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", default="1,100")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pg", help="a PostgreSQL DSN (else only SQLite)")
    args = parser.parse_args()
    stores: list[tuple[str, Any]] = []
    folder = Path(tempfile.mkdtemp())
    stores.append(("sqlite", SqliteStore(folder / "bench.db")))
    if args.pg:
        from fsm_agent.durable.postgres import PostgresStore

        stores.append(("postgres", PostgresStore(args.pg, schema="bench_server", pool_size=16)))
    for name, store in stores:
        for subs in (int(s) for s in args.subscribers.split(",")):
            ms = sorted(_measure(store, subs, args.rounds))
            p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
            row = {"store": name, "subscribers": subs, "samples": len(ms)}
            row |= {"p50_ms": round(statistics.median(ms), 1), "p99_ms": round(p99, 1)}
            print(json.dumps(row))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_rss_mib (server and clients, one process)": round(peak, 1)}))


if __name__ == "__main__":
    main()
