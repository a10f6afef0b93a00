"""Provider-valid history (R2 of docs/concepts/rules.md), checked per provider on what is
actually sent.

Each check takes the *provider-shaped* payload an adapter is about to send and returns
the problems the provider would reject, empty when valid. Adapters raise
:class:`~fsm_agent.models.HistoryError` on any problem before the HTTP request: a
violation is a bug upstream of the adapter (the runtime, or a caller-built history),
and sending it would only earn a 400. Messages quote the provider's own wording so a
problem found here can be matched with the error the provider would have returned.

The checks refuse only what the APIs are known to refuse (pairing, ids, reasoning that
must be sent back); a shape they do not know (a new block or item type, an extra field)
is accepted and left for the provider to judge. They were measured against recorded
requests the real APIs accepted (``tests/data/providers``): every one passes.

``check_*_request`` take a whole request body and read the flags that change the rules
from it (Anthropic ``thinking``, Responses ``store`` and ``previous_response_id``);
the list forms take just the messages or items.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm_agent._core.history import check_history
from fsm_agent.models._check_anthropic import check_anthropic_messages, check_anthropic_request
from fsm_agent.models._check_responses import check_openai_responses, check_openai_responses_request

__all__ = [
    "check_anthropic_messages",
    "check_anthropic_request",
    "check_openai_chat",
    "check_openai_chat_request",
    "check_openai_responses",
    "check_openai_responses_request",
    "recognise_history_rejection",
    "recognise_reasoning_rejection",
]

_OPENAI_UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool "
    "messages responding to each 'tool_call_id'"
)
_OPENAI_ORPHAN = (
    "messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
)
_DEEPSEEK_REASONING = "The `reasoning_content` in the thinking mode must be passed back to the API"

#: Provider error texts that mean "your history breaks tool-call pairing", lower case,
#: backticks removed. OpenAI's and Anthropic's own, and the compatible servers' variants
#: seen in real 400s (DeepSeek's Responses endpoint says "tool call"/"tool output").
_REJECTIONS = (
    "must be followed by tool messages responding to each",
    "must be a response to a preceeding message with 'tool_calls'",  # sic, OpenAI's spelling
    "must be a response to a preceding message with 'tool_calls'",
    "no tool output found for function call",
    "no tool call found for function call output",
    "no tool output found for tool call",  # DeepSeek /responses
    "no tool call found for tool output",  # DeepSeek /responses
    "insufficient tool messages following tool_calls message",  # DeepSeek chat
    "ids were found without tool_result blocks immediately after",
    "unexpected tool_use_id found in tool_result blocks",
    "must have a corresponding tool_use block",
    "tool_result block(s) provided when previous message does not contain any tool_use",
)
#: ... and texts that mean "you dropped reasoning the server needs back".
_REASONING_REJECTIONS = (
    "reasoning_content in the thinking mode must be passed back",  # DeepSeek
    "missing reasoning_content field in the assistant message",  # DeepSeek
    "final assistant message must start with a thinking block",  # Anthropic
    "was provided without its required following item",  # Responses
    "was provided without its required 'reasoning' item",  # Responses
)

_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _plain(text: str) -> str:
    return text.replace("`", "").lower()


def recognise_history_rejection(text: str) -> bool:
    """Whether a provider's 400 text says the history broke tool-call pairing."""
    plain = _plain(text)
    return any(pattern in plain for pattern in _REJECTIONS)


def recognise_reasoning_rejection(text: str) -> bool:
    """Whether a provider's 400 text says reasoning it needs back was missing."""
    plain = _plain(text)
    return any(pattern in plain for pattern in _REASONING_REJECTIONS)


def _check_chat_tool(i: int, message: Mapping[str, Any]) -> list[str]:
    problems = []
    content = message.get("content")
    # A string, or text parts (accepted by OpenAI and compatible servers alike).
    text_parts = isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in content
    )
    if not isinstance(content, str) and not text_parts:
        problems.append(
            f"message {i}: a tool message's content must be a string or a list of text parts"
        )
    if not isinstance(message.get("tool_call_id"), str):
        problems.append(f"message {i}: a tool message needs a string tool_call_id")
    return problems


def _check_chat_assistant(i: int, message: Mapping[str, Any]) -> list[str]:
    problems = []
    calls = message.get("tool_calls")
    if message.get("content") is None and not calls:
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
    return problems


def _missing_reasoning(messages: list[Any]) -> list[str]:
    """Assistant tool-call messages of the current tool loop (after the last user
    message) that lack ``reasoning_content``: DeepSeek's thinking mode refuses them."""
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"),
        default=-1,
    )
    return [
        f"message {i}: an assistant message with tool_calls in the current tool loop has "
        f"no reasoning_content (DeepSeek: {_DEEPSEEK_REASONING})"
        for i, m in enumerate(messages)
        if i > last_user
        and isinstance(m, Mapping)
        and m.get("role") == "assistant"
        and m.get("tool_calls")
        and not isinstance(m.get("reasoning_content"), str)
    ]


def check_openai_chat(
    messages: list[dict[str, Any]], *, reasoning_content: bool = False
) -> list[str]:
    """What OpenAI Chat Completions would reject in ``messages``.

    ``reasoning_content=True`` adds the rule of servers whose thinking mode needs the
    reasoning back within a tool loop (DeepSeek): see :func:`_missing_reasoning`.
    """
    problems: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _CHAT_ROLES:
            role = message.get("role") if isinstance(message, Mapping) else None
            problems.append(
                f"message {i}: role must be one of {', '.join(_CHAT_ROLES)}, got {role!r}"
            )
            continue
        role = message["role"]
        if role == "tool":
            problems.extend(_check_chat_tool(i, message))
        elif role == "assistant":
            problems.extend(_check_chat_assistant(i, message))
        elif not isinstance(message.get("content"), (str, list)):
            problems.append(f"message {i}: a {role} message needs content")
    for problem in check_history([m for m in messages if isinstance(m, Mapping)]):
        wording = _OPENAI_ORPHAN if "orphan" in problem else _OPENAI_UNANSWERED
        problems.append(f"{problem} (OpenAI: {wording})")
    if reasoning_content:
        problems.extend(_missing_reasoning(messages))
    return problems


def check_openai_chat_request(
    body: Mapping[str, Any], *, reasoning_content: bool = False
) -> list[str]:
    """:func:`check_openai_chat` on a whole request body."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ["the request has no messages list"]
    return check_openai_chat(messages, reasoning_content=reasoning_content)
