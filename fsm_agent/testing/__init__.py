"""Testing toolkit for fsm-agent runs: fault tools, scripted decisions, assertions,
paths through the machine and per-transition scenarios.

The pytest plugin (``fsm_agent.testing._plugin``, registered through the ``pytest11``
entry point) adds fixtures and ``--fsm-coverage``. Hypothesis strategies live in
``fsm_agent.testing._strategies`` and are imported only when asked for, so this package
needs neither pytest nor Hypothesis.
"""

from fsm_agent.models._scripted import KeyedScriptedModel, ScriptedModel
from fsm_agent.testing._agent import CRASH_REQUESTS, AgentUnderTest, Execution, Ledger
from fsm_agent.testing._assertions import (
    assert_history_valid,
    assert_no_duplicate_writes,
    assert_path,
    assert_stopped,
    assert_trace_legal,
    duplicate_writes,
)
from fsm_agent.testing._decisions import answer, call, decide
from fsm_agent.testing._faults import (
    BEHAVIOURS,
    KEY_SCHEMA,
    FakeClock,
    FaultyTool,
    FaultyTools,
    InjectedInterrupt,
    ProcessDied,
    SideEffect,
    ToolFaults,
)
from fsm_agent.testing._mortal import Mortal
from fsm_agent.testing._paths import (
    Path,
    is_path,
    paths,
    shortest_paths,
)
from fsm_agent.testing._scenarios import (
    Scenario,
    ScenarioRun,
    record_transitions,
    scripted_runtime,
)
from fsm_agent.testing._suite import SUITE, missing, scenario_for


def __getattr__(name: str) -> object:
    # The fuzzer needs Hypothesis, which the rest of the toolkit does not: imported only
    # when asked for.
    if name in ("fuzz_agent", "corpus", "FuzzRun", "FuzzFailure", "replay"):
        from fsm_agent.testing import _fuzz

        return getattr(_fuzz, name)
    raise AttributeError(f"module 'fsm_agent.testing' has no attribute {name!r}")


__all__ = [
    "BEHAVIOURS",
    "CRASH_REQUESTS",
    "KEY_SCHEMA",
    "SUITE",
    "AgentUnderTest",
    "Execution",
    "FakeClock",
    "FaultyTool",
    "FaultyTools",
    "FuzzFailure",
    "FuzzRun",
    "InjectedInterrupt",
    "KeyedScriptedModel",
    "Ledger",
    "Mortal",
    "Path",
    "ProcessDied",
    "Scenario",
    "ScenarioRun",
    "ScriptedModel",
    "SideEffect",
    "ToolFaults",
    "answer",
    "assert_history_valid",
    "assert_no_duplicate_writes",
    "assert_path",
    "assert_stopped",
    "assert_trace_legal",
    "call",
    "corpus",
    "decide",
    "duplicate_writes",
    "fuzz_agent",
    "is_path",
    "missing",
    "paths",
    "record_transitions",
    "replay",
    "scenario_for",
    "scripted_runtime",
    "shortest_paths",
]
