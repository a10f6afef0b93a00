"""The server's one watch for every stream: waiters wake on a commit, time out quietly,
and a waiter cancelled mid-wait (a client that went away) breaks nothing."""

from __future__ import annotations

import asyncio

from conftest import Backend, call, calls, make_runtime, say

from fsm_agent.durable.memory import MemoryStore
from fsm_agent.server.broadcast import Broadcaster


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
