"""What the Anthropic Messages API refuses in ``messages`` (private: use
:mod:`fsm_agent.models._validate`).

The API joins consecutive turns of one role into one turn before it checks anything, so
the rules below apply to those joined turns (real accepted requests send a text turn and
a ``tool_use`` turn back to back). A ``system`` message inside ``messages`` (accepted
under a beta) belongs to no turn. Known rules, each seen in a real 400:

* every ``tool_use`` of an assistant turn is answered by a ``tool_result`` in the very
  next turn, a user turn, and those results come first in it ("``tool_use`` ids were
  found without ``tool_result`` blocks immediately after");
* a ``tool_result`` answers a ``tool_use`` of the turn right before it ("unexpected
  ``tool_use_id`` found in ``tool_result`` blocks");
* ``tool_use`` ids match ``^[a-zA-Z0-9_-]+$`` and are unique within their turn (a later
  turn may reuse one: the API pairs turn by turn), and ``input`` is an object;
* every turn but a final assistant one has content;
* with ``thinking`` of type ``enabled``, the assistant turn whose tool calls the request
  answers last starts with a ``thinking`` or ``redacted_thinking`` block ("When
  ``thinking`` is enabled, a final ``assistant`` message must start with a thinking
  block").

Every other block type (server tools, MCP, documents, ...) is accepted as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["check_anthropic_messages", "check_anthropic_request"]

_UNANSWERED = "`tool_use` ids were found without `tool_result` blocks immediately after"
_ORPHAN = (
    "unexpected `tool_use_id` found in `tool_result` blocks: each "
    "`tool_result` block must have a corresponding `tool_use` block in the "
    "previous message"
)
_NO_THINKING = (
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block"
)
_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_THINKING = ("thinking", "redacted_thinking")


@dataclass
class _Turn:
    role: str
    first: int  # index of its first message, for the problem texts
    blocks: list[Any] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)  # messages with no content


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def _turns(messages: list[Any], problems: list[str]) -> list[_Turn]:
    turns: list[_Turn] = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role == "system":
            continue
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: role must be 'user' or 'assistant', got {role!r}")
            continue
        if not turns or turns[-1].role != role:
            turns.append(_Turn(role, i))
        blocks = _blocks(message.get("content"))
        if not blocks:
            turns[-1].empty.append(i)
        turns[-1].blocks.extend(b for b in blocks if isinstance(b, Mapping))
    return turns


def _tool_uses(turn: _Turn, problems: list[str]) -> list[str]:
    ids: list[str] = []
    for block in turn.blocks:
        if block.get("type") != "tool_use":
            continue
        tool_use_id = block.get("id")
        if not isinstance(tool_use_id, str) or not _ID.match(tool_use_id):
            problems.append(
                f"message {turn.first}: tool_use id {tool_use_id!r} must match {_ID.pattern}"
            )
        elif tool_use_id in ids:
            problems.append(f"message {turn.first}: tool_use id {tool_use_id!r} is used twice")
        else:
            ids.append(tool_use_id)
        if not isinstance(block.get("input"), dict):
            problems.append(f"message {turn.first}: tool_use input must be an object")
    return ids


def _answers(turn: _Turn, pending: list[str], problems: list[str]) -> None:
    results = [b.get("tool_use_id") for b in turn.blocks if b.get("type") == "tool_result"]
    missing = [t for t in pending if turn.role != "user" or t not in results]
    if missing:
        problems.append(
            f"message {turn.first}: tool_use ids {missing} are not answered here "
            f"(Anthropic: {_UNANSWERED})"
        )
    for tool_use_id in results:
        if turn.role != "user" or tool_use_id not in pending:
            problems.append(
                f"message {turn.first}: tool_result for {tool_use_id!r} does not answer "
                f"the previous message (Anthropic: {_ORPHAN})"
            )
    if len(set(results)) != len(results):
        problems.append(f"message {turn.first}: a tool_use id is answered twice")
    kinds = [b.get("type") for b in turn.blocks]
    if pending and any(k != "tool_result" for k in kinds[: len(results)]):
        problems.append(f"message {turn.first}: tool_result blocks must come first in the turn")


def _starts_with_thinking(turns: list[_Turn]) -> list[str]:
    """With thinking enabled, the tool-calling assistant turn answered by the final user
    turn must begin with its thinking."""
    if len(turns) < 2 or turns[-1].role != "user" or turns[-2].role != "assistant":
        return []
    last, asking = turns[-1], turns[-2]
    if not any(b.get("type") == "tool_result" for b in last.blocks):
        return []
    first = asking.blocks[0].get("type") if asking.blocks else None
    if first in _THINKING:
        return []
    return [
        f"message {asking.first}: thinking is enabled, but the assistant turn whose tool "
        f"calls are answered last starts with {first!r}, not its thinking "
        f"(Anthropic: {_NO_THINKING})"
    ]


def check_anthropic_messages(
    messages: list[dict[str, Any]], *, thinking: bool = False
) -> list[str]:
    """What the Anthropic Messages API would reject in ``messages``.

    ``thinking`` is true when the request enables extended thinking (``type: enabled``).
    """
    problems: list[str] = []
    turns = _turns(messages, problems)
    pending: list[str] = []
    for n, turn in enumerate(turns):
        for i in turn.empty:
            if not (turn.role == "assistant" and n == len(turns) - 1):
                problems.append(f"message {i}: content must be a non-empty list of blocks")
        _answers(turn, pending, problems)
        pending = _tool_uses(turn, problems) if turn.role == "assistant" else []
    if pending:
        problems.append(
            f"message {len(messages) - 1}: tool_use ids {pending} are never "
            f"answered (Anthropic: {_UNANSWERED})"
        )
    if thinking:
        problems.extend(_starts_with_thinking(turns))
    return problems


def check_anthropic_request(body: Mapping[str, Any]) -> list[str]:
    """:func:`check_anthropic_messages` on a whole request body."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ["the request has no messages list"]
    config = body.get("thinking")
    enabled = isinstance(config, Mapping) and config.get("type") == "enabled"
    return check_anthropic_messages(messages, thinking=enabled)
