"""The README's "Testing your agent" example runs as a test file, exactly as printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

README = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_testing_example_passes_under_pytest(pytester: pytest.Pytester) -> None:
    block = re.search(r"## Testing your agent\n.*?```python\n(.*?)```", README, re.S)
    assert block is not None, "README has no 'Testing your agent' example"
    pytester.makepyfile(test_agent=block.group(1))
    result = pytester.runpytest_inprocess("--fsm-coverage", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*retry_wait -> executing*1", "transition coverage: * = *%"])
