"""The review server's change feed: time from a review committed to the store to every
SSE subscriber of that run receiving its ``review`` event, on loopback.

The server is ``fsm-agent serve`` in a process of its own (so its memory is its own);
the subscribers (a socket each, read as the bytes come) and the reviewer are this
process. For each round a run is paused (a
write waiting for approval), ``N`` subscribers open its event stream and read what is
there, then a review is recorded straight into the store (``durable/review.record``,
another connection than the server's watch); the clock stops at each subscriber when
the ``review`` event arrives. A subscriber the server refuses fails the round at once
(no waiting forever). Prints p50/p99 per store and subscriber count, the server's
resident memory with the subscribers connected, the server's CPU time per round (median:
the review's delivery to every subscriber, a measure of the work that a loaded machine
delays but does not inflate), and reviews per second over HTTP (sequential, one client). Usage:

    python benchmarks/server_latency.py [--subscribers 1,100,500] [--rounds 10]
        [--stores sqlite,postgres] [--pg DSN | --pg auto]

``--pg auto`` starts a throwaway PostgreSQL cluster (``fsm_agent/testing/_pgserver.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402 (after the path insert)
from conftest import Backend, call, calls, make_runtime, say  # noqa: E402 (after the path insert)

from fsm_agent._durable.feed import make_key  # noqa: E402 (after the path insert)
from fsm_agent._durable.review import record  # noqa: E402 (after the path insert)
from fsm_agent._durable.sqlite import SqliteStore  # noqa: E402 (after the path insert)


class Refused(Exception):
    """A subscriber's stream was not opened (the round is void)."""


async def _subscriber(
    port: int, key: str, run_id: str, ready: asyncio.Event, got: list[float], n: int
) -> None:
    """One SSE stream read straight off its socket: an HTTP client library parsing 500
    streams in one Python process measures itself (httpx: p99 over a second at 500,
    against about 110 ms for the same server read like this)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET /api/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        status = await reader.readline()
        if b" 200 " not in status:
            raise Refused(f"{status.decode(errors='replace').strip()}")
        seen = 0
        while line := await reader.readline():
            if line.startswith(b"event: "):
                seen += 1
                if line.rstrip() == b"event: review":
                    got.append(time.perf_counter())
                    return
                if seen == n:
                    ready.set()
        raise Refused("the stream ended before the review")
    finally:
        writer.close()


async def _round(
    port: int, key: str, store: Any, run_id: str, subs: int, pid: int
) -> tuple[list[float], float, float]:
    n = len(store.load_run(run_id).events)
    got: list[float] = []
    readies = [asyncio.Event() for _ in range(subs)]
    tasks = [asyncio.create_task(_subscriber(port, key, run_id, e, got, n)) for e in readies]
    waiting = asyncio.ensure_future(asyncio.gather(*(r.wait() for r in readies)))
    # A subscriber that ends before the review (refused, cut) fails the round at once.
    deadline = time.monotonic() + 120
    pending: set[asyncio.Future[Any]] = {waiting, *tasks}
    while not waiting.done():
        done, pending = await asyncio.wait(
            pending, timeout=deadline - time.monotonic(), return_when=asyncio.FIRST_COMPLETED
        )
        ended = [t for t in done if t is not waiting]
        if ended or not done:
            waiting.cancel()
            for task in tasks:
                task.cancel()
            reason = (ended[0].exception() or "ended early") if ended else "timed out (120 s)"
            raise Refused(f"a subscriber of {subs} failed before the review: {reason}")
    rss = _rss_mib(pid)

    def decide() -> None:
        record(store, run_id, "c1", "approve", reviewer="bench")

    thread = threading.Thread(target=decide)
    cpu = _cpu_ms(pid)
    start = time.perf_counter()
    thread.start()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    cpu = _cpu_ms(pid) - cpu
    thread.join()
    return [max(t - start, 0.0) * 1000 for t in got], rss, cpu


def _cpu_ms(pid: int) -> float:
    """The server's CPU time so far (user + system): the work a round costs it, which a
    loaded machine delays but does not inflate, unlike the latencies."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(db: list[str]) -> Iterator[tuple[str, int]]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsm_agent", "serve", *db, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server did not start: {proc.stderr and proc.stderr.read()}"
                )
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        errors = [
            line for line in (err or "").splitlines() if "Traceback" in line or "ERROR" in line
        ]
        if errors:
            print(f"the server logged {len(errors)} errors, e.g. {errors[0]}", file=sys.stderr)


def _paused(store: Any, run_id: str) -> None:
    rt = make_runtime(
        [calls(call("c1", "write", request_id="R", title="t")), say("ok")],
        Backend(),
        store=store,
        approval=True,
    )
    rt.run("go", run_id=run_id)


def _measure(
    store: Any, db: list[str], subs: int, rounds: int
) -> tuple[list[float], float, list[float]]:
    key, rec = make_key(f"bench{subs}{time.time_ns()}", "read")
    store.add_key(rec)
    latencies: list[float] = []
    cpu: list[float] = []
    peak = 0.0
    with _server(db) as (url, pid):
        for i in range(rounds):
            run_id = f"b{subs}-{i}-{time.time_ns()}"
            _paused(store, run_id)
            port = int(url.rsplit(":", 1)[1])
            ms, rss, used = asyncio.run(_round(port, key, store, run_id, subs, pid))
            latencies += ms
            cpu.append(used)
            peak = max(peak, rss)
    return latencies, peak, cpu


def _reviews_per_second(store: Any, db: list[str], count: int) -> float:
    """Reviews recorded over HTTP, one after another by one client, per second."""
    key, rec = make_key(f"reviewer{time.time_ns()}", "review")
    store.add_key(rec)
    ids = [f"rps-{i}-{time.time_ns()}" for i in range(count)]
    for run_id in ids:
        _paused(store, run_id)
    with (
        _server(db) as (url, _),
        httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c,
    ):
        start = time.perf_counter()
        for run_id in ids:
            r = c.post(f"/api/runs/{run_id}/reviews", json={"call_id": "c1", "action": "approve"})
            assert r.status_code == 201, r.text
        return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", default="1,100,500")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--pg", default="auto", help="a PostgreSQL DSN, or auto (throwaway)")
    parser.add_argument("--reviews", type=int, default=200, help="reviews for reviews/s")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        stores: list[tuple[str, Any, list[str]]] = []
        if "sqlite" in args.stores:
            path = Path(tempfile.mkdtemp()) / "bench.db"
            stores.append(("sqlite", stack.enter_context(SqliteStore(path)), ["--db", str(path)]))
        if "postgres" in args.stores:
            from fsm_agent._durable.postgres import PostgresStore

            dsn = args.pg
            if dsn == "auto":
                from fsm_agent.testing._pgserver import pg_server

                dsn = stack.enter_context(pg_server()).dsn
            schema = f"bench_server_{os.getpid()}"
            store = PostgresStore(dsn, schema=schema, pool_size=4)
            stack.callback(store.close)
            stores.append(("postgres", store, ["--db", dsn, "--schema", schema]))
        for name, store, db in stores:
            for subs in (int(s) for s in args.subscribers.split(",")):
                ms, rss, cpu = _measure(store, db, subs, args.rounds)
                ms.sort()
                p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
                row = {"store": name, "subscribers": subs, "samples": len(ms)}
                row |= {"p50_ms": round(statistics.median(ms), 1), "p99_ms": round(p99, 1)}
                row["server_cpu_ms"] = round(statistics.median(cpu), 1)
                row["server_rss_mib"] = round(rss, 1)
                print(json.dumps(row), flush=True)
            if args.reviews:
                rps = _reviews_per_second(store, db, args.reviews)
                print(json.dumps({"store": name, "reviews_per_s": round(rps, 1)}), flush=True)


if __name__ == "__main__":
    main()
