"""A streamed reply as it was produced, in the stepper, the HTML viewer (a real headless
chromium) and ``fsm-agent demo --stream`` (issue 20 item 8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, needs_browser
from conftest import call, calls, make_runtime, say

from fsm_agent._cli import main
from fsm_agent._render.html import viewer_html
from fsm_agent._render.replay import Replay, describe_step
from fsm_agent._trace.checker import check_file
from fsm_agent.models import StreamingScriptedModel

ANSWER = "A17 is in transit, arriving Thursday."


def _trace(tmp_path: Path, *, trace_deltas: bool) -> Path:
    script = [calls(call("c1", "lookup", order_id="A17"), content="Looking."), say(ANSWER)]
    runtime = make_runtime(script)
    runtime.model = StreamingScriptedModel(script, chunk=5)
    with runtime.stream("Where is A17?", capacity=10_000, trace_deltas=trace_deltas) as run:
        list(run)
    path = tmp_path / f"streamed-{trace_deltas}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in run.result.events), encoding="utf-8")
    return path


def _decision_steps(replay: Replay) -> list[int]:
    return [i for i, e in enumerate(replay.events) if e["type"] == "decision"]


def test_the_stepper_shows_each_delta_of_a_block_under_its_decision(tmp_path: Path) -> None:
    replay = Replay(_trace(tmp_path, trace_deltas=True))
    first, last = _decision_steps(replay)
    lines = describe_step(replay, first)
    at = lines.index("  streamed:")
    assert lines[at + 1] == '    text #0: 2 deltas: "Looki" | "ng."'
    assert lines[at + 2].startswith('    tool_args #0 (c1): 4 deltas: "{\\"ord" | "er_id"')
    final = "\n".join(describe_step(replay, last))
    assert '"A17 i" | "s in " | "trans"' in final
    coalesced = Replay(_trace(tmp_path, trace_deltas=False))
    text = describe_step(coalesced, _decision_steps(coalesced)[0])
    assert "    text #0: 2 deltas, 8 chars (coalesced)" in text


def test_demo_stream_prints_the_answer_as_it_streams(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--stream", "--scenario", "happy", "--trace-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith('[happy] \u2192 call-1 {"query": "order A17 transit"}\n')
    assert "[happy] Order A17 is in transit.\n" in out
    assert "5/5   \u2713" in out  # the scenario's checks still hold, streamed
    assert check_file(tmp_path / "happy.jsonl") == []
    events = [json.loads(line) for line in (tmp_path / "happy.jsonl").read_text().splitlines()]
    blocks = [b for e in events if e["type"] == "decision" for b in e["message"]["streamed"]]
    assert blocks and all(b["pieces"] for b in blocks)  # the trace keeps the deltas


def test_demo_stream_and_plain_demo_take_the_same_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def lines(*flags: str) -> list[dict[str, Any]]:
        assert main(["demo", "--json", *flags]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    def unstreamed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for e in events:
            e = {k: v for k, v in e.items() if k not in ("t", "chain")}
            if isinstance(e.get("message"), dict):
                e["message"] = {k: v for k, v in e["message"].items() if k != "streamed"}
            out.append(e)
        return out

    streamed, plain = lines("--stream"), lines()
    decisions = [e for e in streamed if e.get("type") == "decision" and "message" in e]
    # every scenario's run streamed (a follow-up run of lost_write is a plain run)
    assert {e["scenario"] for e in decisions if "streamed" in e["message"]} == {
        e["scenario"] for e in plain if "scenario" in e
    }
    assert unstreamed(streamed) == unstreamed(plain)


@needs_browser
def test_the_viewer_shows_and_plays_back_the_deltas_of_a_streamed_reply(tmp_path: Path) -> None:
    replay = Replay(_trace(tmp_path, trace_deltas=True))
    page_file = tmp_path / "view.html"
    page_file.write_text(viewer_html(replay), encoding="utf-8")
    last = _decision_steps(replay)[-1]
    with chromium() as browser:
        page = browser.new_page()
        page.goto(page_file.as_uri())
        page.fill("#slider", str(last))
        page.dispatch_event("#slider", "input")
        spans: list[Any] = page.evaluate(
            "() => Array.from(document.querySelectorAll('#event-view span.delta'))"
            ".map(s => s.textContent)"
        )
        assert "".join(spans) == ANSWER and len(spans) == 8
        assert "text #0: 8 deltas, 37 chars" in page.inner_text("#event-view")
        page.click("#event-view button.play-deltas")
        assert page.evaluate("() => document.querySelectorAll('span.delta.pending').length") > 0
        page.wait_for_function(
            "() => document.querySelectorAll('span.delta.pending').length === 0", timeout=5000
        )
        page.close()


@needs_browser
def test_the_viewer_says_when_the_deltas_were_coalesced(tmp_path: Path) -> None:
    replay = Replay(_trace(tmp_path, trace_deltas=False))
    page_file = tmp_path / "view.html"
    page_file.write_text(viewer_html(replay), encoding="utf-8")
    with chromium() as browser:
        page = browser.new_page()
        page.goto(page_file.as_uri())
        page.fill("#slider", str(_decision_steps(replay)[0]))
        page.dispatch_event("#slider", "input")
        shown = page.inner_text("#event-view")
        assert "tool_args #0 (c1): 4 deltas, 19 chars" in shown
        assert "record them with trace_deltas=True" in shown
        assert page.evaluate("() => document.querySelectorAll('span.delta').length") == 0
        page.close()


def test_demo_stream_never_prints_a_control_sequence_raw(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fsm_agent._cli.demo import _LivePrinter
    from fsm_agent._core.events import TextDelta

    _LivePrinter("x")(TextDelta(seq=1, run_id="r", index=0, text="ok\x1b[2J\x07 done\n"))
    assert capsys.readouterr().out == "[x] ok\ufffd[2J\ufffd done\n"
