"""A long, valid, chained trace for the check and replay benchmarks.

A real run of one round (a batch of three reads, one transient failure retried, then an
answer) is recorded; its round is repeated with fresh call ids and contiguous ``seq``
until the trace has the wanted number of events or bytes, and every line is chained
(``fsm_agent._trace.chain``) as the runtime writes it. The header's budget is raised so
that every round is within it and the final ``run_end`` reports the counters of all the
rounds: the checker recomputes every guard and counter of a realistic trace, not of a
synthetic one. Lines are streamed to the file, so a trace of any size is written in
constant memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fsm_agent import Budget, RetryPolicy, Runtime, ScriptedModel, ToolRegistry, TransientToolError
from fsm_agent._trace.chain import Chain

SCHEMA = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string", "maxLength": 80}},
}
CALLS = 3
_BIG = 10**12


def _recorded_run() -> list[dict[str, Any]]:
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
    return runtime.run("Where are my orders?", run_id="bench").events


def write_long_trace(
    path: Path, events_wanted: int = 0, *, bytes_wanted: int = 0, key: bytes | None = None
) -> int:
    """Write a valid chained trace of at least ``events_wanted`` events (or
    ``bytes_wanted`` bytes); return its number of events."""
    events = _recorded_run()
    decisions = [i for i, e in enumerate(events) if e["type"] == "decision"]
    head, body, tail = events[0], events[1 : decisions[-1]], events[decisions[-1] :]
    end = tail[-1]["counters"]
    head = {
        **head,
        "integrity": "sha256" if key is None else "hmac-sha256",
        "budget": {
            **head["budget"],
            "max_tool_rounds": _BIG,
            "max_total_calls": _BIG,
            "max_model_calls": _BIG,
            "max_output_bytes": None,
        },
    }
    chain = Chain("bench", key)
    text = json.dumps(body)
    seq = 0
    copies = 0
    written = 0
    with open(path, "w", encoding="utf-8") as out:

        def emit(event: dict[str, Any]) -> None:
            nonlocal seq, written
            event["seq"] = seq
            seq += 1
            line = chain.encode(event) + "\n"
            written += len(line)
            out.write(line)

        emit(head)
        while (events_wanted and seq + len(tail) < events_wanted) or (
            bytes_wanted and written < bytes_wanted
        ):
            renamed = text
            for i in range(CALLS):
                renamed = renamed.replace(f'"c{i}"', f'"r{copies}-c{i}"')
            for event in json.loads(renamed):
                emit(event)
            copies += 1
        for event in tail[:-1]:
            emit(dict(event))
        counters = dict(end)
        for name in ("tool_rounds", "tool_calls", "retries", "output_bytes"):
            counters[name] = end[name] * copies
        counters["model_calls"] = copies + 1
        counters["tool_attempts"] = {k: v * copies for k, v in end["tool_attempts"].items()}
        emit({**tail[-1], "counters": counters})
    return seq
