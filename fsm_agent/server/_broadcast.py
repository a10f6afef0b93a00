"""One watch of the store for every subscriber of this server.

A thread blocks on the store's watch (``durable/feed.py``) and, on each wake-up, bumps a
generation number in the event loop: every SSE stream and the review worker await the
next generation, then re-read the store from where they were. One watch for 500 streams
means one LISTEN connection (or one poll) instead of 500.

The thread also bumps a generation every ``rescan_s`` seconds without a wake-up, so a
stream that waits with no timeout of its own (a timer per stream is 500 timers, and in
Python 3.11 a task per ``wait_for``) still re-reads now and then, whatever a watch
might have missed. Hooks (``on_bump``) run on the loop at each new generation before any
waiter wakes: the server starts the reads the waiters will ask for there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Broadcaster"]

log = logging.getLogger("fsm_agent.server")


class Broadcaster:
    def __init__(self, store: Any, *, idle_s: float = 1.0, rescan_s: float = 15.0) -> None:
        self.store, self.idle_s, self.rescan_s = store, idle_s, rescan_s
        self.generation = 0
        #: called on the loop with each new generation, before its waiters wake
        self.on_bump: list[Callable[[int], None]] = []
        #: set (and replaced) at each new generation; touched only on the event loop
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="fsm-agent watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        watch = self.store.watch()
        quiet_since = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    changed = watch.wait(self.idle_s)
                except Exception as exc:  # a store outage: keep trying, streams re-read
                    log.warning("fsm-agent serve: the store's watch failed: %s", exc)
                    changed = True
                    self._stop.wait(self.idle_s)
                now = time.monotonic()
                if changed or now - quiet_since >= self.rescan_s:
                    quiet_since = now
                    self.poke()
        finally:
            watch.close()

    def _bump(self) -> None:
        assert self._event is not None
        self.generation += 1
        for hook in self.on_bump:
            try:
                hook(self.generation)
            except Exception:  # a hook's failure must not keep the waiters asleep
                log.exception("fsm-agent serve: a generation hook failed")
        event, self._event = self._event, asyncio.Event()
        event.set()

    def poke(self) -> None:
        """Wake every waiter (from any thread): the store may hold something new."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._bump)

    async def wait(self, seen: int, timeout: float | None = None) -> int:
        """The generation after ``seen`` (with ``timeout``: or the current one after
        that many seconds). An event per generation, not a condition: waiting on one is
        safe to cancel."""
        assert self._event is not None
        if self.generation == seen:
            if timeout is None:
                await self._event.wait()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._event.wait(), timeout)
        return self.generation
