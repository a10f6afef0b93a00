"""The engine's cost per tool round stays bounded (issue 18).

``benchmarks/overhead.py`` counts instructions (callgrind) against a hand-written loop;
here the same kind of round is counted in Python calls into ``fsm_agent``, which a test
can pin exactly: a call is the hot path's unit of cost (a frame each), and each cut of
issue 18 removed some. A new per-round call fails here with the count it reached.
"""

from __future__ import annotations

import contextvars
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import fsm_agent
from fsm_agent import Budget, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._runtime import call_ids

_PACKAGE = str(Path(fsm_agent.__file__).parent)
_SCHEMA = {
    "type": "object",
    "required": ["order_id"],
    "additionalProperties": False,
    "properties": {"order_id": {"type": "string"}},
}

#: Python calls into fsm_agent per read round (a model call, one read call, its answer):
#: 75 after issue 18's cuts, 110 before them. Some room, none for a new helper call on
#: every edge (five per round) and a few more.
MAX_CALLS_PER_ROUND = 80


def _lookup(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "status": "in_transit"}


def _runtime(rounds: int, *, repeat_first: bool = False) -> Runtime:
    tools = ToolRegistry()
    tools.register(_lookup, name="lookup", schema=_SCHEMA, effect="read")
    steps: list[Any] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c0" if repeat_first and i == rounds - 1 else f"c{i}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"order_id": "A0"})},
                }
            ],
        }
        for i in range(rounds)
    ]
    steps.append({"role": "assistant", "content": "All in transit."})
    return Runtime(
        model=ScriptedModel(steps),
        tools=tools,
        allowed_tools={"lookup"},
        budget=Budget(max_tool_rounds=rounds, max_model_calls=rounds + 1, max_total_calls=rounds),
    )


def _calls_into_package(rounds: int) -> int:
    runtime = _runtime(rounds)
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call" and frame.f_code.co_filename.startswith(_PACKAGE):
            count += 1  # (a generator resumed counts too: the loop's steps are some)

    sys.setprofile(profile)
    try:
        # In a fresh context: the engine's own calls, not those of an observer the test
        # session installed (``--fsm-coverage`` watches every run of the session).
        result = contextvars.Context().run(runtime.run, "Where are my orders?")
    finally:
        sys.setprofile(None)
    assert result.status == "done", result.reason
    return count


def test_a_read_round_makes_few_python_calls_into_the_package() -> None:
    _calls_into_package(2)  # lazy imports and first-use caches out of the count
    per_round = (_calls_into_package(40) - _calls_into_package(20)) / 20
    assert per_round <= MAX_CALLS_PER_ROUND, (
        f"{per_round:.1f} Python calls into fsm_agent per tool round (at most "
        f"{MAX_CALLS_PER_ROUND}): something new runs on the hot path"
    )


def test_the_repeated_calls_pass_runs_only_when_an_id_came_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[int] = []
    real = call_ids.repeated_calls

    def counted(messages: list[dict[str, Any]], since: int) -> list[tuple[str, str]]:
        ran.append(since)
        return real(messages, since)

    monkeypatch.setattr(call_ids, "repeated_calls", counted)
    assert _runtime(5).run("go").warnings == []
    assert ran == []  # every id new: the loop saw none come back, the pass is skipped
    with pytest.warns(RuntimeWarning, match="asked again for call"):
        repeated = _runtime(5, repeat_first=True).run("go")
    assert ran == [1] and "'c0' (lookup)" in repeated.warnings[0]
