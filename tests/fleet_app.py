"""The application the fleet tests run in real worker processes
(``fsm-agent worker --app fleet_app:make_runtime``).

A run's task is a JSON plan ``{"tag": ..., "kind": ..., "key": ...}``; the model decides
from the plan and the history alone (no hidden state), so any worker can continue any
run. Kinds: ``read`` (a lookup), ``keyed`` (a lookup and a ticket under an idempotency
key; runs may share a key), ``unkeyed`` (a notification, no key), ``dedup`` (a charge the
downstream deduplicates by key, failing transiently now and then, at most twice a key),
``approval`` (a refund that needs a reviewer's approval).

Every write appends one line to the side-effect ledger (``FSM_LEDGER``) at the moment it
takes effect — before it returns, so a worker killed right after still leaves the line —
with one ``os.write`` on an ``O_APPEND`` file (atomic between processes). The ledger is
the independent truth the tests check the store against. ``FSM_TOOL_S`` sets how long a
tool works, so kills and stalls land inside calls; ``FSM_TRACE_KEY``, if set, is the
runtimes' ``trace_key``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

from fsm_agent import Budget, RetryPolicy, Runtime, ToolRegistry, TransientToolError

KINDS = ("read", "keyed", "unkeyed", "dedup", "approval")
TOOLS = {"lookup", "create_ticket", "notify", "charge", "refund"}


def plan(tag: str, kind: str, key: str | None = None) -> str:
    return json.dumps({"tag": tag, "kind": kind, "key": key or tag})


def _pause() -> float:
    return float(os.environ.get("FSM_TOOL_S", "0.01")) * random.uniform(0.5, 1.5)


def record(tool: str, key: str, args: dict[str, Any]) -> None:
    line = json.dumps({"tool": tool, "key": key, "args": args, "pid": os.getpid()}) + "\n"
    fd = os.open(os.environ["FSM_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def ledger(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, sort_keys=True)},
    }


def decide(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The next decision from the plan (the first user message) and the history."""
    p = json.loads(messages[0]["content"])
    tag, kind, key = p["tag"], p["kind"], p["key"]
    if any(m.get("role") == "assistant" for m in messages):
        return {"role": "assistant", "content": f"Run {tag} ({kind}) is complete."}
    calls = [_call("c1", "lookup", {"order_id": tag})]
    if kind == "keyed":
        calls.append(_call("c2", "create_ticket", {"request_id": key, "title": f"about {key}"}))
    elif kind == "unkeyed":
        calls.append(_call("c2", "notify", {"text": f"hello from {tag}"}))
    elif kind == "dedup":
        calls.append(_call("c2", "charge", {"payment_id": key, "cents": 1200}))
    elif kind == "approval":
        calls.append(_call("c2", "refund", {"request_id": key, "cents": 500}))
    return {"role": "assistant", "content": None, "tool_calls": calls}


async def model(messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> Any:
    await asyncio.sleep(_pause() / 2)
    return {**decide(messages), "usage": {"input_tokens": 10, "output_tokens": 5, "cost": 0.0}}


def tools() -> ToolRegistry:
    registry = ToolRegistry()
    text = {"type": "string", "minLength": 1, "maxLength": 80}
    cents = {"type": "integer", "minimum": 0}

    def schema(**props: Any) -> dict[str, Any]:
        return {
            "type": "object",
            "required": sorted(props),
            "properties": props,
            "additionalProperties": False,
        }

    @registry.tool(schema=schema(order_id=text), effect="read")
    async def lookup(order_id: str) -> dict[str, Any]:
        await asyncio.sleep(_pause())
        return {"order_id": order_id, "status": "late"}

    @registry.tool(
        schema=schema(request_id=text, title=text),
        effect="write",
        idempotency_key=lambda a: a["request_id"],
    )
    async def create_ticket(request_id: str, title: str) -> dict[str, Any]:
        await asyncio.sleep(_pause())
        record("create_ticket", request_id, {"request_id": request_id, "title": title})
        await asyncio.sleep(_pause())  # the effect happened; the answer is not back yet
        return {"ticket": f"T-{request_id}"}

    @registry.tool(schema=schema(text=text), effect="write")
    async def notify(text: str) -> dict[str, Any]:
        await asyncio.sleep(_pause())
        record("notify", text, {"text": text})
        await asyncio.sleep(_pause())
        return {"sent": True}

    @registry.tool(
        schema=schema(payment_id=text, cents=cents),
        effect="write",
        idempotency_key=lambda a: a["payment_id"],
        dedup=True,
    )
    async def charge(payment_id: str, cents: int) -> dict[str, Any]:
        await asyncio.sleep(_pause())
        earlier = sum(
            1
            for e in ledger(os.environ["FSM_LEDGER"])
            if e["tool"] == "charge" and e["key"] == payment_id
        )
        record("charge", payment_id, {"payment_id": payment_id, "cents": cents})
        # The downstream answers 503 now and then (and deduplicates), but at most twice per
        # payment: with four attempts a run always gets through. Unbounded random failures
        # exhausted the retries of one run in ~40 and sent it to review, which is right for
        # the engine and wrong for a test that expects every dedup run to finish.
        if earlier < 2 and random.random() < 0.3:
            raise TransientToolError("payment service busy")
        return {"charged": cents}

    @registry.tool(
        schema=schema(request_id=text, cents=cents),
        effect="write",
        idempotency_key=lambda a: a["request_id"],
        requires_approval=True,
    )
    async def refund(request_id: str, cents: int) -> dict[str, Any]:
        await asyncio.sleep(_pause())
        record("refund", request_id, {"request_id": request_id, "cents": cents})
        return {"refunded": cents}

    return registry


def make_runtime(store: Any) -> Runtime:
    return Runtime(
        model=model,
        tools=tools(),
        allowed_tools=TOOLS,
        store=store,
        budget=Budget(max_tool_rounds=3, max_model_calls=4),
        retry=RetryPolicy(max_attempts=4, backoff_s=0.01),
        # ``FSM_TRACE_KEY``: the fleet signs every stored line (the chaos run does).
        trace_key=os.environ.get("FSM_TRACE_KEY") or None,
    )


def make_runtime_of_its_own() -> Runtime:
    """A factory that takes no store (``fsm-agent worker`` must refuse it unseen)."""
    raise AssertionError("the worker called a factory it should have refused up front")
