"""Property-based fuzzing of whole runs: every run keeps every invariant.

The Hypothesis profile comes from ``FSM_AGENT_FUZZ_PROFILE``: ``ci`` (the default, 500
examples, what ``make test`` runs) or ``fuzz`` (50,000; ``make fuzz`` uses
``benchmarks/fuzz.py``, which also reports examples per second).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, settings

from fsm_agent import Budget, RetryPolicy
from fsm_agent.testing._strategies import (
    FuzzCase,
    ModelStep,
    ToolConfig,
    cases,
    invariant_problems,
    run_case,
)

settings.register_profile(
    "ci",
    max_examples=500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=50_000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("FSM_AGENT_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "fuzz"):
    raise pytest.UsageError(f"FSM_AGENT_FUZZ_PROFILE must be 'ci' or 'fuzz', got {PROFILE!r}")


@settings(settings.get_profile(PROFILE))
@given(cases())
def test_every_run_keeps_every_invariant(case: FuzzCase) -> None:
    outcome = run_case(case)
    for result in outcome.results:
        event(f"{result.status}/{result.reason}")
    problems = invariant_problems(outcome)
    assert problems == [], "\n".join(problems)


def _case(*scripts: list[ModelStep], **tool: object) -> FuzzCase:
    ticket = ToolConfig("create_ticket", "write", **tool)  # type: ignore[arg-type]
    return FuzzCase(
        tools=[ToolConfig("lookup", "read"), ticket],
        allowed=["lookup", "create_ticket"],
        approvals=[],
        budget=Budget(),
        retry=RetryPolicy(),
        policy="default",
        scripts=list(scripts),
    )


def _ticket(call_id: str, key: str, title: str = "refund") -> ModelStep:
    args = f'{{"key": "{key}", "title": "{title}"}}'
    return ModelStep(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "create_ticket", "arguments": args},
                }
            ],
        }
    )


def test_the_checker_sees_a_write_that_ran_twice() -> None:
    """The invariants can fail: a run whose write took effect twice is reported."""
    outcome = run_case(_case([_ticket("c1", "K1"), _ticket("c2", "K1")], idempotent=True))
    assert invariant_problems(outcome) == []
    outcome.kit["create_ticket"].effects.append(outcome.kit["create_ticket"].effects[0])
    assert invariant_problems(outcome) == ["create_ticket: key 'K1' took effect 2 times"]


def test_the_checker_sees_a_write_without_approval() -> None:
    outcome = run_case(_case([_ticket("c1", "K1")], requires_approval=True))
    assert outcome.results[0].status == "review_required"
    assert invariant_problems(outcome) == []
    outcome.kit["create_ticket"].calls.append({"key": "K1", "title": "refund"})
    assert invariant_problems(outcome) == [
        "create_ticket ran with {'key': 'K1', 'title': 'refund'} without a matching approval"
    ]


def test_the_checker_sees_a_broken_history_and_trace() -> None:
    outcome = run_case(_case([_ticket("c1", "K1")], faults=("error_after_effect",)))
    result = outcome.results[0]
    assert result.status == "review_required"
    del result.messages[-1]
    result.events.append({"type": "observation", "seq": len(result.events)})
    problems = invariant_problems(outcome)
    assert any("returned history" in p and "never answered" in p for p in problems), problems
    assert any("after the run ended" in p for p in problems), problems


def test_a_reused_call_id_in_a_later_batch_is_answered_on_stop() -> None:
    """Regression (found by the fuzzer): ids are unique per batch, not per run. A later
    batch reusing an id must still get every call answered when the run stops."""
    read = ModelStep(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "A17"}'},
                }
            ],
        }
    )
    outcome = run_case(_case([read, _ticket("c1", "K1")], requires_approval=True))
    assert outcome.results[0].reason == "approval_required"
    assert invariant_problems(outcome) == []
