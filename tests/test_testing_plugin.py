"""The pytest plugin: options, usage errors, the coverage report and the HTML output."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fsm_agent._core.table import TRANSITIONS, edge_by_key
from fsm_agent.testing._coverage import TransitionCoverage, to_dot

pytest_plugins = ["pytester"]

#: The share of the table one final-answer run takes (two edges).
#: ``begin`` is left out of the default machine's count: only a machine with rules takes it.
COUNTED = len(TRANSITIONS) - 1
ONE_RUN_PCT = f"{100 * 2 / COUNTED:.1f}%"

ONE_RUN = """
from fsm_agent.testing import answer, assert_stopped

def test_answer(fsm_runtime):
    assert_stopped(fsm_runtime([answer("hi")]).run("?"), "done", "final_answer")
"""


#: The two edges a one-answer run takes, found by key (rows may be added before them).
def _index(key: str) -> int:
    edge = edge_by_key(key)
    assert edge is not None, key
    return edge.index


REPLIED = _index("model_replied/deciding->validating")
DONE = _index("validate/validating->done[!has_tool_calls,has_answer]")


def test_coverage_report_lists_every_transition(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_RUN)
    result = pytester.runpytest_inprocess("--fsm-coverage", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "fsm-agent transition coverage" in out
    assert f"transition coverage: 2/{COUNTED} = {ONE_RUN_PCT} (1 unreachable, not counted)" in out
    begin = "unreachable: #50 begin (deciding -> deciding): taken only by a machine whose rules"
    assert begin in out
    result.stdout.fnmatch_lines(
        [
            f"{REPLIED} *model_replied*deciding -> validating*-*1",
            f"{DONE} *validate*validating -> done*!has_tool_calls, has_answer*1",
            # An edge never taken is listed with its meaning (its rule text).
            "never taken: #0 model_replied [reply_too_large] (deciding -> budget_exhausted): "
            "R9/R12: a reply larger than its size budget is neither read nor run",
        ]
    )


def test_fail_under_fails_the_session_below_the_share(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_RUN)
    result = pytester.runpytest_inprocess("--fsm-coverage-fail-under=50")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [f"FAIL: transition coverage {ONE_RUN_PCT} is below --fsm-coverage-fail-under=50"]
    )
    passing = pytester.runpytest_inprocess("--fsm-coverage-fail-under=1")
    assert passing.ret == pytest.ExitCode.OK


def test_without_the_option_nothing_is_reported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_RUN)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1)
    assert "transition coverage" not in result.stdout.str()


@pytest.mark.parametrize("value", ["abc", "101", "-1", "nan", "inf", ""])
def test_bad_fail_under_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(ONE_RUN)
    result = pytester.runpytest_inprocess(f"--fsm-coverage-fail-under={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: --fsm-coverage-fail-under must be a number from 0 to 100, got '{value}'"]
    )


def test_html_writes_the_diagram_and_table(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(ONE_RUN)
    out = tmp_path / "cov" / "html"
    result = pytester.runpytest_inprocess(f"--fsm-coverage-html={out}")
    result.assert_outcomes(passed=1)
    page = (out / "index.html").read_text(encoding="utf-8")
    dot = (out / "coverage.dot").read_text(encoding="utf-8")
    assert f"Transition coverage: {ONE_RUN_PCT}" in page
    assert page.count("<tr><td>") == len(TRANSITIONS)
    assert page.count("background:#d62728") == COUNTED - 2  # never taken: red
    assert "validating -> done" in dot and "final_answer  ×1" in dot
    assert ("<svg" in page) == (out / "coverage.svg").exists()
    result.stdout.fnmatch_lines([f"wrote {out / 'index.html'}"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_html_dir_is_a_usage_error_unprivileged(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    pytester.makepyfile(ONE_RUN)
    result = pytester.runpytest_inprocess(f"--fsm-coverage-html={locked}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_html_dir_that_is_a_file_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    pytester.makepyfile(ONE_RUN)
    result = pytester.runpytest_inprocess(f"--fsm-coverage-html={blocker / 'sub'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: --fsm-coverage-html: cannot write to directory "
            f"'{blocker / 'sub'}': Not a directory"
        ]
    )


def test_dot_is_a_heat_map_of_hits() -> None:
    cov = TransitionCoverage()
    cov.hits[REPLIED] = 20
    cov.hits[DONE] = 1
    lines = {
        line.split(" [")[0].strip(): line for line in to_dot(cov).splitlines() if " -> " in line
    }
    assert "×20" in lines["deciding -> validating"]
    assert "×1" in lines["validating -> done"]
    assert 'color="#c8c8c8"' in lines["deciding -> budget_exhausted"]  # never taken: grey
    assert "penwidth" not in lines["deciding -> budget_exhausted"]
    busy = float(re.findall(r"penwidth=([\d.]+)", lines["deciding -> validating"])[0])
    rare = float(re.findall(r"penwidth=([\d.]+)", lines["validating -> done"])[0])
    assert busy > rare
    assert f"transition coverage {100 * 2 / len(TRANSITIONS):.1f}%" in to_dot(cov)


def test_coverage_counts_only_while_installed() -> None:
    from fsm_agent.testing import answer, scripted_runtime
    from fsm_agent.testing._faults import FaultyTools

    cov = TransitionCoverage()
    runtime = scripted_runtime(FaultyTools(), [answer("a"), answer("b")])
    runtime.run("?")
    assert cov.percent == 0.0
    cov.install()
    cov.install()  # idempotent: a transition is counted once
    try:
        scripted_runtime(FaultyTools(), [answer("a")]).run("?")
    finally:
        cov.uninstall()
    assert cov.hits[REPLIED] == 1 and cov.hits[DONE] == 1 and sum(cov.hits) == 2


def test_coverages_uninstalled_in_the_order_installed_leave_none_behind() -> None:
    # Installed a, b and removed a, b (not b, a): a context-variable token reset out of
    # turn restored b's view, which still held a, and a watched every later run.
    from fsm_agent.testing import answer, scripted_runtime
    from fsm_agent.testing._faults import FaultyTools

    first, second, later = TransitionCoverage(), TransitionCoverage(), TransitionCoverage()
    first.install()
    second.install()
    first.uninstall()
    second.uninstall()
    later.install()
    try:
        scripted_runtime(FaultyTools(), [answer("a")]).run("?")
    finally:
        later.uninstall()
    assert sum(first.hits) == 0 and sum(second.hits) == 0 and sum(later.hits) == 2


def test_importing_the_package_and_toolkit_needs_neither_pytest_nor_hypothesis() -> None:
    import subprocess
    import sys

    code = (
        "import sys, fsm_agent, fsm_agent.testing; "
        "print(sorted(m for m in ('pytest', 'hypothesis', '_pytest') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
