"""The lease heartbeat (``durable/resume.py``): it rides out a store that cannot be
reached and stops only when the claim is really lost (issue 23)."""

from __future__ import annotations

import threading
import time

from fsm_agent._durable.resume import Heartbeat
from fsm_agent._errors import RunBusy, StoreError


class _Flaky:
    """A store whose renewals fail ``down`` times (unreachable), then succeed, then
    answer ``RunBusy`` once ``taken`` is set."""

    lease_s = 0.3

    def __init__(self, down: int) -> None:
        self.down = down
        self.calls: list[str] = []
        self.taken = threading.Event()

    def renew(self, run_id: str, owner: str) -> None:
        if self.taken.is_set():
            self.calls.append("busy")
            raise RunBusy(f"run {run_id!r} was taken over by someone else")
        if self.down > 0:
            self.down -= 1
            self.calls.append("down")
            raise StoreError("store: connection failed or lost: the server is restarting")
        self.calls.append("ok")


def _until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_heartbeat_retries_an_unreachable_store_and_keeps_beating() -> None:
    store = _Flaky(down=6)
    beat = Heartbeat(store, "r1", "me")
    try:
        _until(lambda: store.calls.count("ok") >= 2)
        assert store.calls[:6] == ["down"] * 6 and beat.lost is None and beat.failures == 6
        assert beat._thread.is_alive()
    finally:
        beat.stop()


def test_the_heartbeat_retries_faster_than_its_interval_after_a_failure() -> None:
    """After a failed renewal the next try comes after ``RETRY_S``, doubling: with a 1 s
    interval, three failures and the good renewal all fit in 2 s."""
    store = _Flaky(down=3)
    store.lease_s = 3.0  # an interval of 1 s
    started = time.monotonic()
    beat = Heartbeat(store, "r1", "me")
    try:
        _until(lambda: "ok" in store.calls)
        # 1 s to the first renewal, then 0.1 + 0.2 + 0.4 s of retries
        assert time.monotonic() - started < 2.0, store.calls
    finally:
        beat.stop()


def test_the_heartbeat_stops_when_the_claim_is_lost() -> None:
    store = _Flaky(down=0)
    beat = Heartbeat(store, "r1", "me")
    try:
        _until(lambda: "ok" in store.calls)
        store.taken.set()
        _until(lambda: not beat._thread.is_alive())
        assert isinstance(beat.lost, RunBusy) and store.calls.count("busy") == 1
    finally:
        beat.stop()
