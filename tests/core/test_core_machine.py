"""The loop fires the machine of its run's config, by hand (no Runtime, no driver)."""

from __future__ import annotations

from dataclasses import replace

from machine_app import STRICT

from core.test_core_loop import ANSWER, call, decide, drive, kinds, new_state, scripted
from fsm_agent._core.loop import start, steps
from fsm_agent._core.state import RunState
from fsm_agent._core.table import DEFAULT_MACHINE


def strict_state() -> RunState:
    plain = new_state()
    s = RunState(run_id="r1", config=replace(plain.config, machine=STRICT), messages=plain.messages)
    start(s)
    return s


def test_the_loop_fires_the_runs_machine() -> None:
    replies = [decide(call("c1", "lookup", key="A")), ANSWER]
    plain, strict = new_state(), strict_state()
    asked_plain = kinds(drive(steps(plain), scripted(list(replies))))
    asked_strict = kinds(drive(steps(strict), scripted(list(replies))))
    assert asked_plain.count("AskModel") == 2 and plain.status == "done"
    # The application's row stops the run after its tool round: the model is asked once.
    assert asked_strict.count("AskModel") == 1 and asked_strict.count("CallTool") == 1
    assert (strict.status, strict.reason) == ("budget_exhausted", "tool_rounds")
    assert strict.taken is STRICT.edge_by_key(strict.taken.key)
    assert strict.events[0]["machine_hash"] == STRICT.hash != DEFAULT_MACHINE.hash
    assert strict.snapshot()["machine_hash"] == STRICT.hash
