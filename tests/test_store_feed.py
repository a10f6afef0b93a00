"""The change feed and API keys, on every store: ``events_since`` is the exact tail of a
run's events; a watch wakes on a commit by another thread (a run pausing, a review) and
times out when nothing happens; keys keep only a salted hash and revoke by name."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._durable.feed import make_key, parse_key, supports_feed, verify_key
from fsm_agent._errors import ConfigError, RunNotFound

WRITE = {"request_id": "R-1", "title": "A17 is late"}


def paused(store: Any, backend: Backend, run_id: str = "r1") -> Any:
    rt = make_runtime(
        [calls(call("c1", "write", **WRITE)), say("Filed.")],
        backend,
        store=store,
        approval=True,
    )
    assert rt.run("file it", run_id=run_id).status == "review_required"
    return rt


def test_events_since_is_the_exact_tail(store: Any, backend: Backend) -> None:
    assert supports_feed(store)
    paused(store, backend)
    everything = store.load_run("r1").events
    seqs = [e["seq"] for e in everything]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 3
    assert store.events_since("r1", -1) == everything
    assert store.events_since("r1", 0) == everything[1:]
    assert store.events_since("r1", 1, limit=1) == everything[2:3]
    assert store.events_since("r1", seqs[-1]) == []
    assert store.events_since("r1", 10**6) == []
    with pytest.raises(RunNotFound, match="no run 'nope'"):
        store.events_since("nope", 0)


def test_a_watch_wakes_on_a_commit_and_times_out_on_silence(store: Any, backend: Backend) -> None:
    watch = store.watch()
    try:
        started = time.monotonic()
        assert watch.wait(0.2) is False
        assert time.monotonic() - started >= 0.15
        woke: list[float] = []

        def wait() -> None:
            if watch.wait(10.0):
                woke.append(time.monotonic())

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.1)
        committed = time.monotonic()
        paused(store, backend, "r2")
        waiter.join(10.0)
        assert woke, "the watch did not wake on a new run"
        assert woke[0] - committed < 5.0
        # The wake-up is a hint: the reader finds the events by reading.
        assert store.events_since("r2", -1)
    finally:
        watch.close()


def test_keys_store_a_salted_hash_and_revoke_by_name(store: Any) -> None:
    key, record = make_key("alice", "review")
    assert record.digest not in key and record.salt not in key
    store.add_key(record)
    parsed = parse_key(key)
    assert parsed is not None and parsed[0] == record.key_id
    found = store.get_key(parsed[0])
    assert found == record and found.allows("read") and found.allows("review")
    assert not found.allows("admin")
    assert verify_key(found, parsed[1]) and not verify_key(found, parsed[1] + "x")
    assert not verify_key(None, parsed[1])
    with pytest.raises(ConfigError, match="a key named 'alice' exists"):
        store.add_key(make_key("alice", "read")[1])
    assert [k.name for k in store.list_keys()] == ["alice"]
    assert store.revoke_key("alice") == 1 and store.revoke_key("alice") == 0
    revoked = store.get_key(record.key_id)
    assert revoked is not None and revoked.revoked is not None and not revoked.allows("read")
    store.add_key(make_key("alice", "admin")[1])  # the name is free again
    assert len(store.list_keys()) == 2


@pytest.mark.parametrize(
    ("name", "scope", "expect"),
    [("", "read", "key name ''"), ("a b", "read", "key name 'a b'"), ("bob", "root", "scope")],
)
def test_bad_key_names_and_scopes_are_refused(name: str, scope: str, expect: str) -> None:
    with pytest.raises(ConfigError, match=expect):
        make_key(name, scope)


def test_malformed_keys_do_not_parse() -> None:
    for text in ("", "Bearer x", "fsmk_zz_abc", "fsmk_0123456789abcdef_short"):
        assert parse_key(text) is None


def test_on_postgresql_a_claim_or_a_release_alone_wakes_no_watch(pg_store: Any) -> None:
    """A claim, its renewal and its release change nothing a stream can read: they woke
    every stream of every server (a worker's heartbeat every few seconds; a reviewer's
    claim 5 ms before the review itself, which then waited behind 500 useless wake-ups).
    Only what a reader sees wakes a watch: the review's save."""
    from fsm_agent._durable import owners
    from fsm_agent._durable.review import record

    paused(pg_store, Backend())
    watch = pg_store.watch()
    try:
        while watch.wait(0.2):  # (the run's own commits, before the watch opened)
            pass
        owner = owners.new_owner()
        owners.hold(owner)
        pg_store.claim("r1", owner)
        pg_store.renew("r1", owner)
        owners.let_go(pg_store, "r1", owner)
        assert watch.wait(0.5) is False, "a claim, renewal or release woke the watch"
        record(pg_store, "r1", "c1", "approve", reviewer="ana")
        assert watch.wait(5.0) is True, "the review's save did not wake the watch"
    finally:
        watch.close()
