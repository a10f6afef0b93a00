"""Provider-valid history, checked per provider (SPEC rule 2), on what is actually sent.

Each check takes the *provider-shaped* payload an adapter is about to send and returns
the problems the provider would reject, empty when valid. Adapters raise
:class:`~fsm_agent.models.HistoryError` on any problem before the HTTP request: a
violation is a bug upstream of the adapter (the runtime, or a caller-built history),
and sending it would only earn a 400. Messages quote the provider's own wording so a
problem found here can be matched with the error the provider would have returned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fsm_agent.core.history import check_history

__all__ = [
    "check_anthropic_messages",
    "check_openai_chat",
    "check_openai_responses",
    "recognise_history_rejection",
]

_OPENAI_UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool "
    "messages responding to each 'tool_call_id'"
)
_OPENAI_ORPHAN = (
    "messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
)
_RESPONSES_UNANSWERED = "No tool output found for function call"
_RESPONSES_ORPHAN = "No tool call found for function call output"
_ANTHROPIC_UNANSWERED = "`tool_use` ids were found without `tool_result` blocks immediately after"
_ANTHROPIC_ORPHAN = (
    "unexpected `tool_use_id` found in `tool_result` blocks: each "
    "`tool_result` block must have a corresponding `tool_use` block in the "
    "previous message"
)

#: Provider error texts that mean "your history breaks tool-call pairing".
_REJECTIONS = (
    "must be followed by tool messages responding to each",
    "must be a response to a preceeding message with 'tool_calls'",  # sic, OpenAI's spelling
    "must be a response to a preceding message with 'tool_calls'",
    "no tool output found for function call",
    "no tool call found for function call output",
    "ids were found without tool_result blocks immediately after",
    "unexpected tool_use_id found in tool_result blocks",
    "must have a corresponding tool_use block",
    "tool_result block(s) provided when previous message does not contain any tool_use",
)

_ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def recognise_history_rejection(text: str) -> bool:
    """Whether a provider's 400 text says the history broke tool-call pairing."""
    plain = text.replace("`", "").lower()
    return any(pattern.replace("`", "") in plain for pattern in _REJECTIONS)


def check_openai_chat(messages: list[dict[str, Any]]) -> list[str]:
    """What OpenAI Chat Completions would reject in ``messages``."""
    problems: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _CHAT_ROLES:
            role = message.get("role") if isinstance(message, Mapping) else None
            problems.append(
                f"message {i}: role must be one of {', '.join(_CHAT_ROLES)}, got {role!r}"
            )
            continue
        role, content = message["role"], message.get("content")
        if role == "tool":
            if not isinstance(content, str):
                problems.append(f"message {i}: a tool message's content must be a string")
            if not isinstance(message.get("tool_call_id"), str):
                problems.append(f"message {i}: a tool message needs a string tool_call_id")
        elif role == "assistant":
            calls = message.get("tool_calls")
            if content is None and not calls:
                problems.append(f"message {i}: an assistant message needs content or tool_calls")
            for j, call in enumerate(calls or ()):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if (
                    not isinstance(fn, Mapping)
                    or not isinstance(fn.get("arguments"), str)
                    or (not fn.get("name"))
                ):
                    problems.append(
                        f"message {i}: tool_calls[{j}] needs function.name and "
                        f"function.arguments as a string"
                    )
        elif not isinstance(content, (str, list)):
            problems.append(f"message {i}: a {role} message needs content")
    for problem in check_history([m for m in messages if isinstance(m, Mapping)]):
        wording = _OPENAI_ORPHAN if "orphan" in problem else _OPENAI_UNANSWERED
        problems.append(f"{problem} (OpenAI: {wording})")
    return problems


def check_openai_responses(items: list[dict[str, Any]]) -> list[str]:  # noqa: C901 - one check per documented request rule
    """What the OpenAI Responses API would reject in an ``input`` item list."""
    problems: list[str] = []
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, Mapping) else None
        if kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                problems.append(f"item {i}: a function_call without a call_id")
            elif call_id in calls:
                problems.append(f"item {i}: call_id {call_id!r} is used twice")
            else:
                calls[call_id] = i
            if not isinstance(item.get("arguments"), str) or not item.get("name"):
                problems.append(f"item {i}: a function_call needs a name and string arguments")
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                problems.append(
                    f"item {i}: output for call_id {call_id!r} has no function_call "
                    f"before it (OpenAI: {_RESPONSES_ORPHAN} {call_id})"
                )
            elif call_id in answered:
                problems.append(f"item {i}: call_id {call_id!r} is answered twice")
            else:
                answered.add(call_id)
            if not isinstance(item.get("output"), str):
                problems.append(f"item {i}: a function_call_output needs a string output")
        elif kind == "message":
            if item.get("role") not in ("system", "developer", "user", "assistant"):
                problems.append(f"item {i}: message role {item.get('role')!r} is not accepted")
            if not isinstance(item.get("content"), (str, list)):
                problems.append(f"item {i}: a message item needs content")
        else:
            problems.append(f"item {i}: unknown input item type {kind!r}")
    for call_id, at in calls.items():
        if call_id not in answered:
            problems.append(
                f"item {at}: function_call {call_id!r} is never answered "
                f"(OpenAI: {_RESPONSES_UNANSWERED} {call_id})"
            )
    return problems


def check_anthropic_messages(messages: list[dict[str, Any]]) -> list[str]:  # noqa: C901 - one check per documented request rule
    """What the Anthropic Messages API would reject in ``messages`` (blocks form)."""
    problems: list[str] = []
    seen_ids: set[str] = set()
    pending: list[str] = []  # tool_use ids of the previous assistant turn
    if messages and messages[0].get("role") != "user":
        problems.append("message 0: the first message must be a user message")
    for i, message in enumerate(messages):
        role = message.get("role")
        blocks = message.get("content")
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: role must be 'user' or 'assistant', got {role!r}")
            continue
        if not isinstance(blocks, list) or not blocks:
            last_assistant = i == len(messages) - 1 and role == "assistant"
            if not last_assistant:
                problems.append(f"message {i}: content must be a non-empty list of blocks")
            blocks = []
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if pending:
            missing = [t for t in pending if role != "user" or t not in results]
            if missing:
                problems.append(
                    f"message {i}: tool_use ids {missing} are not answered here "
                    f"(Anthropic: {_ANTHROPIC_UNANSWERED})"
                )
        for tool_use_id in results:
            if role != "user" or tool_use_id not in pending:
                problems.append(
                    f"message {i}: tool_result for {tool_use_id!r} does not answer "
                    f"the previous message (Anthropic: {_ANTHROPIC_ORPHAN})"
                )
        if len(set(results)) != len(results):
            problems.append(f"message {i}: a tool_use id is answered twice")
        kinds = [b.get("type") for b in blocks]
        if "tool_result" in kinds and any(k != "tool_result" for k in kinds[: len(results)]):
            problems.append(f"message {i}: tool_result blocks must come first in the message")
        pending = []
        if role == "assistant":
            for b in blocks:
                if b.get("type") != "tool_use":
                    continue
                tool_use_id = b.get("id")
                if not isinstance(tool_use_id, str) or not _ANTHROPIC_ID.match(tool_use_id):
                    problems.append(
                        f"message {i}: tool_use id {tool_use_id!r} must match "
                        f"{_ANTHROPIC_ID.pattern}"
                    )
                elif tool_use_id in seen_ids:
                    problems.append(f"message {i}: tool_use id {tool_use_id!r} is not unique")
                else:
                    seen_ids.add(tool_use_id)
                    pending.append(tool_use_id)
                if not isinstance(b.get("input"), dict):
                    problems.append(f"message {i}: tool_use input must be an object")
    if pending:
        problems.append(
            f"message {len(messages) - 1}: tool_use ids {pending} are never "
            f"answered (Anthropic: {_ANTHROPIC_UNANSWERED})"
        )
    return problems
