"""``fsm-agent demo`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsm_agent import read_trace
from fsm_agent.cli import main
from fsm_agent.cli.demo import SCENARIOS, Scenario
from fsm_agent.trace.chain import strip_links


def test_all_scenarios_pass_and_write_their_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--scenario", "all", "--trace-dir", str(tmp_path)]) == 0
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


def test_a_mismatch_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = Scenario(**{**SCENARIOS["happy"].__dict__, "expect_reason": "tool_rounds"})
    monkeypatch.setitem(SCENARIOS, "happy", wrong)
    assert main(["demo", "--scenario", "happy", "--quiet"]) == 1
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["mismatches"] == {
        "reason": {"expected": "tool_rounds", "actual": "final_answer"}
    }
    assert "did not behave as expected: happy" in err


def test_a_wrong_flag_is_a_usage_error_not_a_traceback() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "demo", "--scenario", "nope"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "invalid choice: 'nope'" in run.stderr and "Traceback" not in run.stderr
