"""The three kinds of tool a durable round can call (a read, a keyed write, a keyless
write) and a script of rounds of them: shared by the tests that count what a round costs
a store (``test_pg_round_trips.py``: round trips; ``test_sqlite_rounds.py``: commits)."""

from __future__ import annotations

import uuid
from typing import Any

from conftest import call, calls, say

from fsm_agent import ToolRegistry

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
