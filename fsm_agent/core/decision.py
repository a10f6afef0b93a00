"""Reading a model's decision: its structure, its batch of calls, and each call's admission.

The shell prepares a :class:`Decision` before firing ``validate``; the guards only read it.
Internally a decision is a Chat Completions assistant message::

    {"role": "assistant", "content": "..." | None,
     "tool_calls": [{"id": "call-1", "type": "function",
                     "function": {"name": "check_order", "arguments": "{...}"}}]}
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsm_agent.core.canonical import ArgumentsError, digest, parse_arguments
from fsm_agent.durable.store import IdempotencyRecord
from fsm_agent.tools.registry import Tool, ToolRegistry

__all__ = ["Decision", "PreparedCall", "parse_decision"]

_MAX_ERRORS = 5
_DECISION_KEYS = frozenset({"role", "content", "tool_calls"})


@dataclass(eq=False)
class PreparedCall:
    """One call of a batch, with what the runtime decided about it before anything ran."""

    index: int
    id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None = None
    tool: Tool | None = None
    refusal: str | None = None  # unknown_tool | permission_denied | invalid_arguments
    refusal_detail: str = ""
    needs_approval: bool = False
    args_digest: str = ""
    idempotency_key: str | None = None
    record: IdempotencyRecord | None = None  # fetched by the shell just before dispatch

    @property
    def effect(self) -> str | None:
        return self.tool.effect if self.tool is not None else None

    @property
    def tool_dedup(self) -> bool:
        return self.tool is not None and self.tool.dedup


@dataclass(eq=False)
class Decision:
    """A model reply read for the guards. ``message`` is the normalised assistant message."""

    message: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    calls: list[PreparedCall] = field(default_factory=list)
    malformed: str | None = None
    missing_id: str | None = None
    duplicate_id: str | None = None


def parse_decision(raw: Any) -> Decision:  # noqa: C901 - one check per field of a reply, in reading order
    """Check a reply's structure and batch ids; never raises."""
    if not isinstance(raw, Mapping):
        return Decision(malformed=f"the model returned {type(raw).__name__}, not a message dict")
    if raw.get("role") != "assistant":
        return Decision(malformed=f"role must be 'assistant', got {raw.get('role')!r}")
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        return Decision(malformed=f"content must be a string or null, got {type(content).__name__}")
    tool_calls = raw.get("tool_calls")
    if tool_calls is None:
        tool_calls = []
    if not isinstance(tool_calls, list):
        return Decision(malformed=f"tool_calls must be a list, got {type(tool_calls).__name__}")
    calls: list[PreparedCall] = []
    normalised: list[dict[str, Any]] = []
    missing = duplicate = None
    seen: set[str] = set()
    for i, call in enumerate(tool_calls):
        where = f"tool_calls[{i}]"
        if not isinstance(call, Mapping):
            return Decision(malformed=f"{where} must be an object, got {type(call).__name__}")
        if call.get("type", "function") != "function":
            return Decision(malformed=f"{where}.type must be 'function', got {call.get('type')!r}")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            return Decision(malformed=f"{where}.function is missing or not an object")
        name, args = fn.get("name"), fn.get("arguments")
        if not isinstance(name, str) or not name:
            return Decision(malformed=f"{where}.function.name must be a non-empty string")
        if not isinstance(args, str):
            return Decision(
                malformed=f"{where}.function.arguments must be a JSON string, got "
                f"{type(args).__name__}"
            )
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            return Decision(malformed=f"{where}.id must be a string, got {type(call_id).__name__}")
        if not call_id:
            hint = raw.get("missing_id_hint")  # an adapter's advice (contract A key)
            missing = missing or f"{where} has no id" + (
                f" ({hint})" if isinstance(hint, str) else ""
            )
        elif call_id in seen:
            duplicate = duplicate or f"id {call_id!r} is used twice"
        else:
            seen.add(call_id)
        calls.append(PreparedCall(index=i, id=call_id or "", name=name, raw_arguments=args))
        normalised.append(
            {"id": call_id or "", "type": "function", "function": {"name": name, "arguments": args}}
        )
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if normalised:
        message["tool_calls"] = normalised
    # Contract A: every other key an adapter returned (reasoning it must send back, a
    # normalisation it applied) stays in the history verbatim, as opaque JSON data.
    message.update((k, v) for k, v in raw.items() if k not in _DECISION_KEYS)
    return Decision(
        message=message, answer=content, calls=calls, missing_id=missing, duplicate_id=duplicate
    )


def admit_calls(
    decision: Decision,
    registry: ToolRegistry,
    allowed: Collection[str],
    approved: Collection[str],
) -> None:
    """Decide, for every call of the batch and before any runs, whether it may run.

    Sets each call's ``refusal`` (unknown tool, not allowed, invalid arguments) and, for
    admitted writes that need approval, whether ``approved`` (approval digests) covers it.
    """
    for call in decision.calls:
        tool = registry.get(call.name)
        call.tool = tool
        if tool is None:
            call.refusal, call.refusal_detail = "unknown_tool", f"no tool named {call.name!r}"
            continue
        if call.name not in allowed:
            call.refusal = "permission_denied"
            call.refusal_detail = f"tool {call.name!r} is not in this run's allowed_tools"
            continue
        try:
            arguments = parse_arguments(call.raw_arguments)
        except ArgumentsError as exc:
            call.refusal, call.refusal_detail = "invalid_arguments", str(exc)
            continue
        errors = sorted(tool.validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            call.refusal = "invalid_arguments"
            call.refusal_detail = "; ".join(_describe(e) for e in errors[:_MAX_ERRORS])
            continue
        call.arguments = arguments
        if tool.idempotency_key is None and not tool.requires_approval:
            continue  # nothing binds to the arguments' hash, so it is not computed
        call.args_digest = digest(tool.name, arguments)
        if tool.idempotency_key is not None:
            try:
                key = tool.idempotency_key(arguments)
            except Exception as exc:  # a registrar's key function must not crash a run
                call.refusal = "invalid_arguments"
                call.refusal_detail = f"idempotency key could not be derived: {exc!r}"
                continue
            call.idempotency_key = str(key)
        if tool.requires_approval and call.args_digest not in approved:
            call.needs_approval = True


def _describe(error: Any) -> str:
    """``path: message``, with a huge offending value shortened so the reason survives."""
    path = "/".join(str(p) for p in error.absolute_path)
    message = error.message
    shown = repr(error.instance)
    if len(shown) > 60 and shown in message:
        message = message.replace(shown, f"{shown[:40]}... ({len(shown)} chars)")
    if len(message) > 300:
        message = f"{message[:300]}... (fails {error.validator!r})"
    return f"{path or '(root)'}: {message}"
