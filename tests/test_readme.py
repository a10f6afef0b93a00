"""The README's code runs as written, and its demo table matches the scenarios."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fsm_agent.cli.demo import SCENARIOS

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_the_api_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"## In code\n\n```python\n(.*?)```", README, re.S)
    assert block is not None
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(block.group(1), "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out == "Order A17 is in transit. {'check_order': 1}\n"
    assert (tmp_path / "traces" / "example.jsonl").exists()


def test_the_demo_table_lists_every_scenario_with_its_stop() -> None:
    rows = re.findall(r"^\| `(\w+)` \| .*? \| `(\w+)/(\w+)` \|", README, re.M)
    assert {name: (status, reason) for name, status, reason in rows} == {
        name: (s.expect_status, s.expect_reason) for name, s in SCENARIOS.items()
    }
