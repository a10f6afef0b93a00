"""Coverage of an application's own machine: unreachable edges are listed, not missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Approval, Budget, Rule, Runtime, ToolRegistry
from fsm_agent._core.table import DEFAULT_MACHINE
from fsm_agent.testing._coverage import TransitionCoverage
from fsm_agent.testing._reachability import facts_of, unreachable_edges

pytest_plugins = ["pytester"]

DESK = Path(__file__).parents[1] / "examples" / "support_desk" / "support_desk.py"


def reads_only(**options: Any) -> Runtime:
    registry = ToolRegistry()
    registry.register(lambda q: q, name="lookup", schema={"type": "object"}, effect="read")
    return Runtime(model=lambda m, t: "", tools=registry, allowed_tools=["lookup"], **options)


def why(runtime: Runtime) -> dict[str, str]:
    gone = unreachable_edges(runtime.machine, facts_of(runtime))
    return {runtime.machine.transitions[i].key: reason for i, reason in gone.items()}


def test_a_read_only_application_cannot_pause_or_conflict() -> None:
    gone = why(reads_only())
    assert gone["dispatch/executing->review_required[idempotency_conflict]"].startswith(
        "no write tool declares an idempotency key"
    )
    assert (
        "no tool requires approval"
        in gone["validate/validating->review_required[batch_needs_approval]"]
    )
    assert "no tool is a write" in gone["tool_returned/executing->review_required[is_write]"]
    assert (
        "policy is not strict"
        in gone["validate/validating->protocol_error[strict_policy,batch_has_unknown_tool]"]
    )
    assert "max_wall_clock_s" in gone["dispatch/executing->budget_exhausted[wall_clock_spent]"]
    # Nothing enters review_required, so nothing leaves it either.
    assert gone["resume/review_required->observing"] == "no possible edge enters review_required"
    assert (
        "tool_returned/executing->retry_wait[is_retryable,attempts_left,retry_fits_deadline]"
        not in gone
    )
    assert "validate/validating->done[!has_tool_calls,has_answer]" not in gone


def test_declared_facts_make_edges_reachable_again() -> None:
    gone = why(reads_only(policy="strict", budget=Budget(max_wall_clock_s=5, max_cost=1.0)))
    assert not any("strict_policy" in key or "wall_clock" in key or "cost" in key for key in gone)


def test_the_default_machine_with_every_fact_is_wholly_reachable() -> None:
    registry = ToolRegistry()
    registry.register(lambda q: q, name="lookup", schema={"type": "object"}, effect="read")
    registry.register(
        lambda k: k, name="pay", schema={"type": "object"}, effect="write",
        requires_approval=True, idempotency_key=lambda a: a["k"],
    )  # fmt: skip
    registry.register(
        lambda k: k, name="mail", schema={"type": "object"}, effect="write",
        idempotency_key=lambda a: a["k"], dedup=True,
    )  # fmt: skip
    runtime = Runtime(
        model=lambda m, t: "", tools=registry, allowed_tools=["lookup", "pay"], policy="strict",
        budget=Budget(max_tokens=9, max_cost=1.0, max_wall_clock_s=5, max_model_calls=8),
        approvals=[Approval("pay", {"k": "1"}, max_uses=1)],
        rules=[Rule("eight-model-calls", on="before_model", then="limit", limit=8)],
    )  # fmt: skip
    assert why(runtime) == {}


def test_model_calls_past_the_rounds_and_a_resume_without_dedup_are_unreachable() -> None:
    gone = why(reads_only(budget=Budget(max_tool_rounds=6, max_model_calls=7)))
    assert gone["observe/observing->budget_exhausted[model_calls_spent]"] == (
        "the model is asked at most max_tool_rounds + 1 = 7 times, so max_model_calls = 7 is "
        "never reached (guard model_calls_spent)"
    )
    assert gone["resume/executing->executing"].startswith("no write declares downstream dedup")
    # One model call per round reaches the limit at the last round's observe.
    assert not any(
        "model_calls" in key
        for key in why(reads_only(budget=Budget(max_tool_rounds=6, max_model_calls=6)))
    )


def test_unreachable_edges_are_not_counted_but_listed() -> None:
    runtime = reads_only()
    gone = unreachable_edges(runtime.machine, facts_of(runtime))
    coverage = TransitionCoverage(DEFAULT_MACHINE, gone)
    assert len(coverage.reachable()) == len(DEFAULT_MACHINE.transitions) - len(gone)
    coverage.hits = [0 if i in gone else 1 for i in range(len(coverage.hits))]
    assert coverage.percent == 100.0
    lines = coverage.report_lines()
    assert any(line.startswith("unreachable: #") and "no tool is a write" in line for line in lines)
    assert f"({len(gone)} unreachable, not counted)" in lines[-len(gone) - 1]


def test_fsm_app_measures_the_application_machine(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(support_desk=DESK.read_text(encoding="utf-8"))
    pytester.makepyfile(
        test_desk="""
        from fsm_agent.testing import AgentUnderTest, KeyedScriptedModel, call, decide
        from support_desk import make_runtime

        def test_lookup():
            model = KeyedScriptedModel({
                None: decide(call("lookup_order", {"order_id": "A17"}, id="c1")),
                "c1": "Delivered.",
            })
            AgentUnderTest(make_runtime).run("Where is A17?", model=model)
        """
    )
    html = pytester.path / "cov"
    result = pytester.runpytest_inprocess(
        "--fsm-app", "support_desk:make_runtime", f"--fsm-coverage-html={html}",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    # The desk sets no wall-clock/token/cost budget and runs the default policy.
    assert "unreachable: #" in out and "the budget sets no max_wall_clock_s" in out
    assert "(12 unreachable, not counted)" in out
    page = (html / "index.html").read_text(encoding="utf-8")
    assert "background:#999999" in page and "unreachable: the policy is not strict" in page


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("support_desk", "must be MODULE:FACTORY"),
        ("no_such_module:make", "cannot import 'no_such_module'"),
        ("support_desk:nothing", "has no callable 'nothing'"),
        ("support_desk:Backend", "Backend(model=...) raised TypeError"),
    ],
)
def test_a_bad_fsm_app_is_a_usage_error(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    pytester.makepyfile(support_desk=DESK.read_text(encoding="utf-8"))
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_inprocess("--fsm-app", value, "-p", "no:cacheprovider")
    assert message in result.stderr.str()


def test_the_desk_s_own_tests_take_every_edge_it_can_in_under_60_lines(
    pytester: pytest.Pytester,
) -> None:
    tests = (DESK.parent / "test_support_desk.py").read_text(encoding="utf-8")
    assert len(tests.splitlines()) < 60
    pytester.makepyfile(support_desk=DESK.read_text(encoding="utf-8"), test_support_desk=tests)
    result = pytester.runpytest_inprocess(
        "--fsm-app", "support_desk:make_runtime", "--fsm-coverage-fail-under=100",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    assert "transition coverage: 39/39 = 100.0% (12 unreachable, not counted)" in out
    assert "never taken" not in out
