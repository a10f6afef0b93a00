"""The scripted 2-tool scenario of ``benchmarks/postgres.py``, as an application the
worker processes load (``fsm-agent worker --app pg_app:make_runtime``).

Each round the model asks for two calls at once: a read (``lookup``) and an idempotent
write (``record``); after ``rounds`` rounds it answers. The model decides from the
history alone, so any worker can drive any run. ``approval=True`` plans pause the write
for a reviewer (the claim-latency measurement).
"""

from __future__ import annotations

import json
from typing import Any

from orders import SCHEMA, lookup, record, refund

from fsm_agent import Budget, Runtime, ToolRegistry


def tools() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(lookup, schema=SCHEMA, effect="read")
    registry.register(
        record, schema=SCHEMA, effect="write", idempotency_key=lambda a: a["order_id"]
    )
    registry.register(
        refund,
        schema=SCHEMA,
        effect="write",
        idempotency_key=lambda a: a["order_id"],
        requires_approval=True,
    )
    return registry


def plan(tag: str, rounds: int, *, approval: bool = False) -> str:
    return json.dumps({"tag": tag, "rounds": rounds, "approval": approval})


def call(call_id: str, name: str, order_id: str) -> dict[str, Any]:
    arguments = json.dumps({"order_id": order_id})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def model(messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> dict[str, Any]:
    p = json.loads(messages[0]["content"])
    done = sum(1 for m in messages if m.get("role") == "assistant")
    usage = {"input_tokens": 10, "output_tokens": 5, "cost": 0.0}
    if p["approval"] and done == 0:
        calls = [call("a0", "refund", p["tag"])]
        return {"role": "assistant", "content": None, "tool_calls": calls, "usage": usage}
    if done >= p["rounds"] + (1 if p["approval"] else 0):
        return {"role": "assistant", "content": "All recorded.", "usage": usage}
    tag = f"{p['tag']}-{done}"
    calls = [call(f"l{done}", "lookup", tag), call(f"w{done}", "record", tag)]
    return {"role": "assistant", "content": None, "tool_calls": calls, "usage": usage}


def make_runtime(store: Any) -> Runtime:
    return Runtime(
        model=model,
        tools=tools(),
        allowed_tools={"lookup", "record", "refund"},
        store=store,
        budget=Budget(max_tool_rounds=1000, max_model_calls=1001, max_total_calls=2000),
    )
