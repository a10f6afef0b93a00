"""fuzz_agent: runs drawn from the application's schemas, invariants checked on each."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fsm_agent.models._scripted import ScriptedModel
from fsm_agent.testing import AgentUnderTest
from fsm_agent.testing._fuzz import FUZZ_FAULTS, FuzzFailure, FuzzRun, corpus, fuzz_agent, replay

DESK = Path(__file__).parents[1] / "examples" / "support_desk" / "support_desk.py"
WRITES = ["issue_refund", "send_email"]


def planted(tmp_path: Path, name: str, old: str, new: str) -> ModuleType:
    """A copy of the support desk with one bug planted in its registration."""
    source = DESK.read_text(encoding="utf-8")
    assert old in source
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def one_call(tool: str, arguments: str, faults: list[str]) -> FuzzRun:
    call = {"id": "r1c1", "type": "function", "function": {"name": tool, "arguments": arguments}}
    decisions: list[Any] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "Done."},
    ]
    return FuzzRun(decisions, {tool: faults}, [True])


@pytest.fixture
def desk_read(tmp_path: Path) -> ModuleType:
    return planted(tmp_path, "desk_read", 'EMAIL, effect="write"', 'EMAIL, effect="read"')


@pytest.fixture
def desk_dedup(tmp_path: Path) -> ModuleType:
    key = 'idempotency_key=lambda args: args["order_id"],'
    return planted(tmp_path, "desk_dedup", key, key + " dedup=True,")


def test_the_support_desk_keeps_every_invariant() -> None:
    sys.path.insert(0, str(DESK.parent))
    from support_desk import make_runtime

    fuzz_agent(make_runtime, writes=WRITES, max_examples=60, seed=1)


def test_a_write_registered_as_a_read_runs_twice(desk_read: ModuleType) -> None:
    run = one_call("send_email", '{"to": "ann", "body": "hi"}', ["lost_response"])
    agent = AgentUnderTest(desk_read.make_runtime, faults=run.faults, writes=WRITES)
    assert replay(agent, run) == [
        "write 'send_email' ran 2 times as one call: calls 'r1c1', 'r1c1'"
    ]


def test_a_false_dedup_claim_refunds_twice(desk_dedup: ModuleType) -> None:
    run = one_call("issue_refund", '{"order_id": "A17", "amount": 3}', ["lost_response"])
    agent = AgentUnderTest(desk_dedup.make_runtime, faults=run.faults, writes=WRITES)
    assert replay(agent, run) == [
        "write 'issue_refund' ran 2 times with key \"A17\": calls 'r1c1', 'r1c1'"
    ]


def test_the_fuzz_run_finds_the_planted_bug_and_prints_a_test(desk_read: ModuleType) -> None:
    with pytest.raises(FuzzFailure) as info:
        fuzz_agent(desk_read.make_runtime, writes=WRITES, seed=0)
    test = info.value.test
    assert "from desk_read import make_runtime" in test
    assert "def test_fuzz_reproduction():" in test and "'send_email'" in test
    namespace: dict[str, Any] = {}
    exec(compile(test, "reproduction", "exec"), namespace)  # the printed test runs
    with pytest.raises(AssertionError):
        namespace["test_fuzz_reproduction"]()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("bug", ["desk_read", "desk_dedup"])
def test_every_planted_bug_is_found_on_every_seed(
    bug: str, seed: int, request: pytest.FixtureRequest
) -> None:
    desk = request.getfixturevalue(bug)
    with pytest.raises(FuzzFailure) as info:
        fuzz_agent(desk.make_runtime, writes=WRITES, seed=seed)  # the default budget
    assert "ran 2 times" in str(info.value)
    # The corpus run that shows it is one call and the final answer: nothing to shrink.
    assert info.value.test.count("'tool_calls'") == 1


def test_the_corpus_calls_each_tool_once_under_each_fault() -> None:
    sys.path.insert(0, str(DESK.parent))
    from support_desk import make_runtime

    tools = list(make_runtime(model=ScriptedModel([])).tools)
    runs = corpus(tools)
    assert len(runs) == len(tools) * len(FUZZ_FAULTS)
    assert {(tool, faults[0]) for run in runs for tool, faults in run.faults.items()} == {
        (t.name, f) for t in tools for f in FUZZ_FAULTS
    }
    refund = next(r for r in runs if "issue_refund" in r.faults)
    arguments = refund.decisions[0]["tool_calls"][0]["function"]["arguments"]
    validator = next(t for t in tools if t.name == "issue_refund").validator
    assert validator is not None and validator.is_valid(json.loads(arguments))
