"""The server's one watch for every stream: waiters wake on a commit, time out quietly,
and a waiter cancelled mid-wait (a client that went away) breaks nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._durable.memory import MemoryStore
from fsm_agent.server._broadcast import Broadcaster


def test_waiters_wake_time_out_and_survive_cancellation() -> None:
    store = MemoryStore()

    async def main() -> None:
        b = Broadcaster(store, idle_s=0.05)
        await b.start()
        try:
            seen = b.generation
            for _ in range(20):  # timeouts, over and over
                assert await b.wait(seen, 0.005) == seen
            waiters = [asyncio.create_task(b.wait(seen, 10.0)) for _ in range(50)]
            await asyncio.sleep(0.05)
            for w in waiters[:25]:  # clients that went away
                w.cancel()
            rt = make_runtime(
                [calls(call("c1", "write", request_id="R", title="t")), say("ok")],
                Backend(),
                store=store,
                approval=True,
            )
            await asyncio.to_thread(rt.run, "go", run_id="r1")
            woke = await asyncio.wait_for(asyncio.gather(*waiters[25:]), 5.0)
            assert all(g > seen for g in woke)
            assert all(w.cancelled() for w in waiters[:25])
        finally:
            b.stop()

    asyncio.run(main())


class _SmallPool(MemoryStore):
    """A store with the pool of a small PostgreSQL store: ``pool_size`` connections, a
    key read that takes a while (a loaded database), and a count of how many reads run
    at once and in all."""

    pool_size = 2

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.reads = self.busy = self.most = 0
        self._count = threading.Lock()

    def get_key(self, key_id: str) -> Any:
        import time

        with self._count:
            self.reads += 1
            self.busy += 1
            self.most = max(self.most, self.busy)
        try:
            time.sleep(0.05)
            return super().get_key(key_id)
        finally:
            with self._count:
                self.busy -= 1


def test_a_burst_of_streams_shares_key_reads_and_stays_within_the_pool() -> None:
    """500 SSE subscribers opening at once hung the PostgreSQL benchmark: every request
    read its key on a thread of its own, more at once than the pool had connections, and
    the pool's wait timed out (a 500 for a stream that only had to wait). Now requests
    share the read in flight and queue for a connection on the event loop."""
    import httpx
    from server_harness import LiveServer

    from fsm_agent._durable.feed import make_key

    store = _SmallPool()
    rt = make_runtime([calls(call("c1", "write", request_id="R", title="t")), say("ok")],
                      Backend(), store=store, approval=True)  # fmt: skip
    rt.run("go", run_id="r1")
    key, record = make_key("bench", "read")
    store.add_key(record)
    live = LiveServer(store).start()

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=100)
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=live.url, limits=limits, headers=headers) as c:
            answers = await asyncio.gather(*(c.get("/api/runs/r1") for _ in range(60)))
        return [r.status_code for r in answers]

    try:
        codes = asyncio.run(burst())
    finally:
        live.stop()
    assert codes == [200] * 60
    assert store.most <= store.pool_size  # never more reads at once than connections
    assert store.reads < 30  # shared: far fewer reads than requests


def test_a_store_outage_during_sign_in_is_a_json_503() -> None:
    import httpx
    from server_harness import LiveServer

    from fsm_agent._durable.feed import make_key
    from fsm_agent._errors import StoreError

    store = MemoryStore()
    key, record = make_key("ana", "read")
    store.add_key(record)

    def down(key_id: str) -> Any:
        raise StoreError("postgresql://db: no connection within 5s (every connection is busy)")

    store.get_key = down  # type: ignore[method-assign]
    live = LiveServer(store).start()
    try:
        r = httpx.get(live.url + "/api/runs", headers={"authorization": f"Bearer {key}"})
    finally:
        live.stop()
    assert r.status_code == 503 and r.json()["error"] == "store_unavailable"
    assert "every connection is busy" in r.json()["detail"]


async def _until(condition: Any, timeout: float = 10.0) -> None:
    """Wait until ``condition()`` holds (a loaded machine delays a wake-up)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


async def _settled(value: Any, quiet_s: float = 0.5) -> None:
    """Wait until ``value()`` has not changed for ``quiet_s`` seconds."""
    import time

    deadline, last = time.monotonic() + 10.0, value()
    since = time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "never settled"
        await asyncio.sleep(0.02)
        now = value()
        if now != last:
            last, since = now, time.monotonic()


class _Counting(MemoryStore):
    """A store that counts the reads of each run: events and whole-run loads."""

    def __init__(self) -> None:
        super().__init__()
        from collections import Counter

        self.loads: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()

    def load_run(self, run_id: str) -> Any:
        self.loads[run_id] += 1
        return super().load_run(run_id)

    def events_since(self, run_id: str, seq: int, limit: int = 1000) -> Any:
        self.reads[run_id] += 1
        return super().events_since(run_id, seq, limit)


async def _subscribe(
    port: int, key: str, run_id: str, replayed: asyncio.Event, n: int
) -> list[str]:
    """One SSE stream read off its socket: set ``replayed`` after ``n`` events, return
    the types of the events after them, up to a ``review``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET /api/runs/{run_id}/events HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        seen, after = 0, []
        while line := await reader.readline():
            if line.startswith(b"event: "):
                seen += 1
                if seen > n:
                    after.append(line.decode().split(": ", 1)[1].strip())
                    if after[-1] == "review":
                        return after
                if seen == n:
                    replayed.set()
        return [*after, "(the stream ended)"]
    finally:
        writer.close()


def test_streams_share_one_read_per_commit_and_do_not_reload_a_waiting_run() -> None:
    """Every commit anywhere woke each run's streams into an events read and a load of
    the whole run (its history, its checkpoint: for nothing, the run had not moved).
    Now a commit costs a waiting run's streams one shared events read, and the run's
    state is read only after the replay and after a ``run_end``."""
    from server_harness import LiveServer

    from fsm_agent._durable.feed import make_key
    from fsm_agent._durable.review import record

    store = _Counting()
    paused = [calls(call("c1", "write", request_id="R", title="t")), say("ok")]
    make_runtime(paused, Backend(), store=store, approval=True).run("go", run_id="r1")
    n = len(store.load_run("r1").events)
    key, rec = make_key("reader", "read")
    store.add_key(rec)
    live = LiveServer(store).start()
    server = live.app.app.state.server

    async def main() -> list[list[str]]:
        readies = [asyncio.Event() for _ in range(20)]
        streams = [asyncio.create_task(_subscribe(live.port, key, "r1", e, n)) for e in readies]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in readies)), 10)
        # (every stream has read the state after its replay, and waits)
        await _settled(lambda: (store.loads["r1"], store.reads["r1"]))
        loads, reads, generation = (
            store.loads["r1"],
            store.reads["r1"],
            server.broadcaster.generation,
        )
        for i in range(3):  # other runs commit, over and over
            rt = make_runtime(paused, Backend(), store=store, approval=True)
            await asyncio.to_thread(rt.run, "go", run_id=f"other{i}")
        await _until(lambda: server.broadcaster.generation > generation)  # (seen)
        await asyncio.sleep(0.3)  # (and any read they started is done)
        generations = server.broadcaster.generation - generation
        assert store.loads["r1"] == loads, "streams of a waiting run reloaded it"
        assert store.reads["r1"] - reads <= generations, "streams read r1 apart"
        await asyncio.to_thread(record, store, "r1", "c1", "approve", reviewer="ana")
        return await asyncio.wait_for(asyncio.gather(*streams), 10)

    try:
        got = asyncio.run(main())
    finally:
        live.stop()
    assert got == [["transition", "review"]] * 20


class _NamingWatch:
    """A watch that names the runs of each wake-up, as PostgreSQL's does (``None``:
    it cannot tell which)."""

    def __init__(self) -> None:
        import queue

        self.queue: queue.Queue[frozenset[str] | None] = queue.Queue()
        self.changed: frozenset[str] | None = frozenset()

    def wait(self, timeout: float) -> bool:
        import queue

        try:
            self.changed = self.queue.get(timeout=timeout)
        except queue.Empty:
            return False
        return True

    def close(self) -> None:
        pass


def test_a_change_of_one_run_wakes_only_its_waiters() -> None:
    """Every commit woke every stream of every run (and started a read for each run):
    now a watch that names the runs wakes only theirs; one that cannot tell (None),
    and the periodic rescan, wake them all; a change before the wait is not missed."""
    watch = _NamingWatch()

    class Store:
        def watch(self) -> _NamingWatch:
            return watch

    async def main() -> None:
        b = Broadcaster(Store(), idle_s=0.02, rescan_s=3600)
        await b.start()
        try:
            seen = b.generation
            a = asyncio.create_task(b.wait(seen, run_id="a"))
            other = asyncio.create_task(b.wait(seen, run_id="b"))
            anyone = asyncio.create_task(b.wait(seen, 5.0))
            await asyncio.sleep(0.05)
            watch.queue.put(frozenset({"b"}))
            assert await asyncio.wait_for(other, 2) > seen
            assert await asyncio.wait_for(anyone, 2) > seen  # (the worker: every change)
            await asyncio.sleep(0.1)
            assert not a.done(), "a change of run b woke run a's waiter"
            watch.queue.put(None)  # cannot tell: every run may have changed
            assert await asyncio.wait_for(a, 2) > seen
            # A change that came while nobody waited is there for the next wait.
            seen = b.generation
            watch.queue.put(frozenset({"a"}))
            while b.generation == seen:
                await asyncio.sleep(0.01)
            assert await asyncio.wait_for(b.wait(seen, run_id="a"), 0.5) > seen
            late = asyncio.create_task(b.wait(b.generation, run_id="a"))
            await asyncio.sleep(0.1)
            assert not late.done()  # nothing new for a since
            late.cancel()
        finally:
            b.stop()

    asyncio.run(main())


def test_on_postgresql_other_runs_commits_cost_a_runs_streams_no_read(pg_store: Any) -> None:
    """PostgreSQL's notifications name the run: a server reads a run again only when it
    changed, not at every commit of every run (100 watched runs, one read each per
    commit anywhere, before)."""
    from server_harness import LiveServer

    from fsm_agent._durable.feed import make_key
    from fsm_agent._durable.review import record

    paused = [calls(call("c1", "write", request_id="R", title="t")), say("ok")]
    make_runtime(paused, Backend(), store=pg_store, approval=True).run("go", run_id="r1")
    n = len(pg_store.load_run("r1").events)
    key, rec = make_key("reader", "read")
    pg_store.add_key(rec)
    reads: list[str] = []
    events_since = pg_store.events_since

    def counted(run_id: str, seq: int, limit: int = 1000) -> Any:
        reads.append(run_id)
        return events_since(run_id, seq, limit)

    pg_store.events_since = counted
    live = LiveServer(pg_store).start()
    server = live.app.app.state.server

    async def main() -> list[list[str]]:
        readies = [asyncio.Event() for _ in range(10)]
        streams = [asyncio.create_task(_subscribe(live.port, key, "r1", e, n)) for e in readies]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in readies)), 10)
        await _settled(lambda: reads.count("r1"))
        before, generation = reads.count("r1"), server.broadcaster.generation
        for i in range(3):
            rt = make_runtime(paused, Backend(), store=pg_store, approval=True)
            await asyncio.to_thread(rt.run, "go", run_id=f"other{i}")
        await _until(lambda: server.broadcaster.generation > generation)  # (seen)
        await asyncio.sleep(0.3)  # (and any read they started is done)
        assert reads.count("r1") == before, "other runs' commits made r1's streams read"
        await asyncio.to_thread(record, pg_store, "r1", "c1", "approve", reviewer="ana")
        return await asyncio.wait_for(asyncio.gather(*streams), 10)

    try:
        got = asyncio.run(main())
    finally:
        live.stop()
    assert got == [["transition", "review"]] * 10


def test_a_stream_that_reads_the_run_end_before_its_wake_up_still_closes() -> None:
    """A stream opened while a run's last commit (its ``run_end`` with the final state)
    was in flight read the events fresh but took the state read another stream had
    made before that commit, of the same generation: "not finished"; its wake-up then
    brought no new event, so it never read the state again and never closed. The state
    read is keyed by the seq read up to, so it is never older than the events read."""
    from types import SimpleNamespace

    from fsm_agent.server._app import Server

    watch = _NamingWatch()
    store = SimpleNamespace(
        events=[{"type": "run_start", "seq": 0}],
        state="deciding",
        watch=lambda: watch,
    )
    store.events_since = lambda run_id, seq, limit=1000: [
        e for e in store.events if e["seq"] > seq
    ][:limit]
    store.load_run = lambda run_id: SimpleNamespace(body={"state": store.state})

    async def drain(stream: Any) -> list[bytes]:
        return [chunk async for chunk in stream]

    async def main() -> None:
        server = Server(store, None, 1 << 20, False, None)
        await server.broadcaster.start()
        try:
            first = server._stream("r1", -1)
            assert b"run_start" in await first.__anext__()
            waiting = asyncio.ensure_future(first.__anext__())  # reads the state, waits
            await _until(lambda: server._waiting)
            # The run's last commit lands; its notification is still on its way.
            store.events += [
                {"type": "transition", "seq": 1},
                {"type": "run_end", "seq": 2, "status": "done"},
            ]
            store.state = "done"
            late = asyncio.ensure_future(drain(server._stream("r1", 0)))  # Last-Event-ID 0
            await asyncio.sleep(0.2)
            watch.queue.put(frozenset({"r1"}))  # the notification arrives
            got = await asyncio.wait_for(late, 5)
            assert b"event: run_end" in b"".join(got)
            rest = [await asyncio.wait_for(waiting, 5), *await drain(first)]
            assert b"event: run_end" in b"".join(rest)
        finally:
            server.broadcaster.stop()

    asyncio.run(main())
