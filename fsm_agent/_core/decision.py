"""Reading a model's decision: its structure, its batch of calls, each call's admission.

The loop prepares a :class:`Decision` before firing ``validate``; guards only read it.
Internally a decision is a Chat Completions assistant message::

    {"role": "assistant", "content": "..." | None,
     "tool_calls": [{"id": "call-1", "type": "function",
                     "function": {"name": "check_order", "arguments": "{...}"}}]}

Any other top-level key of the reply (a provider's reasoning or thinking blocks, a note
of a normalisation an adapter applied) is kept verbatim, made JSON-safe, in the history
message, so adapters can send it back where their API requires it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fsm_agent._core.canonical import ArgumentsError, digest, parse_arguments
from fsm_agent._core.intents import IdempotencyRecord
from fsm_agent._core.jsonsafe import clean_text, make_safe

__all__ = [
    "Decision",
    "PreparedCall",
    "Refused",
    "ToolLike",
    "admit_calls",
    "parse_decision",
    "schema_errors",
]

_MAX_ERRORS = 5
_CORE_KEYS = frozenset({"role", "content", "tool_calls"})


class ToolLike(Protocol):
    """What admission needs to know about a registered tool (``tools.registry.Tool``)."""

    @property
    def name(self) -> str: ...
    @property
    def effect(self) -> str: ...
    @property
    def dedup(self) -> bool: ...
    @property
    def requires_approval(self) -> bool: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def idempotency_key(self) -> Callable[[dict[str, Any]], Any] | None: ...
    @property
    def validator(self) -> Any: ...


#: Looks a tool up by name (``ToolRegistry.get``).
ToolLookup = Callable[[str], "ToolLike | None"]
#: ``(call id, args digest) -> approval id`` of an approval that covers the call, or None.
ApprovalLookup = Callable[[str, str], "str | None"]


@dataclass(eq=False, slots=True)
class PreparedCall:
    """One call of a batch, with what the runtime decided about it before anything ran."""

    index: int
    id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None = None
    tool: ToolLike | None = None
    refusal: str | None = None  # unknown_tool | permission_denied | invalid_arguments
    refusal_detail: str = ""
    #: The user's rule that refused the call (``denied_by_rule``, ``limit_reached``), or
    #: that holds it for a reviewer (``rule_review``): ``core/judging.py``.
    refusal_rule: str | None = None
    review_rule: str | None = None
    #: The registrar's facts, copied at admission (a resumed in-flight write keeps the
    #: facts it started with, whatever the registry says later).
    effect: str | None = None
    dedup: bool = False
    needs_approval: bool = False
    approval: str | None = None  # the approval this call consumes, if it needs one
    args_digest: str = ""
    idempotency_key: str | None = None
    #: The record that was under the key when the call was dispatched (not ours).
    record: IdempotencyRecord | None = None
    #: This (run, call) holds the pending intent under the key.
    claimed: bool = False


@dataclass(eq=False, slots=True)
class Decision:
    """A model reply read for the guards. ``message`` is the normalised assistant message."""

    message: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    calls: list[PreparedCall] = field(default_factory=list)
    malformed: str | None = None
    missing_id: str | None = None
    duplicate_id: str | None = None


#: The decision of a run that has none (before the first reply, between batches).
NO_DECISION = Decision()


class Refused(dict[str, Any]):
    """A reply replayed from a trace that recorded it as refused (``malformed``): its
    recorded JSON-safe copy, which may read as well-formed when the reply was refused for
    a value the copy no longer shows (R12), with the verdict the run reached."""

    def __init__(self, message: dict[str, Any], reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_decision(raw: Any) -> Decision:
    """Check a reply's structure and batch ids; never raises."""
    if type(raw) is Refused:
        return Decision(malformed=raw.reason)
    try:
        return _parse(raw)
    except Exception as exc:  # a Mapping subclass whose methods raise, and the like
        return Decision(malformed=f"the reply could not be read: {type(exc).__name__}")


class _Malformed(Exception):
    """A reply that is not an assistant message of well-formed calls (its reason)."""


def _parse(raw: Any) -> Decision:
    # (Loops, not comprehensions: each comprehension is a call, once per reply.)
    try:
        content, tool_calls = _envelope(raw)
        calls: list[PreparedCall] = []
        for i, call in enumerate(tool_calls):
            calls.append(_read_call(i, call))
    except _Malformed as exc:
        return Decision(malformed=str(exc))
    missing = duplicate = None
    seen: set[str] = set()
    recorded: list[dict[str, Any]] = []  # the calls as the normalised message holds them
    for call in calls:
        if not call.id:
            hint = raw.get("missing_id_hint")  # an adapter's advice (a kept extra key)
            missing = missing or f"tool_calls[{call.index}] has no id" + (
                f" ({clean_text(hint)})" if isinstance(hint, str) else ""
            )
        elif call.id in seen:
            duplicate = duplicate or f"id {call.id!r} is used twice"
        seen.add(call.id)
        arguments = call.raw_arguments
        if not arguments.isascii():
            arguments = clean_text(arguments)
        function = {"name": call.name, "arguments": arguments}
        recorded.append({"id": call.id, "type": "function", "function": function})
    answer = None if content is None else clean_text(content)
    message: dict[str, Any] = {"role": "assistant", "content": answer}
    if calls:
        message["tool_calls"] = recorded
    for key, value in raw.items():
        if key not in _CORE_KEYS:
            message[_safe_key(key)] = make_safe(value)
    # (Positional, in field order: message, answer, calls, malformed, missing_id,
    # duplicate_id; a keyword call costs more, once per reply.)
    return Decision(message, answer, calls, None, missing, duplicate)


def _is_mapping(value: Any) -> bool:
    # Callers test ``type(value) is dict`` first, inline: the ABC's instance check (and
    # this call) cost more than the rest of a field.
    return type(value) is dict or isinstance(value, Mapping)


def _envelope(raw: Any) -> tuple[str | None, list[Any]]:
    """The reply's content and its list of calls, or :class:`_Malformed`."""
    if type(raw) is not dict and not _is_mapping(raw):
        raise _Malformed(f"the model returned {type(raw).__name__}, not a message dict")
    if raw.get("role") != "assistant":
        raise _Malformed(f"role must be 'assistant', got {make_safe(raw.get('role'))!r}")
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        raise _Malformed(f"content must be a string or null, got {type(content).__name__}")
    tool_calls = raw.get("tool_calls")
    if tool_calls is None:
        return content, []
    if not isinstance(tool_calls, list):
        raise _Malformed(f"tool_calls must be a list, got {type(tool_calls).__name__}")
    return content, tool_calls


def _read_call(i: int, call: Any) -> PreparedCall:
    """One Chat Completions tool call, or :class:`_Malformed` naming what is wrong."""
    if type(call) is not dict and not _is_mapping(call):
        raise _Malformed(f"tool_calls[{i}] must be an object, got {type(call).__name__}")
    if call.get("type", "function") != "function":
        kind = make_safe(call.get("type"))
        raise _Malformed(f"tool_calls[{i}].type must be 'function', got {kind!r}")
    fn = call.get("function")
    if type(fn) is not dict and not _is_mapping(fn):
        raise _Malformed(f"tool_calls[{i}].function is missing or not an object")
    name, args = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not name:
        raise _Malformed(f"tool_calls[{i}].function.name must be a non-empty string")
    if not isinstance(args, str):
        raise _Malformed(f"tool_calls[{i}].function.arguments must be a JSON string, got "
                         f"{type(args).__name__}")  # fmt: skip
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _Malformed(f"tool_calls[{i}].id must be a string, got {type(call_id).__name__}")
    # (Positional: a keyword call of a 19-field __init__ costs more, once per call. An
    # ASCII text, as ids and names are, holds no lone surrogate: no clean_text call.)
    if call_id:
        call_id = call_id if call_id.isascii() else clean_text(call_id)
    return PreparedCall(i, call_id or "", name if name.isascii() else clean_text(name), args)


def _safe_key(key: Any) -> str:
    return clean_text(key) if isinstance(key, str) else str(make_safe(key))


def admit_calls(
    decision: Decision,
    tools: ToolLookup,
    allowed: Collection[str],
    approval: ApprovalLookup,
) -> None:
    """Decide, for every call of the batch and before any runs, whether it may run.

    Sets each call's ``refusal`` (unknown tool, not allowed, invalid arguments), its
    registrar's facts, and, for admitted writes that need approval, the approval that
    covers exactly these arguments (``approval(call_id, digest)``) or ``needs_approval``.
    """
    for call in decision.calls:
        _admit(call, tools(call.name), allowed, approval)


def _admit(
    call: PreparedCall, tool: ToolLike | None, allowed: Collection[str], approval: ApprovalLookup
) -> None:
    call.tool = tool
    if tool is None:
        call.refusal, call.refusal_detail = "unknown_tool", f"no tool named {call.name!r}"
        return
    call.effect, call.dedup = tool.effect, tool.dedup
    if call.name not in allowed:
        call.refusal = "permission_denied"
        call.refusal_detail = f"tool {call.name!r} is not in this run's allowed_tools"
        return
    try:
        arguments = parse_arguments(call.raw_arguments)
        errors = list(tool.validator.iter_errors(arguments))
    except ArgumentsError as exc:
        call.refusal, call.refusal_detail = "invalid_arguments", str(exc)
        return
    except RecursionError:  # a schema whose validation recurses past the limit
        call.refusal, call.refusal_detail = "invalid_arguments", "arguments nest too deeply"
        return
    if errors:
        errors.sort(key=lambda e: list(e.path))
        call.refusal = "invalid_arguments"
        call.refusal_detail = "; ".join(_describe(e) for e in errors[:_MAX_ERRORS])
        return
    call.arguments = arguments
    if tool.idempotency_key is None and not tool.requires_approval:
        return  # nothing binds to the arguments' hash, so it is not computed
    call.args_digest = digest(tool.name, arguments)
    if tool.idempotency_key is not None:
        try:
            key = tool.idempotency_key(arguments)
            call.idempotency_key = clean_text(str(key))
        except Exception as exc:  # a registrar's key function must not crash a run
            call.refusal = "invalid_arguments"
            call.refusal_detail = f"idempotency key could not be derived: {make_safe(exc)!r}"
            return
    if tool.requires_approval:
        call.approval = approval(call.id, call.args_digest)
        call.needs_approval = call.approval is None


def schema_errors(validator: Any, arguments: Any) -> list[str]:
    """What is wrong with ``arguments`` for a tool's validator (``path: message``, in
    path order, at most a few), as admission reports it; empty if they fit."""
    try:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    except RecursionError:
        return ["(root): arguments nest too deeply"]
    return [_describe(e) for e in errors[:_MAX_ERRORS]]


def _describe(error: Any) -> str:
    """``path: message``, with a huge offending value shortened so the reason survives."""
    path = "/".join(clean_text(str(p)) for p in error.absolute_path)
    message = clean_text(error.message)
    shown = clean_text(repr(error.instance))
    if len(shown) > 60 and shown in message:
        message = message.replace(shown, f"{shown[:40]}... ({len(shown)} chars)")
    if len(message) > 300:
        message = f"{message[:300]}... (fails {error.validator!r})"
    return f"{path or '(root)'}: {message}"
