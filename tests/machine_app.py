"""An application's own machine, for the machine-as-a-value tests and ``fsm-agent diagram
--machine machine_app:STRICT``: the built-in table plus one rule, "one tool round, then
stop", as an edge of ``observe``."""

from __future__ import annotations

from fsm_agent._core.engine import compile_machine
from fsm_agent._core.table import DEFAULT_MACHINE, Transition

#: After a batch's last result, a run whose decision had tool calls stops instead of
#: asking the model again (tried after the built-in observe edges, before the fallback).
ONE_ROUND = Transition(
    "observe", "observing", "budget_exhausted", ("has_tool_calls",), "tool_rounds", "stop",
    "app rule: one tool round per run",
)  # fmt: skip

STRICT = compile_machine([ONE_ROUND], extends=DEFAULT_MACHINE, name="one-round")


def strict_machine() -> object:
    return STRICT


NOT_A_MACHINE = 42
