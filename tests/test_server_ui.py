"""The review server's web UI through HTTP: sign-in into an HttpOnly SameSite session,
CSRF on every form (a cross-site post records nothing), hostile event payloads shown as
inert text, and a review from the run page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from conftest import Backend, call, calls, make_runtime, say
from server_harness import LiveServer

from fsm_agent._durable.feed import make_key
from fsm_agent._durable.sqlite import SqliteStore

# within the write tool's 50-character title (the arguments must validate to pause)
HOSTILE = '<script>alert(1)</script><a href="javascript:x">'


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "runs.db") as s:
        backend = Backend()
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-1", title=HOSTILE)), say("Filed.")],
            backend,
            store=s,
            approval=True,
        )
        assert rt.run("file " + HOSTILE, run_id="r1").status == "review_required"
        yield s


@pytest.fixture
def server(store: SqliteStore) -> Iterator[LiveServer]:
    live = LiveServer(store).start()
    try:
        yield live
    finally:
        live.stop()


def sign_in(server: LiveServer, key: str) -> httpx.Client:
    c = httpx.Client(base_url=server.url, timeout=10)
    form = c.get("/signin")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert token is not None
    r = c.post("/signin", data={"csrf": token.group(1), "key": key})
    assert r.status_code == 303 and r.headers["location"] == "/runs"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    return c


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def test_sign_in_shows_the_paused_run_first_and_inert(
    store: SqliteStore, server: LiveServer
) -> None:
    key, record = make_key("alice", "review")
    store.add_key(record)
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.get("/runs").headers["location"] == "/signin"
        bad = anonymous.post("/signin", data={"csrf": "x", "key": key})
        assert bad.status_code == 403  # no sign-in cookie: a cross-site sign-in
    with closing(sign_in(server, key)) as c:
        runs = c.get("/runs").text
        assert "waiting for review" in runs and 'href="/runs/r1"' in runs
        page = c.get("/runs/r1").text
        assert (
            "<script>alert" not in page
            and "javascript:alert" not in page.replace("javascript:alert(2)&quot;", "")
        ) or 'href="javascript:' not in page
        assert 'href="javascript:' not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert page.count("<script") == 1  # htmx, from this server
        assert "Approve" in page and "digest" in page


def test_a_cross_site_form_without_csrf_records_nothing(
    store: SqliteStore, server: LiveServer
) -> None:
    key, record = make_key("alice", "review")
    store.add_key(record)
    before = store.load_run("r1").events
    with closing(sign_in(server, key)) as c:
        form = {"call_id": "c1", "action": "approve"}
        assert c.post("/runs/r1/review", data=form).status_code == 403
        assert c.post("/runs/r1/review", data={**form, "csrf": "forged"}).status_code == 403
        # the JSON API with the session cookie and no token: refused as well
        assert c.post("/api/runs/r1/reviews", json=form).status_code == 403
    assert store.load_run("r1").events == before


def test_approve_from_the_run_page_records_the_signed_in_reviewer(
    store: SqliteStore, server: LiveServer
) -> None:
    key, record = make_key("carol", "review")
    store.add_key(record)
    with closing(sign_in(server, key)) as c:
        page = c.get("/runs/r1").text
        seq = re.search(r'name="seq" value="(-?\d+)"', page)
        assert seq is not None
        form = {"csrf": csrf_of(page), "seq": seq.group(1), "call_id": "c1", "action": "approve"}
        # The page's version is kept: the form's decision is judged on it, in 1 round trip.
        kept = server.app.app.state.server.views
        view = kept.get("r1", int(seq.group(1)))
        assert view is not None and view.head == store.load_run("r1").head
        r = c.post("/runs/r1/review", data=form)
        assert r.status_code == 303 and "msg=recorded" in r.headers["location"]
        assert kept.get("r1", int(seq.group(1))) is None  # decided on: dropped
        # the same stale form again: the run moved on, the page says so
        r = c.post("/runs/r1/review", data=form)
        assert r.status_code == 303 and "error=" in r.headers["location"]
        assert "decided, waiting to be resumed" in c.get("/runs/r1").text
    (review,) = [e for e in store.load_run("r1").events if e["type"] == "review"]
    assert review["reviewer"] == "carol"


def test_a_read_key_sees_no_review_forms_and_cannot_post(
    store: SqliteStore, server: LiveServer
) -> None:
    key, record = make_key("reader", "read")
    store.add_key(record)
    with closing(sign_in(server, key)) as c:
        page = c.get("/runs/r1").text
        assert "Approve" not in page
        form = {"csrf": csrf_of(page), "call_id": "c1", "action": "approve"}
        assert c.post("/runs/r1/review", data=form).status_code == 403
    assert not [e for e in store.load_run("r1").events if e["type"] == "review"]


def test_an_admin_cancels_a_queued_run_from_its_page_and_a_forged_form_does_nothing(
    store: SqliteStore, server: LiveServer
) -> None:
    make_runtime([say("hi")], store=store).submit("hello", run_id="q1")
    key, record = make_key("olga", "admin")
    store.add_key(record)
    reviewer, record = make_key("rita", "review")
    store.add_key(record)
    with closing(sign_in(server, reviewer)) as c:
        assert "Cancel this run" not in c.get("/runs/q1").text  # not for a review key
    with closing(sign_in(server, key)) as c:
        page = c.get("/runs/q1").text
        assert "Cancel this run" in page
        assert c.post("/runs/q1/cancel", data={"csrf": "forged"}).status_code == 403
        assert store.load_run("q1").body["state"] == "deciding"
        r = c.post("/runs/q1/cancel", data={"csrf": csrf_of(page), "note": "a duplicate"})
        assert r.status_code == 303 and "msg=cancelled" in r.headers["location"]
        assert store.load_run("q1").body["state"] == "cancelled"
        (cancel,) = [e for e in store.load_run("q1").events if e["type"] == "transition"]
        assert (cancel["by"], cancel["note"]) == ("olga", "a duplicate")  # in the trace
        r = c.post("/runs/r1/cancel", data={"csrf": csrf_of(page)})  # paused: says why not
        assert r.status_code == 303 and "waiting+for+review" in r.headers["location"]
        assert "Cancel this run" not in c.get("/runs/q1").text  # ended: no button
