"""The review server through HTTP: a real uvicorn on loopback, an httpx client, a SQLite
store. Every endpoint, every auth failure, the review races, the SSE resume (also across
a restart), and the security cases: each answered as designed, nothing recorded."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Backend, call, calls, make_runtime, say
from server_harness import LiveServer

from fsm_agent._durable.feed import make_key
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent.server._openapi import OPENAPI

ROOT = Path(__file__).resolve().parent.parent
WRITE = {"request_id": "R-1", "title": "A17 is late"}


def pause(store: Any, backend: Backend, run_id: str = "r1", **write: Any) -> Any:
    rt = make_runtime(
        [calls(call("c1", "write", **(write or WRITE))), say("Filed.")],
        backend,
        store=store,
        approval=True,
    )
    assert rt.run("file it", run_id=run_id).status == "review_required"
    return rt


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "runs.db") as s:
        yield s


@pytest.fixture
def keys(store: SqliteStore) -> dict[str, str]:
    out = {}
    for name, scope in (
        ("reader", "read"),
        ("alice", "review"),
        ("bob", "review"),
        ("root", "admin"),
    ):
        key, record = make_key(name, scope)
        store.add_key(record)
        out[name] = key
    return out


@pytest.fixture
def server(store: SqliteStore) -> Iterator[LiveServer]:
    live = LiveServer(store).start()
    try:
        yield live
    finally:
        live.stop()


def client(server: LiveServer, key: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=10)


def test_runs_list_filters_and_pages_by_cursor(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    backend = Backend()
    for i in range(5):
        pause(store, backend, f"r{i}")
    with client(server, keys["reader"]) as c:
        seen, cursor = [], None
        while True:
            params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
            page = c.get("/api/runs", params=params).json()
            seen += [r["run_id"] for r in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == [f"r{i}" for i in range(5)] and len(seen) == 5
        assert seen == [r.run_id for r in store.list_runs()]  # newest first
        first = c.get("/api/runs", params={"status": "review_required"}).json()["runs"][0]
        assert first["label"] == "waiting for review" and first["pending"] == 1
        assert c.get("/api/runs", params={"status": "done"}).json()["runs"] == []
        assert c.get("/api/runs", params={"reason": "approval_required"}).json()["runs"]
        bad = c.get("/api/runs", params={"limit": "0"})
        assert bad.status_code == 400 and set(bad.json()) == {"error", "detail"}
        assert c.get("/api/runs", params={"cursor": "!!"}).status_code == 400


def test_run_detail_lists_pending_calls_with_digest(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    pause(store, Backend())
    with client(server, keys["reader"]) as c:
        run = c.get("/api/runs/r1").json()
        assert run["status"] == "review_required"
        assert run["seq"] == store.load_run("r1").events[-1]["seq"]
        (p,) = run["pending"]
        assert p["call_id"] == "c1" and p["tool"] == "write"
        assert json.loads(p["arguments"]) == WRITE
        assert p["waiting_for"] == "approval_required" and len(p["digest"]) >= 16
        missing = c.get("/api/runs/nope")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_auth_failures_are_401_and_403_and_record_nothing(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    pause(store, Backend())
    before = store.load_run("r1").events
    review = {"call_id": "c1", "action": "approve"}
    with client(server, None) as c:
        r = c.get("/api/runs")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    for bad in ("nonsense", "fsmk_0123456789abcdef_" + "x" * 43, keys["alice"] + "x"):
        with client(server, bad) as c:
            assert c.get("/api/runs").status_code == 401
            assert c.post("/api/runs/r1/reviews", json=review).status_code == 401
    with httpx.Client(base_url=server.url, headers={"authorization": "Basic x"}) as c:
        assert c.get("/api/runs").status_code == 401
    with client(server, keys["reader"]) as c:
        r = c.post("/api/runs/r1/reviews", json=review)
        assert r.status_code == 403 and "scope 'read'" in r.json()["detail"]
    store.revoke_key("alice")
    with client(server, keys["alice"]) as c:
        r = c.get("/api/runs")
        assert r.status_code == 401 and "revoked" in r.json()["detail"]
        assert c.post("/api/runs/r1/reviews", json=review).status_code == 401
    with client(server, keys["bob"]) as c:
        r = c.post("/api/runs", json={"task": "x"})
        assert r.status_code == 403  # submitting needs admin
    assert store.load_run("r1").events == before


def test_a_review_records_the_keys_holder_and_if_match_refuses_a_stale_page(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    pause(store, Backend())
    with client(server, keys["alice"]) as c:
        seq = c.get("/api/runs/r1").json()["seq"]
        stale = c.post(
            "/api/runs/r1/reviews",
            json={"call_id": "c1", "action": "approve"},
            headers={"if-match": f'"{seq - 1}"'},
        )
        assert stale.status_code == 409 and "moved on" in stale.json()["detail"]
        assert store.load_run("r1").events[-1]["seq"] == seq  # nothing recorded
        ok = c.post(
            "/api/runs/r1/reviews",
            json={"call_id": "c1", "action": "approve", "note": "checked"},
            headers={"if-match": f'"{seq}"'},
        )
        assert ok.status_code == 201, ok.text
        event = ok.json()["review"]
        assert event["reviewer"] == "alice" and event["note"] == "checked" and event["at"]
        assert ok.json()["run"]["label"] == "decided, waiting to be resumed"
        again = c.post("/api/runs/r1/reviews", json={"call_id": "c1", "action": "approve"})
        assert again.status_code == 409 and "already" in again.json()["detail"]
        for body, code in (
            ({"call_id": "c1", "action": "explode"}, 422),
            ({"action": "approve"}, 422),
            ({"call_id": "c1", "action": "edit"}, 422),
        ):
            assert c.post("/api/runs/r1/reviews", json=body).status_code == code
        assert c.post("/api/runs/r1/reviews", content=b"[1]").status_code == 400
    stored = store.load_run("r1")
    reviews = [e for e in stored.events if e["type"] == "review"]
    assert [(e["reviewer"], e["action"]) for e in reviews] == [("alice", "approve")]


def test_two_reviewers_racing_on_one_call_exactly_one_wins(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    pause(store, Backend())
    seq = store.load_run("r1").events[-1]["seq"]
    codes: dict[str, int] = {}
    barrier = threading.Barrier(2)

    def decide(who: str, action: str) -> None:
        with client(server, keys[who]) as c:
            barrier.wait()
            body = {"call_id": "c1", "action": action, "reason": "no"}
            codes[who] = c.post(
                "/api/runs/r1/reviews", json=body, headers={"if-match": f'"{seq}"'}
            ).status_code

    threads = [
        threading.Thread(target=decide, args=("alice", "approve")),
        threading.Thread(target=decide, args=("bob", "deny")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(codes.values()) == [201, 409], codes
    reviews = [e for e in store.load_run("r1").events if e["type"] == "review"]
    assert len(reviews) == 1
    winner = next(w for w, code in codes.items() if code == 201)
    assert reviews[0]["reviewer"] == winner


def _sse(lines: Iterator[str], count: int) -> list[tuple[str, str, dict[str, Any]]]:
    """The next ``count`` events of a stream (fewer if it ends)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in fields:
                out.append((fields["id"], fields["event"], json.loads(fields["data"])))
                if len(out) == count:
                    return out
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
    return out


def test_events_after_seq_and_the_sse_stream_resume_across_a_restart(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    pause(store, Backend())
    events = store.load_run("r1").events
    with client(server, keys["reader"]) as c:
        got = c.get("/api/runs/r1/events", params={"after": "1"}).json()
        assert [e["seq"] for e in got["events"]] == [e["seq"] for e in events[2:]]
        stream = {"accept": "text/event-stream"}
        with c.stream("GET", "/api/runs/r1/events", headers=stream) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            first = _sse(r.iter_lines(), 2)
        assert [(i, t) for i, t, _ in first] == [(str(e["seq"]), e["type"]) for e in events[:2]]
    # The server restarts; the client resumes from the last id it saw.
    server.stop()
    server.start()
    rt = make_runtime([say("unused")], Backend(), store=store)
    with client(server, keys["alice"]) as c:
        headers = {"accept": "text/event-stream", "last-event-id": first[-1][0]}
        received: list[tuple[str, str, dict[str, Any]]] = []
        with c.stream("GET", "/api/runs/r1/events", headers=headers) as r:
            # everything after seq 1, then the live review and the run's continuation
            lines = r.iter_lines()
            received += _sse(lines, len(events) - 2)
            c.post("/api/runs/r1/reviews", json={"call_id": "c1", "action": "approve"})
            rt.resume("r1")
            received += _sse(lines, 10_000)  # the finished run's stream closes by itself
    seqs = [int(i) for i, _, _ in received]
    final = store.load_run("r1").events
    assert seqs == list(range(2, len(final))), "a gap or a duplicate"
    assert received[-1][1] == final[-1]["type"] and final[-1]["type"] == "run_end"
    assert store.load_run("r1").body["state"] == "done"


def test_trace_passes_fsm_agent_check_and_the_diagram_is_svg(
    store: SqliteStore, keys: dict[str, str], server: LiveServer, tmp_path: Path
) -> None:
    pause(store, Backend())
    with client(server, keys["reader"]) as c:
        trace = c.get("/api/runs/r1/trace")
        assert trace.status_code == 200
        path = tmp_path / "r1.jsonl"
        path.write_bytes(trace.content)
        checked = subprocess.run(
            [sys.executable, "-m", "fsm_agent", "check", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        svg = c.get("/api/runs/r1/diagram.svg")
        if svg.status_code == 503:
            pytest.skip(svg.json()["detail"])
        assert svg.status_code == 200 and svg.text.lstrip().startswith(("<?xml", "<svg"))
        assert svg.headers["content-type"].startswith("image/svg+xml")


def test_openapi_is_served_and_committed(server: LiveServer) -> None:
    with client(server, None) as c:
        served = c.get("/openapi.json").json()
    assert served == OPENAPI
    committed = json.loads((ROOT / "docs" / "reference" / "openapi.json").read_text())
    assert committed == served, "docs/reference/openapi.json is stale: regenerate it"
    assert set(served["paths"]) >= {"/api/runs", "/api/runs/{run_id}/reviews"}


def test_a_100_mb_body_is_refused_and_nothing_is_recorded(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    pause(store, Backend())
    before = store.load_run("r1").events
    big = b'{"call_id": "c1", "action": "approve", "note": "' + b"x" * (100 << 20) + b'"}'
    with client(server, keys["alice"]) as c:
        r = c.post("/api/runs/r1/reviews", content=big)
        assert r.status_code == 413 and r.json()["error"] == "too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"call_id": "c1", "action": "approve", "note": "'
            for _ in range(3):
                yield b"x" * (1 << 20)
            yield b'"}'

        try:
            r = c.post("/api/runs/r1/reviews", content=chunks())
            assert r.status_code == 413
        except httpx.HTTPError:
            pass  # the server may close the connection mid-upload: refused either way
    assert store.load_run("r1").events == before


def test_dot_dot_paths_and_unknown_routes_are_json_404s(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    with client(server, keys["reader"]) as c:
        for path in (
            "/api/runs/..%2F..%2Fetc%2Fpasswd",
            "/api/runs/../../etc/passwd",
            "/static/..%2F..%2Fapp.py",
            "/static/../app.py",
            "/nope",
        ):
            r = c.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert "root:" not in r.text and "import" not in r.text


def test_every_answer_has_a_strict_csp(keys: dict[str, str], server: LiveServer) -> None:
    with client(server, keys["reader"]) as c:
        for path in ("/api/runs", "/signin", "/nope"):
            csp = c.get(path).headers["content-security-policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


def test_submit_needs_an_app(keys: dict[str, str], server: LiveServer) -> None:
    with client(server, keys["root"]) as c:
        r = c.post("/api/runs", json={"task": "x"})
        assert r.status_code == 409 and "--app" in r.json()["detail"]


def test_on_postgresql_the_stream_follows_a_review_and_a_resume(pg_store: Any) -> None:
    # The watch is LISTEN/NOTIFY here: the review and the resume are commits of other
    # connections, announced by the runs table's trigger.
    key, record = make_key("alice", "review")
    pg_store.add_key(record)
    pause(pg_store, Backend())
    live = LiveServer(pg_store).start()
    try:
        rt = make_runtime([say("unused")], Backend(), store=pg_store)
        with client(live, key) as c:
            headers = {"accept": "text/event-stream"}
            with c.stream("GET", "/api/runs/r1/events", headers=headers) as r:
                lines = r.iter_lines()
                received = _sse(lines, len(pg_store.load_run("r1").events))
                ok = c.post("/api/runs/r1/reviews", json={"call_id": "c1", "action": "approve"})
                assert ok.status_code == 201
                rt.resume("r1")
                received += _sse(lines, 10_000)
        final = pg_store.load_run("r1").events
        assert [int(i) for i, _, _ in received] == list(range(len(final)))
        assert final[-1]["type"] == "run_end" and pg_store.load_run("r1").body["state"] == "done"
    finally:
        live.stop()


def test_deny_over_http_records_the_reason_and_the_run_goes_on_without_the_write(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    backend = Backend()
    rt = pause(store, backend)
    with client(server, keys["bob"]) as c:
        body = {"call_id": "c1", "action": "deny", "reason": "wrong order", "note": "n"}
        r = c.post("/api/runs/r1/reviews", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["review"]["reason"] == "wrong order"
        assert r.json()["review"]["reviewer"] == "bob"
    assert rt.resume("r1").status == "done"
    assert backend.writes == []


def test_edit_over_http_runs_the_corrected_call_and_the_trace_checks(
    store: SqliteStore, keys: dict[str, str], server: LiveServer, tmp_path: Path
) -> None:
    backend = Backend()
    rt = pause(store, backend)
    edited = {"request_id": "R-1", "title": "A17 is late (refund capped)"}
    with client(server, keys["alice"]) as c:
        seq = c.get("/api/runs/r1").json()["seq"]
        body = {"call_id": "c1", "action": "edit", "arguments": edited, "note": "cap"}
        r = c.post("/api/runs/r1/reviews", json=body, headers={"if-match": f'"{seq}"'})
        assert r.status_code == 201, r.text
        review = r.json()["review"]
        assert (review["action"], review["reviewer"], review["note"]) == ("edit", "alice", "cap")
        assert review["arguments"] == edited and review["original_arguments"] == WRITE
        assert r.json()["run"]["label"] == "decided, waiting to be resumed"
    assert rt.resume("r1").status == "done"
    assert backend.writes == [edited]
    with client(server, keys["reader"]) as c:
        path = tmp_path / "r1.jsonl"
        path.write_bytes(c.get("/api/runs/r1/trace").content)
    checked = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_bad_edit_over_http_is_a_precise_4xx_and_records_nothing(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    backend = Backend()
    pause(store, backend)
    make_runtime([say("hi")], backend, store=store).run("hello", run_id="done")
    before = {r: store.load_run(r).events for r in ("r1", "done")}
    good = {"request_id": "R-1", "title": "ok"}
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("r1", {"call_id": "c1", "arguments": {"request_id": "R-1", "title": "x" * 60}}, 422,
         "do not fit tool 'write''s schema: title: "),
        ("r1", {"call_id": "c1", "arguments": {"title": "t"}}, 422,
         "(root): 'request_id' is a required property"),
        ("r1", {"call_id": "c1", "arguments": [1]}, 422, "as a JSON object"),
        ("r1", {"call_id": "c1"}, 422, "as a JSON object"),
        ("r1", {"call_id": "c9", "arguments": good}, 409, "call 'c9' is not pending in run 'r1'"),
        ("done", {"call_id": "c1", "arguments": good}, 409,
         "run 'done' is done/final_answer, not waiting for review"),
        ("nope", {"call_id": "c1", "arguments": good}, 404, "nope"),
    ]  # fmt: skip
    with client(server, keys["alice"]) as c:
        for run_id, body, code, detail in cases:
            r = c.post(f"/api/runs/{run_id}/reviews", json={"action": "edit", **body})
            assert r.status_code == code, (body, r.text)
            assert detail in r.json()["detail"], r.json()
        r = c.post("/api/runs/r1/reviews", json={"call_id": "c1", "action": "approve",
                                                  "arguments": good})  # fmt: skip
        assert r.status_code == 422 and "only an edit carries arguments" in r.json()["detail"]
    assert {r: store.load_run(r).events for r in ("r1", "done")} == before
    assert backend.writes == []


def test_cancel_over_http_takes_the_cancel_edge_and_the_trace_checks(
    store: SqliteStore, keys: dict[str, str], server: LiveServer, tmp_path: Path
) -> None:
    backend = Backend()
    rt = make_runtime([calls(call("c1", "lookup", order_id="A1")), say("ok")], backend,
                      store=store)  # fmt: skip
    rt.submit("where is A1?", run_id="queued")  # waiting for a worker, never driven
    with client(server, keys["root"]) as c:
        r = c.post("/api/runs/queued/cancel")
        assert r.status_code == 200, r.text
        assert (r.json()["run"]["status"], r.json()["run"]["reason"]) == ("cancelled", "cancelled")
        again = c.post("/api/runs/queued/cancel")
        assert again.status_code == 409 and "it has ended" in again.json()["detail"]
        path = tmp_path / "queued.jsonl"
        path.write_bytes(c.get("/api/runs/queued/trace").content)
    events = store.load_run("queued").events
    edges = [(e["trigger"], e["source"], e["dest"]) for e in events if e["type"] == "transition"]
    assert edges == [("cancel", "deciding", "cancelled")]
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "cancelled"
    checked = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert rt.resume("queued").status == "cancelled"  # a worker finds it ended: nothing runs
    assert backend.lookups == []


def test_a_cancel_over_http_records_who_when_and_why_and_check_replays_it(
    store: SqliteStore, keys: dict[str, str], server: LiveServer, tmp_path: Path
) -> None:
    """Who cancelled was only in the server's log: now the ``cancel`` transition names
    the key's holder, the time and the note (as a ``review`` event does), in the chained
    trace, and ``check`` replays the stop with them."""
    from datetime import datetime

    rt = make_runtime([say("unused")], Backend(), store=store)
    rt.submit("where is A1?", run_id="queued")
    with client(server, keys["root"]) as c:
        bad = c.post("/api/runs/queued/cancel", json={"note": 42})
        assert bad.status_code == 422 and "note: a non-empty string" in bad.json()["detail"]
        assert store.load_run("queued").events == []  # nothing recorded
        r = c.post("/api/runs/queued/cancel", json={"note": "the customer called it off"})
        assert r.status_code == 200, r.text
        trace = c.get("/api/runs/queued/trace").content
    (cancel,) = [e for e in store.load_run("queued").events if e["type"] == "transition"]
    assert cancel["trigger"] == "cancel" and cancel["by"] == "root"
    assert cancel["note"] == "the customer called it off"
    assert datetime.fromisoformat(cancel["at"].replace("Z", "+00:00")).utcoffset() is not None
    path = tmp_path / "queued.jsonl"
    path.write_bytes(trace)
    assert b'"by":"root"' in trace.replace(b" ", b"")  # in the exported trace too
    checked = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The replay throws the recorded stop in again: a trace whose ``by`` says otherwise
    # than its chain is refused (the engine writes what the trace holds, the chain breaks).
    forged = trace.replace(b'"root"', b'"mallory"')
    path.write_bytes(forged)
    refused = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0


def test_a_run_that_cannot_be_cancelled_is_a_precise_4xx_and_nothing_changes(
    store: SqliteStore, keys: dict[str, str], server: LiveServer
) -> None:
    from fsm_agent._durable import owners

    backend = Backend()
    pause(store, backend)  # r1: waiting for review
    rt = make_runtime([say("hi")], backend, store=store)
    rt.run("hello", run_id="done")
    rt.submit("hello again", run_id="busy")
    driver = owners.new_owner()
    owners.hold(driver)
    store.claim("busy", driver)  # a live driver holds it
    before = {r: store.load_run(r).events for r in ("r1", "done", "busy")}
    try:
        with client(server, keys["alice"]) as c:  # a review key may not cancel
            r = c.post("/api/runs/r1/cancel")
            assert r.status_code == 403 and "this needs 'admin'" in r.json()["detail"]
        with client(server, keys["root"]) as c:
            for run_id, code, detail in (
                ("r1", 409, "waiting for review: deny its pending calls"),
                ("done", 409, "is done/final_answer: it has ended"),
                ("nope", 404, "nope"),
            ):
                r = c.post(f"/api/runs/{run_id}/cancel")
                assert r.status_code == code, (run_id, r.text)
                assert detail in r.json()["detail"], r.json()
            # A run a live driver holds gets a request for that driver, nothing more.
            r = c.post("/api/runs/busy/cancel")
            assert r.status_code == 202 and r.json()["run"]["cancel_requested"]["by"] == "root"
    finally:
        owners.let_go(store, "busy", driver)
    assert {r: store.load_run(r).events for r in ("r1", "done", "busy")} == before
    assert store.load_run("r1").cancel_request is None  # a refusal stores nothing


def test_on_postgresql_cancel_and_edit_go_through_the_machine(pg_store: Any) -> None:
    from fsm_agent._trace.checker import check_bytes

    key, record = make_key("root", "admin")
    pg_store.add_key(record)
    backend = Backend()
    rt = pause(pg_store, backend)
    make_runtime([say("unused")], backend, store=pg_store).submit("hi", run_id="queued")
    edited = {"request_id": "R-1", "title": "edited on PostgreSQL"}
    live = LiveServer(pg_store).start()
    try:
        with client(live, key) as c:
            assert c.post("/api/runs/queued/cancel").status_code == 200
            body = {"call_id": "c1", "action": "edit", "arguments": edited}
            assert c.post("/api/runs/r1/reviews", json=body).status_code == 201
            assert rt.resume("r1").status == "done"
            for run_id in ("queued", "r1"):
                report = check_bytes(c.get(f"/api/runs/{run_id}/trace").content)
                assert report.violations == [], (run_id, report.violations)
    finally:
        live.stop()
    assert pg_store.load_run("queued").body["state"] == "cancelled"
    assert backend.writes == [edited]
