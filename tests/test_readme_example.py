"""The "Testing your agent" example (docs/guides/testing.md) runs as a test file, exactly
as printed, and the coverage report it mentions appears."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PAGE = (Path(__file__).parents[1] / "docs" / "guides" / "testing.md").read_text(encoding="utf-8")


def test_the_testing_example_passes_under_pytest(pytester: pytest.Pytester) -> None:
    block = re.search(r"^## Each fault, and the review\n.*?```python\n(.*?)```", PAGE, re.S | re.M)
    assert block is not None, "docs/guides/testing.md has no example"
    desk = Path(__file__).parents[1] / "examples" / "support_desk" / "support_desk.py"
    pytester.makepyfile(test_agent=block.group(1), support_desk=desk.read_text("utf-8"))
    pytester.syspathinsert()
    result = pytester.runpytest_inprocess(
        "--fsm-app", "support_desk:make_runtime", "-p", "no:cacheprovider"
    )
    # Every test the page prints passes (and nothing else runs).
    result.assert_outcomes(passed=len(re.findall(r"^def test_", block.group(1), re.M)))
    # The retry the page's first test makes is counted (hits > 0), and the total printed.
    result.stdout.re_match_lines(
        [r".*retry_wait -> executing .* [1-9]\d*$", r"transition coverage: .* = .*%"]
    )
