"""A model that asks again for calls a run already made, under the same ids.

Call ids pair results with calls (R1), so a reply that reuses the id of a call from an
earlier round is a model bug the machine cannot see: the call is admitted as new (a
batch's ids are checked against each other), runs again, and the history then holds two
calls under one id. The usual cause is a scripted model rebuilt in a new process, which
replays its first steps on a resumed run. The runtime warns once per driving, after it,
at the cost of one pass over the history.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["reused_call_ids", "warn_reused_call_ids"]


def reused_call_ids(messages: list[dict[str, Any]], since: int) -> list[str]:
    """Ids of calls asked for in ``messages[since:]`` that an earlier assistant message
    of the history already used, in the order they were asked for again."""
    seen: set[str] = set()
    reused: list[str] = []
    for index, message in enumerate(messages):
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list):
            continue
        ids = {c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}
        if index >= since:
            reused.extend(sorted(i for i in ids & seen if i not in reused))
        seen |= ids
    return reused


def warn_reused_call_ids(run_id: str, messages: list[dict[str, Any]], since: int) -> None:
    """Warn if this driving's replies (``messages[since:]``) reused earlier call ids."""
    reused = reused_call_ids(messages, since)
    if reused:
        warnings.warn(
            f"run {run_id!r}: the model asked again for call id(s) {', '.join(map(repr, reused))}"
            ", already used by an earlier round of this run, and each was handled as a new "
            "call. A ScriptedModel restarts its script in a new process; for runs that are "
            "resumed, use KeyedScriptedModel, which picks its decisions from the history",
            RuntimeWarning,
            stacklevel=4,
        )
