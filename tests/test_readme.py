"""The README's example prints what it says, and the demo table of Getting started matches
the scenarios. (Every code block of README and docs runs in test_docs_examples.py.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fsm_agent._cli.demo import SCENARIOS
from fsm_agent._trace.checker import check_file

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")


def test_the_api_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"## In code\n\n```python\n(.*?)```", README, re.S)
    assert block is not None
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(block.group(1), "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    # the run's answer, then the streamed run's text deltas
    expected = "Order A17 is in transit. {'check_order': 1}\nOrder A17 is in transit."
    assert capsys.readouterr().out == expected
    traces = list((tmp_path / "traces").glob("*.jsonl"))  # one file per run, by its id
    assert len(traces) == 2  # the run and the streamed run: both check
    assert [check_file(trace) for trace in traces] == [[], []]


def test_the_demo_table_lists_every_scenario_with_its_stop() -> None:
    rows = re.findall(r"^\| `(\w+)` \| .*? \| `(\w+)/(\w+)` \|", GETTING_STARTED, re.M)
    assert {name: (status, reason) for name, status, reason in rows} == {
        name: (s.expect_status, s.expect_reason) for name, s in SCENARIOS.items()
    }


def test_the_readme_is_short_and_links_into_the_docs() -> None:
    sections = re.findall(r"^## (.+)$", README, re.M)
    # The pitch, one example, the two promises a reader weighs before adopting it (issues
    # 11 and 12 ask for them in the README) and the review UI in one screenshot and three
    # commands (issue 22); the rest is in the docs.
    assert sections == [
        "Install",
        "In code",
        "Verifiable traces",
        "A fleet of workers",
        "Your own rules",  # issue 19: the rules a user adds, in one paragraph
        "The review server",
        "Documentation",
    ]
    assert README.count("\n") < 200
    assert README.count("```python") == 1  # one example
    assert "make demo" in README and "make test" in README
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) >= 10 and all((ROOT / link).is_file() for link in links), links
