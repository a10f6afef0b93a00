"""The fsm-agent pytest plugin (entry point ``pytest11``: ``fsm_agent``).

Fixtures
    ``fsm_clock``    a :class:`FakeClock` (no test waits for a backoff or a deadline)
    ``fsm_tools``    a :class:`FaultyTools` kit on that clock: ``fsm_tools.read(...)``
    ``fsm_model``    ``fsm_model([decision, ...])`` -> a :class:`ScriptedModel`
    ``fsm_runtime``  ``fsm_runtime([decision, ...], budget=..., ...)`` -> a ``Runtime``
                     over ``fsm_tools`` and ``fsm_clock``
    ``fsm_agent``    ``fsm_agent(make_runtime, faults={...}, **factory_options)`` -> an
                     :class:`AgentUnderTest`: your own runtime factory, faults per tool
                     and a ledger of what ran

Options
    ``--fsm-coverage``                 count every transition every run takes; print the table
    ``--fsm-coverage-fail-under=PCT``  fail the session below PCT % of transitions taken
    ``--fsm-coverage-html=DIR``        write the diagram coloured by hit count into DIR
    ``--fsm-app=MODULE:FACTORY``       measure that application's machine (its runtime
                                       factory's ``runtime.machine``), edges it cannot take
                                       reported as unreachable and not counted
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import tempfile
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent._core.table import DEFAULT_MACHINE
from fsm_agent._runtime.runtime import Runtime
from fsm_agent.models._scripted import ScriptedModel, Step
from fsm_agent.testing._agent import AgentUnderTest
from fsm_agent.testing._coverage import TransitionCoverage, write_html
from fsm_agent.testing._faults import FakeClock, FaultyTools
from fsm_agent.testing._reachability import facts_of, rules_only_edges, unreachable_edges
from fsm_agent.testing._scenarios import scripted_runtime

_KEY = pytest.StashKey["_CoverageSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsm-agent", "fsm-agent transition coverage")
    group.addoption(
        "--fsm-coverage",
        action="store_true",
        default=False,
        help="report which transitions of the run machine the tests took",
    )
    group.addoption(
        "--fsm-coverage-fail-under",
        metavar="PCT",
        default=None,
        help="fail if fewer than PCT %% of the transitions were taken "
        "(0-100; implies --fsm-coverage)",
    )
    group.addoption(
        "--fsm-app",
        metavar="MODULE:FACTORY",
        default=None,
        help="measure the machine of the application whose runtime factory this names "
        "(called with model=...; implies --fsm-coverage); edges its tools, policy and "
        "budget cannot take are reported as unreachable and not counted",
    )
    group.addoption(
        "--fsm-coverage-html",
        metavar="DIR",
        default=None,
        help="write the machine diagram coloured by hit count into DIR (implies --fsm-coverage)",
    )


def parse_fail_under(text: str) -> float:
    """``--fsm-coverage-fail-under``'s value as a percentage, or ``pytest.UsageError``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise pytest.UsageError(
            f"--fsm-coverage-fail-under must be a number from 0 to 100, got {text!r}"
        )
    return value


def check_html_dir(text: str) -> Path:
    """``--fsm-coverage-html``'s directory, created and proven writable now, so a bad path
    is a usage error before the tests run rather than a lost report after."""
    if not text:
        raise pytest.UsageError("--fsm-coverage-html needs a directory name")
    directory = Path(text)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".fsm-coverage-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise pytest.UsageError(
            f"--fsm-coverage-html: cannot write to directory {text!r}: {reason}"
        ) from None
    return directory


def load_app(text: str, rootdir: Path) -> Runtime:
    """The runtime ``--fsm-app MODULE:FACTORY`` names, built with a placeholder model (the
    machine and the tools are what coverage needs), or ``pytest.UsageError``."""
    module_name, _, attribute = text.partition(":")
    if not module_name or not attribute:
        raise pytest.UsageError(
            f"--fsm-app must be MODULE:FACTORY (e.g. support_desk:make_runtime), got {text!r}"
        )
    for place in (str(rootdir), os.getcwd()):
        if place not in sys.path:
            sys.path.insert(0, place)  # so a module next to the tests imports as pytest's own
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise pytest.UsageError(f"--fsm-app {text}: cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise pytest.UsageError(
            f"--fsm-app {text}: module {module_name!r} has no callable {attribute!r}"
        )
    try:
        runtime = factory(model=ScriptedModel([]))
    except Exception as exc:  # the application's own error, reported as the option's
        raise pytest.UsageError(
            f"--fsm-app {text}: {attribute}(model=...) raised {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(runtime, Runtime):
        raise pytest.UsageError(
            f"--fsm-app {text}: {attribute}(model=...) returned {type(runtime).__name__}, "
            "not a Runtime"
        )
    return runtime


class _CoverageSession:
    def __init__(
        self,
        fail_under: float | None,
        html_dir: Path | None,
        coverage: TransitionCoverage | None = None,
    ) -> None:
        if coverage is None:  # the default machine: no runtime's facts to judge by
            coverage = TransitionCoverage(DEFAULT_MACHINE, rules_only_edges(DEFAULT_MACHINE))
        self.coverage = coverage
        self.fail_under = fail_under
        self.html_dir = html_dir
        self.failed = False
        self.written: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    fail_text = config.getoption("--fsm-coverage-fail-under")
    html_text = config.getoption("--fsm-coverage-html")
    app_text = config.getoption("--fsm-app")
    enabled = (
        bool(config.getoption("--fsm-coverage"))
        or fail_text is not None
        or html_text is not None
        or app_text is not None
    )
    if not enabled:
        return
    fail_under = parse_fail_under(fail_text) if fail_text is not None else None
    html_dir = check_html_dir(html_text) if html_text is not None else None
    coverage = None
    if app_text is not None:
        runtime = load_app(app_text, config.rootpath)
        coverage = TransitionCoverage(
            runtime.machine, unreachable_edges(runtime.machine, facts_of(runtime))
        )
    state = _CoverageSession(fail_under, html_dir, coverage)
    state.coverage.install()
    config.stash[_KEY] = state


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is not None:
        state.coverage.uninstall()


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    result = yield
    state = session.config.stash.get(_KEY, None)
    # Only a session that ran tests is judged: `--collect-only` and `-k nothing` take
    # no transitions, and failing them on coverage would only hide the real outcome.
    if (
        state is not None
        and state.fail_under is not None
        and session.testscollected
        and (not session.config.option.collectonly)
        and state.coverage.percent < state.fail_under
    ):
        state.failed = True
        session.testsfailed += 1
    if state is not None and state.html_dir is not None:
        state.written = write_html(state.html_dir, state.coverage)
    return result


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is None:
        return
    tr = terminalreporter
    tr.write_sep("-", "fsm-agent transition coverage")
    for line in state.coverage.report_lines():
        tr.write_line(line)
    for path in state.written:
        tr.write_line(f"wrote {os.fspath(path)}")
    if state.failed:
        tr.write_line(
            f"FAIL: transition coverage {state.coverage.percent:.1f}% is below "
            f"--fsm-coverage-fail-under={state.fail_under:g}",
            red=True,
            bold=True,
        )


# ── fixtures ────────────────────────────────────────────────────────────────────────


@pytest.fixture
def fsm_clock() -> FakeClock:
    """A fake monotonic clock; pass ``clock=fsm_clock, sleep=fsm_clock.sleep``."""
    return FakeClock()


@pytest.fixture
def fsm_tools(fsm_clock: FakeClock) -> FaultyTools:
    """A kit of fault-injecting tools sharing ``fsm_clock``."""
    return FaultyTools(clock=fsm_clock)


@pytest.fixture
def fsm_model() -> Callable[[Sequence[Step]], ScriptedModel]:
    """``fsm_model(steps)``: a :class:`ScriptedModel` replaying ``steps``."""
    return lambda steps: ScriptedModel(list(steps))


@pytest.fixture
def fsm_runtime(fsm_tools: FaultyTools) -> Callable[..., Runtime]:
    """``fsm_runtime(steps, **runtime_options)``: a ``Runtime`` over ``fsm_tools`` (all
    allowed unless ``allowed_tools=`` says otherwise) and its fake clock."""

    def build(steps: Sequence[Step], **options: Any) -> Runtime:
        return scripted_runtime(fsm_tools, steps, **options)

    return build


@pytest.fixture
def fsm_agent() -> Callable[..., AgentUnderTest]:
    """``fsm_agent(factory, faults={tool: [behaviour, ...]}, writes=None, **options)``:
    the application's own runtime factory under test (see ``testing/agent.py``)."""
    return AgentUnderTest
