"""The support desk's tests: every edge its machine can take (docs/guides/testing.md)."""

import contextlib
from typing import Any

import pytest
from support_desk import make_runtime

from fsm_agent import ReviewError
from fsm_agent.testing import AgentUnderTest, KeyedScriptedModel, assert_no_duplicate_writes, call
from fsm_agent.testing import decide as do


# fmt: off
def looks(n: int, at: str = "c") -> dict[str, Any]:  # n order lookups in one decision
    return do(*[call("lookup_order", {"order_id": f"A{i:02}"}, id=f"{at}{i}") for i in range(n)])
def f(tool: str, *faults: str, **harness: Any) -> dict[str, Any]:  # faults for one tool
    return {"faults": {tool: list(faults)}, **harness}
L, E, OK, UNK, CUT = "lookup_order", "send_email", "final_answer", "outcome_unknown", "cancelled"
FIND, MAIL = {None: looks(1), "c0": "."}, {None: do(call(E, {"to": "ann", "body": "-"})), "c1": "."}
REFUND, TWICE, CONFLICT = ({None: do(*[call("issue_refund", {"order_id": "A17", "amount": a},
    id=f"c{n}") for n, a in enumerate(amounts)]), f"c{len(amounts) - 1}": "Done."}
    for amounts in [(42,), (42, 42), (42, 9)])
CASES = [  # (the model's script, the harness, the reviewer's steps, the reason the run ends)
    (FIND, f(L, "transient"), (), OK), (FIND, f(L, "raise"), (), OK),
    (FIND, f(L, "not_started"), (), OK), (FIND, f(L, "oversized"), (), "tool_output"),
    (FIND, f(L, "interrupt"), (), CUT), (FIND, f(L, "transient", cancel_on_entering="retry_wait"),
    (), CUT), *((FIND, {"cancel_on_entering": s}, (), CUT) for s in ("validating", "observing",
    "deciding")), ({None: do(call(L, {"order_id": "bad"})), "c1": "Sorry."}, {}, (), OK),
    ({None: looks(9)}, {}, (), "calls_per_round"), ({None: looks(8), "c7": looks(5, "d")}, {}, (),
    "total_calls"), ({None if k == 0 else f"{k - 1}0": looks(1, str(k)) for k in range(7)}, {}, (),
    "tool_rounds"), ({None: do(*looks(1)["tool_calls"] * 2)}, {}, (), "duplicate_tool_call_id"),
    ({None: do(call(L, no_id=True))}, {}, (), "missing_tool_call_id"),
    ({None: {"role": "assistant", "tool_calls": [{}]}}, {}, (), "malformed_decision"),
    ({None: ""}, {}, (), "empty_answer"), ({None: OSError()}, {}, (), "model_error"),
    ({None: "x" * 4_000_001}, {}, (), "reply_size"), (MAIL, f(E, "rejected"), (), OK),
    (MAIL, f(E, "interrupt_after_effect"), (), UNK), (MAIL, {"crash_at": "tool_returned"},
    ("go",), UNK), (TWICE, {}, ("+c0", "+c1"), OK), (CONFLICT, {}, ("+c0", "+c1"),
    "idempotency_conflict"), (REFUND, {"crash_at": "tool_returned"}, ("+c0", "go"), OK),
    (TWICE, f("issue_refund", "lost_response"), ("+c0", "+c1", "!c0", "-c0"), UNK),
]
STEPS: dict[str, Any] = {  # go: the next process resumes; +c0 approves c0, -c0 denies, !c0 misfits
    "g": lambda agent, run, _: agent.resume(run),
    "+": lambda agent, run, call_id: agent.approve(run, call_id, resume=True),
    "-": lambda agent, run, call_id: agent.deny(run, call_id, "not sent", resume=True),
    "!": lambda agent, run, call_id: agent.approve(run, call_id),  # a lost refund: refused
}
# fmt: on


@pytest.mark.parametrize(("script", "harness", "review", "end"), CASES)
def test_the_desk(script: dict[Any, Any], harness: dict[str, Any], review: Any, end: str) -> None:
    agent = AgentUnderTest(make_runtime, **harness)
    result = agent.run("Help Ann with order A17.", model=KeyedScriptedModel(script))
    for step in review:
        with pytest.raises(ReviewError) if step[0] == "!" else contextlib.nullcontext():
            result = STEPS[step[0]](agent, result.run_id, step[1:])
    assert result.reason == end
    assert_no_duplicate_writes(agent)
