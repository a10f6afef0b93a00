"""One watch of the store for every subscriber of this server.

A thread blocks on the store's watch (``durable/feed.py``) and, on each wake-up, bumps a
generation number in the event loop: every SSE stream and the review worker await the
next generation, then re-read the store from where they were. One watch for 500 streams
means one LISTEN connection (or one poll) instead of 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

__all__ = ["Broadcaster"]

log = logging.getLogger("fsm_agent.server")


class Broadcaster:
    def __init__(self, store: Any, *, idle_s: float = 1.0) -> None:
        self.store, self.idle_s = store, idle_s
        self.generation = 0
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
        try:
            while not self._stop.is_set():
                try:
                    changed = watch.wait(self.idle_s)
                except Exception as exc:  # a store outage: keep trying, streams re-read
                    log.warning("fsm-agent serve: the store's watch failed: %s", exc)
                    changed = True
                    self._stop.wait(self.idle_s)
                if changed:
                    self.poke()
        finally:
            watch.close()

    def _bump(self) -> None:
        assert self._event is not None
        self.generation += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    def poke(self) -> None:
        """Wake every waiter (from any thread): the store may hold something new."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._bump)

    async def wait(self, seen: int, timeout: float) -> int:
        """The generation after ``seen`` (or the current one after ``timeout``). An
        event per generation, not a condition: waiting on one is safe to cancel."""
        assert self._event is not None
        if self.generation == seen:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout)
        return self.generation
