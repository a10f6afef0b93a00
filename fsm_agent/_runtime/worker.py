"""A worker of the fleet: claims runs from a PostgreSQL store's queue and drives them,
``concurrency`` at a time, on one asyncio loop (``fsm-agent worker``).

What it claims (``PostgresStore.claim_next``, ``FOR UPDATE SKIP LOCKED``, so workers on
any number of hosts never claim one run twice): runs submitted and never driven
(``Runtime.submit``), runs whose reviews are all settled, runs whose owner's lease expired
(a worker that died, stalled or lost its connection) and runs released unfinished. It
wakes on ``LISTEN/NOTIFY`` (a new run, a review decision, a release) and polls every
``poll_s`` for leases that expired silently. A ``cancel:<run id>`` notification (a cancel
asked of a run, ``durable/cancel.py``) makes the heartbeat of that run, if this worker
drives it, renew at once: the renewal brings the request, and the run stops.

Each claim is driven by ``Runtime.aresume`` under the claim's owner token and epoch: the
lease is renewed by heartbeats while it runs, and every commit is fenced, so a worker that
lost the claim commits nothing more (``RunBusy``: counted as *fenced*).

Stopping (SIGTERM, SIGINT, or the ``stop`` event): no new claims; runs in progress get
``grace_s`` to finish; any still running then is released — from that moment its commits
are refused — and cancelled, and the next worker continues it from its last checkpoint (a
write that was in flight goes to review as ``outcome_unknown``, as after a crash).

One log line per claim and per finish (logger ``fsm_agent.worker``); counts go to the
store's ``workers`` table every ``report_s`` (``fsm-agent worker --status``, which lists
a worker silent for longer than the lease as ``lost``: killed without a word).

A run claimed on this host by a worker process that is gone (SIGKILL, OOM) is taken at
once, not at the end of its lease (``PostgresStore.claim_next``); a live worker keeps
its claims until their leases run out, stalled or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, cast

from fsm_agent._durable import owners
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.resume import poke
from fsm_agent._errors import ConfigError, RunBusy, StoreError
from fsm_agent._runtime.runtime import Runtime

__all__ = ["Worker", "WorkerCounts"]

log = logging.getLogger("fsm_agent.worker")


@dataclass
class WorkerCounts:
    claimed: int = 0
    finished: int = 0  # driven to an end or to a review
    released: int = 0  # let go unfinished when the grace period ran out
    failed: int = 0  # the store failed, or the run could not be restored
    fenced: int = 0  # another worker took the run over: this one committed nothing more


class Worker:
    """Drives the submitted runs of ``runtime.store`` (a :class:`PostgresStore`, or any
    store with a run queue) with ``runtime``'s model and tools. See the module docstring."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 4,
        grace_s: float = 30.0,
        poll_s: float = 5.0,
        report_s: float = 2.0,
    ) -> None:
        store = runtime.store
        if not hasattr(store, "claim_next"):
            raise ConfigError(
                "a worker needs a store with a run queue (PostgresStore), not "
                + type(store).__name__
            )
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        self.runtime = runtime
        self.store = cast(PostgresStore, store)
        self.concurrency, self.grace_s, self.poll_s, self.report_s = (
            concurrency,
            grace_s,
            poll_s,
            report_s,
        )
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.counts = WorkerCounts()
        self.state = "starting"
        self._active: dict[asyncio.Task[None], Any] = {}
        self._unreleased: list[tuple[str, str]] = []
        #: runs that could not be restored here: not claimed again before the time given
        self._skip: dict[str, float] = {}
        self._store_down = False
        self._reported = 0.0

    # ── the loop ──────────────────────────────────────────────────────────────────

    async def run(self, stop: asyncio.Event | None = None) -> WorkerCounts:
        """Claim and drive runs until ``stop`` is set; then drain. Returns the counts."""
        stop = stop or asyncio.Event()
        wake = asyncio.Event()
        listener = asyncio.create_task(self._listen(wake), name="fsm-agent-listen")
        reporter = asyncio.create_task(self._keep_reporting(), name="fsm-agent-report")
        self.state = "running"
        log.info(
            "worker %s: started on %s (concurrency %d, lease %gs)",
            self.id,
            getattr(self.store, "name", "?"),
            self.concurrency,
            self.store.lease_s,
        )
        try:
            while not stop.is_set():
                await self._settle_unreleased()
                await self._fill()
                await self._report()
                await self._wait(stop, wake)
        finally:
            listener.cancel()
            reporter.cancel()
            await asyncio.gather(listener, reporter, return_exceptions=True)
            await self._drain()
            self.state = "stopped"
            await self._report(force=True)
            log.info("worker %s: stopped: %s", self.id, _counts(self.counts))
        return self.counts

    async def _wait(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Until a notification, a finished run, a stop, or the poll interval (shorter
        while the store is unreachable)."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        timeout = 0.5 if self._store_down else self.poll_s
        if len(self._active) >= self.concurrency:
            timeout = max(timeout, self.report_s)
        try:
            await asyncio.wait(
                [*waits, *self._active], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()
            wake.clear()

    async def _fill(self) -> None:
        """Claim runs until ``concurrency`` are in progress or the queue is empty."""
        now = time.monotonic()
        self._skip = {k: t for k, t in self._skip.items() if t > now}
        while len(self._active) < self.concurrency:
            owner = owners.new_owner()
            owners.hold(owner)
            # Never a run this worker still drives, even if its lease lapsed meanwhile
            # (the store was unreachable for longer than the lease): that driving keeps
            # the run, and its heartbeat renews the claim once the store is back.
            skip = (*self._skip, *(c.run_id for c in self._active.values()))
            try:
                claim = await asyncio.to_thread(self.store.claim_next, owner, skip)
            except StoreError as exc:
                owners.drop(owner)
                self._down(exc)
                return
            if self._store_down:
                self._store_down = False
                log.info("worker %s: the store is reachable again", self.id)
            if claim is None:
                owners.drop(owner)
                return
            self.counts.claimed += 1
            log.info(
                "worker %s: claimed run %s (%s, epoch %d)",
                self.id,
                claim.run_id,
                claim.why,
                claim.epoch,
            )
            task = asyncio.create_task(self._drive(claim), name=f"fsm-agent-run-{claim.run_id}")
            self._active[task] = claim
            task.add_done_callback(self._active.pop)

    def _down(self, exc: BaseException) -> None:
        if not self._store_down:
            log.warning(
                "worker %s: store unreachable, claiming nothing until it is back: %s", self.id, exc
            )
        self._store_down = True

    async def _drive(self, claim: Any) -> None:
        started = time.monotonic()
        try:
            result = await self.runtime.aresume(claim.run_id, claimed_by=claim.owner)
        except RunBusy as exc:
            self.counts.fenced += 1
            log.warning(
                "worker %s: lost run %s (fenced, committed nothing more): %s",
                self.id,
                claim.run_id,
                exc,
            )
        except asyncio.CancelledError:
            self.counts.released += 1
            log.warning(
                "worker %s: released run %s unfinished (grace period over)", self.id, claim.run_id
            )
            raise
        except StoreError as exc:
            self.counts.failed += 1
            # The claim may still be held (the store could not be told): release it
            # when the store is back, or it lapses with its lease.
            self._unreleased.append((claim.run_id, claim.owner))
            self._skip[claim.run_id] = time.monotonic() + self.store.lease_s
            log.warning(
                "worker %s: run %s stopped, the store failed: %s", self.id, claim.run_id, exc
            )
        except Exception as exc:  # an application error outside the run's rules
            self.counts.failed += 1
            self._skip[claim.run_id] = time.monotonic() + self.store.lease_s
            log.error(
                "worker %s: run %s failed: %s: %s", self.id, claim.run_id, type(exc).__name__, exc
            )
        else:
            self.counts.finished += 1
            status = result.status + (f"/{result.reason}" if result.reason else "")
            log.info(
                "worker %s: finished run %s: %s (%.2fs)",
                self.id,
                claim.run_id,
                status,
                time.monotonic() - started,
            )

    async def _settle_unreleased(self) -> None:
        """Release claims a store failure left behind (fenced: a no-op where another
        worker took the run meanwhile)."""
        while self._unreleased:
            run_id, owner = self._unreleased[0]
            try:
                await asyncio.to_thread(self.store.release, run_id, owner)
            except StoreError:
                return
            self._unreleased.pop(0)

    async def _drain(self) -> None:
        self.state = "draining"
        if not self._active:
            return
        log.info(
            "worker %s: draining %d runs in progress (grace %gs)",
            self.id,
            len(self._active),
            self.grace_s,
        )
        await self._report(force=True)
        if not self._active:  # the last one finished while the report was sent
            return
        _, late = await asyncio.wait(list(self._active), timeout=self.grace_s)
        for task in late:
            claim = self._active.get(task)
            if claim is not None:
                # From here on every commit of this driving is refused (if the store
                # cannot be told, the claim lapses with its lease).
                with contextlib.suppress(StoreError):
                    await asyncio.to_thread(self.store.release, claim.run_id, claim.owner)
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _keep_reporting(self) -> None:
        """Report every ``report_s`` whatever the loop waits for: a worker silent for
        long is listed as lost (``PostgresStore.fleet``)."""
        while True:
            await asyncio.sleep(self.report_s)
            await self._report()

    async def _report(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._reported < self.report_s:
            return
        self._reported = now
        with contextlib.suppress(StoreError):  # reported again on the next round
            await asyncio.to_thread(
                self.store.report_worker,
                self.id,
                self.state,
                self.concurrency,
                len(self._active),
                asdict(self.counts),
            )

    # ── notifications ─────────────────────────────────────────────────────────────

    def _cancel_asked(self, run_id: str) -> None:
        """A cancel was asked of ``run_id``: if this worker drives it, its heartbeat
        renews now and brings the request (not a third of a lease later)."""
        for claim in list(self._active.values()):
            if claim.run_id == run_id:
                poke(run_id, claim.owner)

    async def _listen(self, wake: asyncio.Event) -> None:
        """``LISTEN`` on the store's work channel on a connection of its own; reconnects
        after a lost connection (and wakes the loop then: it may have missed some)."""
        import psycopg

        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.store.conninfo, autocommit=True)
                async with conn:
                    await conn.execute(f'LISTEN "{self.store.channel}"')
                    backoff = 0.1
                    wake.set()
                    async for note in conn.notifies():
                        if note.payload.startswith(CANCEL_NOTE):
                            self._cancel_asked(note.payload[len(CANCEL_NOTE) :])
                        wake.set()
            except psycopg.Error:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)


#: The payload prefix of a cancel asked of a run (``PostgresStore.request_cancel``).
CANCEL_NOTE = "cancel:"


def _counts(c: WorkerCounts) -> str:
    return ", ".join(f"{k} {v}" for k, v in asdict(c).items())
