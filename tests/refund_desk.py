"""A support desk whose refund waits for a reviewer, driven one step per process: the
child of ``tests/test_keyed_model.py`` and ``tests/test_trace_dir_resume.py``.

    python refund_desk.py DB TRACE_DIR LEDGER keyed|scripted start|resume RUN_ID

Each process builds its model afresh, as an application restarted between the pause and
the resume would. The ledger gets one line per refund really issued. Prints the run's
status, reason and the tools the model asked for in this process, as JSON; warnings go to stderr.
With ``FSM_TRACE_KEY`` set, traces are signed with it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from fsm_agent import KeyedScriptedModel, Runtime, ScriptedModel, SqliteStore, ToolRegistry
from fsm_agent.testing import answer, call, decide

LOOKUP = call("lookup", {"order_id": "A17"}, id="c1")
REFUND = call("issue_refund", {"request_id": "RF-17", "amount_cents": 1200}, id="c2")


def runtime(db: str, trace_dir: str, ledger: Path, model: Any) -> Runtime:
    tools = ToolRegistry()

    @tools.tool(
        effect="read",
        schema={
            "type": "object",
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string"}},
            "additionalProperties": False,
        },
    )
    def lookup(order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "status": "damaged", "paid_cents": 1200}

    @tools.tool(
        effect="write",
        requires_approval=True,
        idempotency_key=lambda args: args["request_id"],
        schema={
            "type": "object",
            "required": ["request_id", "amount_cents"],
            "properties": {
                "request_id": {"type": "string"},
                "amount_cents": {"type": "integer"},
            },
            "additionalProperties": False,
        },
    )
    def issue_refund(request_id: str, amount_cents: int) -> dict[str, Any]:
        with ledger.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"request_id": request_id, "pid": os.getpid()}) + "\n")
        return {"refunded_cents": amount_cents}

    return Runtime(
        model=model,
        tools=tools,
        allowed_tools={"lookup", "issue_refund"},
        store=SqliteStore(db),
        trace_dir=trace_dir,
        trace_key=os.environ.get("FSM_TRACE_KEY"),
    )


def model(kind: str) -> Any:
    if kind == "keyed":
        return KeyedScriptedModel(
            {None: decide(LOOKUP, REFUND), "c2": answer("Refunded 12.00 EUR for A17.")}
        )
    return ScriptedModel([decide(LOOKUP, REFUND), answer("Refunded 12.00 EUR for A17.")])


def main() -> int:
    db, trace_dir, ledger, kind, mode, run_id = sys.argv[1:7]
    asked: list[str] = []
    inner = model(kind)

    def watched(messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> Any:
        reply = inner(messages, specs)
        asked.extend(c["function"]["name"] for c in reply.get("tool_calls") or [])
        return reply

    rt = runtime(db, trace_dir, Path(ledger), watched)
    if mode == "start":
        result = rt.run("A17 arrived damaged; refund it.", run_id=run_id)
    else:
        result = rt.resume(run_id)
    print(json.dumps({"status": result.status, "reason": result.reason, "asked": asked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
