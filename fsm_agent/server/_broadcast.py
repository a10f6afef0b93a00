"""One watch of the store for every subscriber of this server.

A thread blocks on the store's watch (``durable/feed.py``) and, on each wake-up, bumps a
generation number in the event loop: every SSE stream and the review worker await the
next generation, then re-read the store from where they were. One watch for 500 streams
means one LISTEN connection (or one poll) instead of 500.

A watch that names the runs that changed (PostgreSQL: each notification carries its run
id) wakes only the streams of those runs: a commit to one run costs the streams of every
other run nothing. A watch that cannot tell (SQLite's poll, memory) wakes them all.

The thread also bumps a generation every ``rescan_s`` seconds without a wake-up, for
every run, so a stream that waits with no timeout of its own (a timer per stream is 500
timers, and in Python 3.11 a task per ``wait_for``) still re-reads now and then,
whatever a watch might have missed. Hooks (``on_bump``) run on the loop at each new
generation before any waiter wakes: the server starts the reads the waiters will ask
for there.
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

#: The runs a generation concerns: a set of run ids, or ``None`` for every run.
Runs = frozenset[str] | None


class Broadcaster:
    def __init__(self, store: Any, *, idle_s: float = 1.0, rescan_s: float = 15.0) -> None:
        self.store, self.idle_s, self.rescan_s = store, idle_s, rescan_s
        self.generation = 0
        #: called on the loop with each new generation and its runs, before any waiter wakes
        self.on_bump: list[Callable[[int, Runs], None]] = []
        # Touched only on the event loop: the event of the next generation (for every
        # waiter that names no run) and of each run's next change, the generation that
        # last concerned every run, and the one that last concerned each run since.
        self._event: asyncio.Event | None = None
        self._runs: dict[str, asyncio.Event] = {}
        self._all_at = 0
        self._touched: dict[str, int] = {}
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
                runs: Runs = None
                try:
                    changed = watch.wait(self.idle_s)
                    runs = getattr(watch, "changed", None)
                except Exception as exc:  # a store outage: keep trying, streams re-read
                    log.warning("fsm-agent serve: the store's watch failed: %s", exc)
                    changed = True
                    self._stop.wait(self.idle_s)
                now = time.monotonic()
                if now - quiet_since >= self.rescan_s:
                    changed, runs = True, None
                if changed:
                    quiet_since = now if runs is None else quiet_since
                    self.poke(runs)
        finally:
            watch.close()

    def _bump(self, runs: Runs) -> None:
        assert self._event is not None
        self.generation += 1
        if runs is None:
            # Every run's waiters wake now, so what concerned each run before is moot.
            self._all_at = self.generation
            self._touched.clear()
        else:
            for run_id in runs:
                self._touched[run_id] = self.generation
        for hook in self.on_bump:
            try:
                hook(self.generation, runs)
            except Exception:  # a hook's failure must not keep the waiters asleep
                log.exception("fsm-agent serve: a generation hook failed")
        woken = list(self._runs) if runs is None else [r for r in runs if r in self._runs]
        for run_id in woken:
            self._runs.pop(run_id).set()
        event, self._event = self._event, asyncio.Event()
        event.set()

    def poke(self, runs: Runs = None) -> None:
        """Wake the waiters of ``runs`` (default: every one), from any thread: the
        store may hold something new for them."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._bump, runs)

    def changed_since(self, run_id: str, seen: int) -> bool:
        """Whether a generation after ``seen`` concerned ``run_id``."""
        return max(self._all_at, self._touched.get(run_id, 0)) > seen

    async def wait(
        self, seen: int, timeout: float | None = None, *, run_id: str | None = None
    ) -> int:
        """The generation after ``seen`` (with ``timeout``: or the current one after
        that many seconds); with ``run_id``, the first after ``seen`` that concerns that
        run. An event per generation, not a condition: waiting on one is safe to
        cancel."""
        assert self._event is not None
        if run_id is not None:
            if not self.changed_since(run_id, seen):
                event = self._runs.get(run_id)
                if event is None:
                    event = self._runs[run_id] = asyncio.Event()
                await event.wait()
            return self.generation
        if self.generation == seen:
            if timeout is None:
                await self._event.wait()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._event.wait(), timeout)
        return self.generation
