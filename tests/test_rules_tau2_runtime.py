"""The τ²-bench retail policy as rules, through a real ``Runtime``, over the 114 recorded
ground-truth tasks: every call τ² executed runs (the one τ² refused, the rules deny);
then calls that break the policy, appended to real trajectories, are denied with the
rule's id and never reach a tool. Each run's trace is proved by ``check`` (replay).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_valid_run, call, calls, say
from tau2_policy import MUTATIONS, RULES, TOOL_SPECS, Mutant, Mutate, outcome, tasks

from fsm_agent import Approval, Budget, Runtime, ScriptedModel, ToolRegistry, ToolRejected
from fsm_agent._core.canonical import canonical_json
from fsm_agent._trace.checker import check_trace

pytest.importorskip("cel_expr_python")

TASKS = tasks()
WRITES = {s["schema"]["function"]["name"] for s in TOOL_SPECS if s["mutates_state"]}


def registry(steps: list[dict[str, Any]], ran: list[tuple[str, str]]) -> ToolRegistry:
    """τ²'s tools answering with each step's recorded output (records as τ² returns
    them: parsed JSON); a call no step recorded is a test failure, never an answer."""
    outputs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for step in steps:
        outputs.setdefault((step["name"], canonical_json(step["arguments"])), []).append(step)
    tools = ToolRegistry()
    for spec in TOOL_SPECS:
        fn = spec["schema"]["function"]

        def answer(name: str = fn["name"], **arguments: Any) -> Any:
            ran.append((name, canonical_json(arguments)))
            step = outputs[(name, canonical_json(arguments))].pop(0)
            if step["error"]:
                raise (ToolRejected if name in WRITES else LookupError)(step["output"])
            return outcome(step)

        tools.register(answer, name=fn["name"], schema=fn["parameters"],
                       description=fn["description"],
                       effect="write" if fn["name"] in WRITES else "read")  # fmt: skip
    return tools


def drive(
    task: dict[str, Any], mutant: Mutant | None = None, trace: Path | None = None
) -> tuple[Any, list[tuple[str, str]]]:
    steps = task["steps"]
    ran: list[tuple[str, str]] = []
    tools = registry(steps, ran)
    before = steps if mutant is None else steps[: mutant[2]]
    script: list[Any] = [
        calls(call(f"{s['tool_call_id']}-{i}", s["name"], s["arguments"]))
        for i, s in enumerate(before)
    ]
    if mutant is not None:
        script.append(calls(call("mutant", mutant[0], mutant[1])))
    script.append(say("All done."))
    runtime = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools=tools.names(),
        approvals=[Approval(s["name"], s["arguments"]) for s in steps if s["name"] in WRITES],
        rules=RULES,
        budget=Budget(max_tool_rounds=len(steps) + 2, max_model_calls=40, max_total_calls=60),
    )
    return runtime.run(json.dumps(task["user_scenario"]["instructions"]), trace=trace), ran


def answers(result: Any) -> dict[str, Any]:
    return {m["tool_call_id"]: json.loads(m["content"]) for m in result.messages
            if m["role"] == "tool"}  # fmt: skip


def test_every_ground_truth_call_runs_under_the_policy(tmp_path: Path) -> None:
    denied: dict[tuple[str, int], str] = {}
    judged = 0
    for n, task in enumerate(TASKS):
        trace = tmp_path / f"{task['task_id']}.jsonl" if n % 12 == 0 else None
        result, ran = drive(task, trace=trace)
        assert_valid_run(result)
        assert (result.status, result.reason) == ("done", "final_answer"), result.detail
        got = answers(result)
        for i, step in enumerate(task["steps"]):
            answer = got[f"{step['tool_call_id']}-{i}"]
            if answer.get("error") == "denied_by_rule":
                denied[(str(task["task_id"]), i)] = answer["rule"]
            elif not step["error"]:
                assert answer == {"ok": True, "value": outcome(step)}
        assert len(ran) == len(task["steps"]) - sum(1 for k in denied if k[0] == task["task_id"])
        judged += sum(1 for e in result.events if e["type"] == "rule")
        if trace is not None:
            report = check_trace(trace)
            assert report.ok, report.violations
    # The one call the rules deny is the one τ²'s backend refused as well.
    assert denied == {("64", 6): "delivered-only"}
    assert judged > 100  # every write, and every read no rule matches goes unjudged


@pytest.mark.parametrize(
    ("mutate", "rule"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_a_call_that_breaks_the_policy_is_denied_and_changes_nothing(
    mutate: Mutate, rule: str, tmp_path: Path
) -> None:
    mutated = [(t, m) for t in TASKS if (m := mutate(t)) is not None]
    assert len(mutated) >= 10
    for n, (task, mutant) in enumerate(mutated):
        trace = tmp_path / f"{n}.jsonl" if n < 3 else None
        result, ran = drive(task, mutant, trace)
        assert result.status == "done"
        assert answers(result)["mutant"]["rule"] == rule, task["task_id"]
        assert answers(result)["mutant"]["error"] == "denied_by_rule"
        key = (mutant[0], canonical_json(mutant[1]))
        before = [(s["name"], canonical_json(s["arguments"])) for s in task["steps"][: mutant[2]]]
        assert ran.count(key) == before.count(key)  # the mutant never reached a tool
        (judged,) = [e for e in result.events if e["type"] == "rule" and e["call_id"] == "mutant"]
        assert (judged["rule"], judged["verdict"]) == (rule, "deny")
        if trace is not None:
            assert check_trace(trace).ok
