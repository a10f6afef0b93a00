"""The three kinds of tool a durable round can call (a read, a keyed write, a keyless
write) and a script of rounds of them: shared by the tests that count what a round costs
a store (``test_pg_round_trips.py``: round trips; ``test_sqlite_rounds.py``: commits), and
what both check after a process killed with a write's result behind."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import call, calls, say

from fsm_agent import Runtime, ScriptedModel, ToolRegistry
from fsm_agent._durable.store import Store

SCHEMA = {"type": "object", "required": ["i"], "properties": {"i": {"type": "string"}}}


def round_tools() -> ToolRegistry:
    tools = ToolRegistry()
    tools.register(lambda i: {"read": i}, name="read", effect="read", schema=SCHEMA)
    tools.register(
        lambda i: {"keyed": i},
        name="keyed",
        effect="write",
        idempotency_key=lambda a: a["i"],
        schema=SCHEMA,
    )
    tools.register(lambda i: {"keyless": i}, name="keyless", effect="write", schema=SCHEMA)
    return tools


def round_script(kind: tuple[str, ...], rounds: int) -> list[Any]:
    """``rounds`` batches, each calling the tools ``kind`` names (arguments unique to this
    script, so keyed writes never replay another test's), then an answer."""
    tag = uuid.uuid4().hex[:8]
    steps: list[Any] = [
        calls(*(call(f"c{r}{j}", name, i=f"{tag}-{r}-{j}") for j, name in enumerate(kind)))
        for r in range(rounds)
    ]
    return [*steps, say("done")]


def resume_after_kill(store: Store, ledger: Path) -> None:
    """Run ``r1``, killed after its keyed write ``K`` ran and before the write's result
    was stored, resumes to review (``outcome_unknown``), never running the write again."""
    record = store.get_intent("write", "K")
    assert record is not None and record.status == "pending"  # its result never stored
    tools = ToolRegistry()
    tools.register(
        lambda i: pytest.fail("the write ran twice"),
        name="write",
        effect="write",
        idempotency_key=lambda a: a["i"],
        schema={"type": "object", "properties": {"i": {"type": "string"}}},
    )
    model = ScriptedModel([say("done")])
    result = Runtime(model=model, tools=tools, allowed_tools={"write"}, store=store).resume("r1")
    assert (result.status, result.reason) == ("review_required", "outcome_unknown")
    assert json.loads(result.messages[result.pending["c1"]]["content"])["error"] == (
        "outcome_unknown"
    )
    assert ledger.read_text().split() == ["K"]
