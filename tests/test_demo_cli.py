"""``fsm-agent demo`` as a user runs it: readable by default, a JSON stream with --json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsm_agent import read_trace
from fsm_agent._cli import main
from fsm_agent._cli.demo import SCENARIOS, Scenario
from fsm_agent._cli.demo_report import path_line
from fsm_agent._trace.chain import strip_links

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_output_is_a_block_per_scenario_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["demo", "--scenario", "all", "--trace-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    blocks = out.split("\n\n")
    for name, scenario in SCENARIOS.items():
        block = next(b for b in blocks if b.startswith(f"{name} · "))
        assert scenario.description.split()[0] in block
        assert f"  stop:    {scenario.expect_status}/{scenario.expect_reason}  ✓" in block
        assert "  path:    deciding → validating" in block or "path:    (deciding" in block
        assert block.rstrip().endswith("✓ as expected")
        assert "✗" not in block
    happy = next(b for b in blocks if b.startswith("happy · "))
    assert "✓ search attempts = 1" in happy and "✓ tickets created = 0" in happy
    assert "answer:  Order A17 is in transit." in happy
    loop = next(b for b in blocks if b.startswith("loop · "))
    assert "(deciding → validating → executing → observing) ×2 → deciding" in loop
    assert "7 of 7 scenario(s) behaved as expected" in out
    table = out[out.index("\nscenario ") + 1 :].splitlines()
    assert table[0].split() == ["scenario", "stop", "checks"]
    assert [row.split()[0] for row in table[1:8]] == list(SCENARIOS)
    wide = [line for line in out.splitlines() if len(line) > 100 and str(tmp_path) not in line]
    assert wide == [], "wider than a terminal"
    assert f"fsm-agent replay {tmp_path / 'retry.jsonl'}" in out
    for name in SCENARIOS:
        assert (tmp_path / f"{name}.jsonl").exists()


def test_json_keeps_the_event_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scenario", "all", "--trace-dir", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    summaries = [x for x in lines if x.get("type") == "summary"]
    assert [s["scenario"] for s in summaries] == list(SCENARIOS)
    assert all(s["ok"] and s["mismatches"] == {} for s in summaries)
    assert "all 7 scenario(s) behaved as expected" in err
    for name in SCENARIOS:
        # The file's lines carry their run id and chain link (trace/chain.py).
        events = strip_links(read_trace(tmp_path / f"{name}.jsonl"))
        printed = [
            {k: v for k, v in x.items() if k != "scenario"}
            for x in lines
            if x.get("scenario") == name
            and x.get("run_id", events[0]["run_id"]) == events[0]["run_id"]
            and x.get("type") != "summary"
        ]
        assert printed[: len(events)] == events


def test_running_twice_replaces_the_traces(tmp_path: Path) -> None:
    for _ in range(2):
        assert main(["demo", "--scenario", "happy", "--trace-dir", str(tmp_path), "--quiet"]) == 0
    events = read_trace(tmp_path / "happy.jsonl")
    assert [e["seq"] for e in events] == list(range(len(events)))


def test_a_mismatch_exits_1_and_says_what_differed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    wrong = Scenario(
        **{**SCENARIOS["happy"].__dict__, "expect_reason": "tool_rounds", "expect_counts": {}}
    )
    monkeypatch.setitem(SCENARIOS, "happy", wrong)
    assert main(["demo", "--scenario", "happy", "--json", "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["mismatches"] == {
        "reason": {"expected": "tool_rounds", "actual": "final_answer"}
    }
    assert "did not behave as expected: happy" in err
    assert main(["demo", "--scenario", "happy"]) == 1
    out, err = capsys.readouterr()
    assert "stop:    done/final_answer  ✗ expected done/tool_rounds" in out
    assert "✗ NOT as expected" in out and "0 of 1 scenario(s) behaved as expected" in out


def test_quiet_prints_only_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scenario", "denied", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["scenario", "stop", "checks"]
    assert out[1].split()[:2] == ["denied", "review_required/approval_required"]
    assert out[-1] == "1 of 1 scenario(s) behaved as expected"


def test_ascii_terminals_get_ascii_marks(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "demo", "--scenario", "retry"],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        check=False,
    )
    assert run.returncode == 0, run.stderr
    text = run.stdout.decode("ascii")
    assert "executing -> retry_wait -> executing" in text and "  ok" in text


@pytest.mark.parametrize(
    ("states", "line"),
    [
        (["a", "b", "c"], "a → b → c"),
        (["a", "b", "a", "b", "a", "b", "c"], "(a → b) ×3 → c"),
        (["s", "a", "b", "c", "a", "b", "c", "d"], "s → (a → b → c) ×2 → d"),
    ],
)
def test_a_repeated_loop_is_written_once(states: list[str], line: str) -> None:
    assert path_line(states) == line


def test_a_trace_dir_that_cannot_hold_traces_is_a_usage_error(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x", encoding="utf-8")
    blocked = tmp_path / "ro"
    blocked.mkdir(mode=0o500)
    cases = [
        (a_file, "not a folder (a file is in the way)"),
        (a_file / "below", "cannot write there"),
    ]
    if os.geteuid() != 0:  # root writes anywhere, so only a non-root run can test this one
        cases.append((blocked / "sub", "cannot write there (Permission denied)"))
    for path, message in cases:
        run = subprocess.run(
            [sys.executable, "-m", "fsm_agent", "demo", "--trace-dir", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 2, (path, run.stderr)
        assert run.stderr == f"demo: --trace-dir {path}: {message}\n" or (
            run.stderr.startswith(f"demo: --trace-dir {path}: {message}")
            and run.stderr.count("\n") == 1
        ), run.stderr
        assert run.stdout == ""  # nothing ran


def test_a_wrong_flag_is_a_usage_error_not_a_traceback() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "demo", "--scenario", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert "invalid choice: 'nope'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.skipif(
    shutil.which("make") is None or not (ROOT / ".git").exists(),
    reason="needs make and a git checkout",
)
def test_make_demo_writes_only_ignored_files() -> None:
    def status() -> str:
        return subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    before = status()
    run = subprocess.run(
        ["make", "-s", "demo", "STAMP=", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert status() == before
    assert (ROOT / "traces" / "retry.html").exists()
