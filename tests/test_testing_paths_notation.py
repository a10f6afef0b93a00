"""assert_path reads the collapsed notation the demo prints; toolkit frames are hidden."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fsm_agent._cli.demo_report import path_line
from fsm_agent.testing import FaultyTools, answer, assert_path, call, decide
from fsm_agent.testing._assertions import collapsed, parse_path
from fsm_agent.testing._scenarios import scripted_runtime

pytest_plugins = ["pytester"]

RETRIED = (
    "deciding → validating → executing → retry_wait → executing → observing → "
    "deciding → validating → done"
)


@pytest.fixture
def retried() -> Any:
    kit = FaultyTools()
    kit.read("lookup", faults=["transient"])
    steps = [decide(call("lookup", {"q": 1}, id="c1")), answer("done")]
    return scripted_runtime(kit, steps).run("go")


def test_the_demo_notation_matches_the_collapsed_path(retried: Any) -> None:
    # The full path holds the dispatch self-loop twice; the demo writes each once.
    assert retried.path.count("executing") == 4
    assert_path(retried, RETRIED)
    assert_path(retried, path_line(collapsed(retried.path)))
    assert_path(retried, RETRIED.replace("→", "->"))


def test_exact_true_compares_the_notation_with_the_full_path(retried: Any) -> None:
    with pytest.raises(AssertionError, match="differs at step 3"):
        assert_path(retried, RETRIED, exact=True)
    full = " → ".join(retried.path)
    assert_path(retried, full, exact=True)
    with pytest.raises(AssertionError):
        assert_path(retried, full)  # the full path is not what the demo prints


def test_repeated_blocks_expand() -> None:
    states = ["deciding", "validating", "executing", "retry_wait", "executing", "retry_wait"]
    assert parse_path("deciding → validating → (executing → retry_wait) ×2") == states
    assert parse_path("deciding -> validating -> (executing -> retry_wait) x2") == states
    assert_path([*states, "done"], "deciding → validating → (executing → retry_wait) ×2 → done")
    assert_path(states, "validating → retry_wait", exact=False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("deciding → → done", "'→' at character 11 follows no state"),
        ("deciding done", "missing '→' before 'done'"),
        ("(deciding → done", "'(' is never closed"),
        ("deciding → done)", "unbalanced ')'"),
        ("deciding →", "ends with '→'"),
        ("deciding → d?ne", "cannot read '?ne'"),
    ],
)
def test_a_malformed_path_says_where(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_path(text)


def test_toolkit_assertions_hide_their_frames(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from fsm_agent.testing import assert_path
        def test_it():
            assert_path(["deciding", "done"], "deciding → validating")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "differs at step 1" in text
    assert "fsm_agent/testing/_assertions.py" not in text
    assert "def assert_path" not in text
