"""Real schemas, real calls: the 114 ground-truth τ²-bench retail trajectories.

Every trajectory is replayed through the runtime: the model issues each recorded call,
the tool returns the recorded output (an error step raises), writes need approvals that
trusted configuration issues for exactly the recorded arguments. Our strictness (closed
objects, no coercion) must accept every real call, and the rules must hold on each run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_valid_run, call, calls, say

from fsm_agent import (
    Approval,
    Budget,
    Runtime,
    ScriptedModel,
    ToolRegistry,
    ToolRejected,
)
from fsm_agent._core.canonical import canonical_json

DATA = Path(__file__).parent / "data" / "tau2_retail"
TOOLS = json.loads((DATA / "tau2_retail_tools.json").read_text())
TASKS = [
    json.loads(line)
    for line in (DATA / "tau2_retail_gt_trajectories.jsonl").read_text().splitlines()
]
WRITES = {t["schema"]["function"]["name"] for t in TOOLS if t["mutates_state"]}


def registry(steps: list[dict[str, Any]], executed: list[tuple[str, str]]) -> ToolRegistry:
    """Tools that answer with the recorded output of the matching step."""
    outputs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for step in steps:
        key = (step["name"], canonical_json(step["arguments"]))
        outputs.setdefault(key, []).append(step)
    tools = ToolRegistry()
    for spec in TOOLS:
        fn = spec["schema"]["function"]
        name = fn["name"]

        def answer(name: str = name, **arguments: Any) -> Any:
            step = outputs[(name, canonical_json(arguments))].pop(0)
            executed.append((name, canonical_json(arguments)))
            if step["error"]:
                raise (ToolRejected if name in WRITES else LookupError)(step["output"])
            return step["output"]

        write = name in WRITES
        tools.register(
            answer,
            name=name,
            schema=fn["parameters"],
            description=fn["description"],
            effect="write" if write else "read",
            requires_approval=write,
            idempotency_key=(lambda a: canonical_json(a)) if write else None,
        )
    return tools


def replay(task: dict[str, Any], *, policy: str = "default", mutate: Any = None) -> Any:
    steps = task["steps"]
    executed: list[tuple[str, str]] = []
    tools = registry(steps, executed)
    script: list[Any] = []
    for i, step in enumerate(steps):
        arguments = mutate(step) if mutate else step["arguments"]
        script.append(calls(call(f"{step['tool_call_id']}-{i}", step["name"], arguments)))
    script.append(say("All done."))
    approvals = [Approval(s["name"], s["arguments"]) for s in steps if s["name"] in WRITES]
    runtime = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools=tools.names(),
        approvals=approvals,
        policy=policy,  # type: ignore[arg-type]
        budget=Budget(max_tool_rounds=len(steps) + 1, max_model_calls=40, max_total_calls=60),
    )
    return runtime.run(json.dumps(task["user_scenario"]["instructions"])), executed


@pytest.mark.parametrize("task", TASKS, ids=[t["task_id"] for t in TASKS])
def test_ground_truth_trajectory_replays_cleanly(task: dict[str, Any]) -> None:
    result, executed = replay(task)
    assert_valid_run(result)
    assert (result.status, result.reason) == ("done", "final_answer"), result.detail
    answers = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"]
    assert len(answers) == len(task["steps"])
    for step, answer in zip(task["steps"], answers, strict=True):
        if step["error"]:
            assert answer["ok"] is False and step["output"] in answer["detail"]
        else:
            assert answer == {"ok": True, "value": step["output"]}
    assert len(executed) == len(task["steps"])  # no refusals: real calls pass strict schemas
    writes = sum(1 for s in task["steps"] if s["name"] in WRITES)
    assert result.counters["write_attempts"] == writes


def test_the_corpus_is_what_we_think() -> None:
    assert len(TASKS) == 114 and len(TOOLS) == 16
    assert sum(len(t["steps"]) for t in TASKS) == 550
    assert len(WRITES) == 7


def _first_write(task: dict[str, Any]) -> bool:
    return any(s["name"] in WRITES and not s["error"] for s in task["steps"])


WRITE_TASKS = [t for t in TASKS if _first_write(t)][:20]


@pytest.mark.parametrize("task", WRITE_TASKS, ids=[t["task_id"] for t in WRITE_TASKS])
def test_an_extra_field_on_a_write_is_refused_and_under_strict_stops(task: dict[str, Any]) -> None:
    def confirm(step: dict[str, Any]) -> dict[str, Any]:
        extra = {"confirmed": True} if step["name"] in WRITES else {}
        return {**step["arguments"], **extra}

    result, executed = replay(task, policy="strict", mutate=confirm)
    assert_valid_run(result)
    assert (result.status, result.reason) == ("protocol_error", "invalid_arguments")
    assert not any(name in WRITES for name, _ in executed)


@pytest.mark.parametrize("task", WRITE_TASKS, ids=[t["task_id"] for t in WRITE_TASKS])
def test_a_write_with_changed_arguments_needs_a_new_approval(task: dict[str, Any]) -> None:
    def tamper(step: dict[str, Any]) -> dict[str, Any]:
        if step["name"] not in WRITES:
            return dict(step["arguments"])
        arguments = dict(step["arguments"])
        first = sorted(k for k, v in arguments.items() if isinstance(v, str))[0]
        arguments[first] = arguments[first] + " "
        return arguments

    result, executed = replay(task, mutate=tamper)
    assert_valid_run(result)
    assert (result.status, result.reason) == ("review_required", "approval_required")
    assert not any(name in WRITES for name, _ in executed)
