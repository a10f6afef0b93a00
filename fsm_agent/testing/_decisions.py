"""Short builders for the decisions a scripted model returns.

::

    script = [decide(call("lookup", {"key": "A17"})), answer("A17 is in transit.")]
    model = ScriptedModel(script)

Ids are numbered ``c1``, ``c2``, ... per :func:`decide` unless given, so a test only
spells an id when the id is what it is testing.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["answer", "call", "decide"]


def call(
    name: str,
    arguments: dict[str, Any] | str | None = None,
    *,
    id: str | None = None,
    no_id: bool = False,
) -> dict[str, Any]:
    """One tool call. ``arguments`` may be a dict (serialised) or a raw string (sent as is,
    to test malformed JSON). Without ``id``, :func:`decide` numbers the call;
    ``no_id=True`` sends ``"id": null`` (a call that can never be paired)."""
    if arguments is None:
        arguments = {}
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": text}}
    if no_id:
        out["id"] = None
    elif id is not None:
        out["id"] = id
    return out


def decide(
    *calls: dict[str, Any], content: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An assistant message asking for ``calls``; calls without an id become ``c1``, ..."""
    numbered = [c if "id" in c else {"id": f"c{i}", **c} for i, c in enumerate(calls, 1)]
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": numbered}
    if usage is not None:
        message["usage"] = usage
    return message


def answer(text: str, *, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A final answer: an assistant message with text and no tool call."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if usage is not None:
        message["usage"] = usage
    return message
