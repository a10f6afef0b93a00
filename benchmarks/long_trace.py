"""A long, valid trace for the check and replay benchmarks.

A real run of a few rounds (a batch of calls per round, one transient failure retried)
is recorded, then its rounds are repeated with fresh call ids and contiguous ``seq``
until the trace has the wanted number of events, so the checker verifies every event of
a realistic shape rather than a synthetic one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fsm_agent import Budget, RetryPolicy, Runtime, ScriptedModel, ToolRegistry, TransientToolError

SCHEMA = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string", "maxLength": 80}},
}
CALLS = 3


def _recorded_rounds() -> list[dict[str, Any]]:
    flaky = {"left": 1}

    def lookup(order_id: str) -> dict[str, Any]:
        if flaky["left"]:
            flaky["left"] -= 1
            raise TransientToolError("index busy")
        return {"order_id": order_id, "status": "in_transit", "eta_days": 2}

    tools = ToolRegistry()
    tools.register(lookup, schema=SCHEMA, effect="read")
    batch = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"order_id": f"A{i}"})},
            }
            for i in range(CALLS)
        ],
    }
    model = ScriptedModel([batch, {"role": "assistant", "content": "All in transit."}])
    runtime = Runtime(
        model=model,
        tools=tools,
        allowed_tools={"lookup"},
        budget=Budget(max_tool_rounds=2),
        retry=RetryPolicy(max_attempts=2, backoff_s=0.0),
    )
    return runtime.run("Where are my orders?").events


def write_long_trace(path: Path, events_wanted: int) -> int:
    """Write a valid trace of at least ``events_wanted`` events; return its length."""
    events = _recorded_rounds()
    decisions = [i for i, e in enumerate(events) if e["type"] == "decision"]
    head, body, tail = events[:1], events[1 : decisions[-1]], events[decisions[-1] :]
    lines = [json.dumps(head[0])]
    seq = 1
    copy = 0
    text = json.dumps(body)
    while seq + len(tail) < events_wanted:
        renamed = text
        for i in range(CALLS):
            renamed = renamed.replace(f'"c{i}"', f'"r{copy}-c{i}"')
        for event in json.loads(renamed):
            event["seq"] = seq
            seq += 1
            lines.append(json.dumps(event))
        copy += 1
    for event in tail:
        event["seq"] = seq
        seq += 1
        lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)
