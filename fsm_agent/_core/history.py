"""Provider validity of a Chat Completions history (R2 of docs/concepts/rules.md).

Every assistant ``tool_calls`` id must be answered by exactly one ``tool`` message
before the next non-tool message, and no ``tool`` message may answer an id that the
assistant message right before its group did not ask for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_history"]


def check_history(messages: list[dict[str, Any]]) -> list[str]:
    """The problems a Chat Completions provider would reject; empty when valid."""
    problems: list[str] = []
    open_ids: dict[str, int] = {}  # id -> index of the assistant message asking for it
    answered: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in answered:
                problems.append(f"message {i}: tool_call_id {call_id!r} answered twice")
            elif call_id not in open_ids:
                problems.append(f"message {i}: orphan tool result for {call_id!r}")
            else:
                answered.add(call_id)
                del open_ids[call_id]
            continue
        for call_id, at in open_ids.items():
            problems.append(
                f"message {at}: tool_call_id {call_id!r} has no tool result before message {i}"
            )
        open_ids = {}
        answered = set()
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                call_id = call.get("id") if isinstance(call, dict) else None
                if not call_id:
                    problems.append(f"message {i}: a tool call without an id")
                elif call_id in open_ids:
                    problems.append(f"message {i}: duplicate tool_call_id {call_id!r}")
                else:
                    open_ids[call_id] = i
    for call_id, at in open_ids.items():
        problems.append(f"message {at}: tool_call_id {call_id!r} is never answered")
    return problems
