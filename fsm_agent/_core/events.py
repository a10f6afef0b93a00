"""Typed events: what a run records, one frozen dataclass per trace ``type``.

A run's events are recorded as plain dicts (``RunState.events``, ``RunResult.events``,
the store, the trace file): the dict is the wire form, cheap to build on the hot path,
and it is what the redaction hook (``Runtime(redact=...)``) rewrites. Every dict is
built by a function of this module (:func:`decision`, :func:`transition`, ...), so the
fields of each type are defined here and nowhere else; the typed classes below mirror
them one to one:

* :meth:`Event.to_json` is exactly the recorded dict (a trace line is that dict plus the
  two chain fields, ``run`` and ``chain``, which the encoder appends);
* :func:`event_from_json` (or ``Decided.from_json`` ...) reads a dict back, and a dict
  that does not fit raises :class:`EventError` naming the type, the field and the fix;
* :func:`json_schema` is the one JSON Schema of every type
  (``docs/reference/events.schema.json``, compared with this module by a test).

A field this version does not declare (one a newer version or an extension added) is
kept in ``extra`` and written back by ``to_json``, so a round trip loses nothing.
Interceptors get these objects (``Interceptor.on_event``); the driver builds them only
when a consumer asks for typed events, so a run without one pays nothing.
"""

# _req/_opt below return dataclasses.field(...) carrying each field's JSON kind.
# ruff: noqa: RUF009

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from fsm_agent._errors import FsmAgentError

__all__ = [
    "EVENT_TYPES",
    "UNSET",
    "Decided",
    "Event",
    "EventError",
    "Observed",
    "ReasoningDelta",
    "Reviewed",
    "RuleJudged",
    "RunEnded",
    "RunStarted",
    "TextDelta",
    "ToolArgsDelta",
    "Transitioned",
    "UnknownEvent",
    "decision",
    "decision_failed",
    "decision_oversized",
    "event_from_json",
    "json_schema",
    "json_schema_text",
    "observation",
    "redaction_failed",
    "review",
    "run_end",
    "run_start",
    "typed",
]


class EventError(FsmAgentError, ValueError):
    """A dict that is no valid event of its ``type`` (the message says which field)."""


class _Unset:
    """The value of an optional field a recorded event does not have (a field whose
    value may itself be ``null``, such as a reconciled ``result``)."""

    _instance: ClassVar[_Unset | None] = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


#: The value of an absent optional field whose value may be ``null`` when present.
UNSET: Any = _Unset()

# JSON kinds of a field: how it is checked and how the schema describes it.
_SCHEMAS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "str_or_null": {"type": ["string", "null"]},
    "int": {"type": "integer"},
    "number": {"type": "number"},
    "bool": {"type": "boolean"},
    "object": {"type": "object"},
    "array": {"type": "array"},
    "str_list": {"type": "array", "items": {"type": "string"}},
    "bool_map": {"type": "object", "additionalProperties": {"type": "boolean"}},
    "any": {},
}


#: Kinds whose value may be ``null``: absent is :data:`UNSET`, not ``None``.
_NULLABLE = frozenset({"any", "str_or_null"})


def _fits(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "str_or_null":
        return value is None or isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "str_list":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    assert kind == "bool_map", kind
    return isinstance(value, dict) and all(isinstance(v, bool) for v in value.values())


def _req(kind: str) -> Any:
    """A field every event of the type records."""
    return field(metadata={"kind": kind, "optional": False})


def _opt(kind: str) -> Any:
    """A field recorded only sometimes (absent: ``None``, or :data:`UNSET` for a kind
    whose value may be ``null``)."""
    default = UNSET if kind in _NULLABLE else None
    return field(default=default, metadata={"kind": kind, "optional": True})


E = TypeVar("E", bound="Event")

# Not fields of the JSON body: the run id travels beside it (``run`` on a trace line).
_ENVELOPE = frozenset({"run_id", "extra"})
#: The chain fields the encoder appends to each line (``trace/chain.py``).
_LINE_FIELDS = frozenset({"run", "chain"})


@dataclass(frozen=True, kw_only=True)
class Event:
    """One recorded event: its ``type`` (the trace name), ``seq`` and ``run_id``."""

    #: The trace ``type`` of this class's events.
    TYPE: ClassVar[str] = ""

    seq: int = field(metadata={"kind": "int", "optional": False})
    run_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def type(self) -> str:
        return self.TYPE

    def to_json(self) -> dict[str, Any]:
        """The event as recorded (``RunResult.events``; a trace line without its chain)."""
        out: dict[str, Any] = {"type": self.type}
        for f in _body_fields(type(self)):
            value = getattr(self, f.name)
            # (A nullable optional field may record ``null``: only UNSET is absent.)
            if f.metadata["optional"] and value is (
                UNSET if f.metadata["kind"] in _NULLABLE else None
            ):
                continue
            out[f.name] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_json(
        cls: builtins.type[E], data: Mapping[str, Any], *, run_id: str | None = None
    ) -> E:
        """Read a recorded event of this class's type. ``run_id`` defaults to the dict's
        own (``run_id`` of a header, ``run`` of a chained line). Raises :class:`EventError`."""
        if type(data) is not dict and not isinstance(data, Mapping):
            raise EventError(f"an event must be a JSON object, got {type(data).__name__}")
        got = data.get("type")
        if got != cls.TYPE:
            raise EventError(f"{cls.__name__}.from_json needs type {cls.TYPE!r}, got {got!r}")
        values = _read(cls, data, run_id)
        if values is None:  # it does not fit: the ordered reading says where
            return cls(**_parse(cls, data, run_id))
        event = object.__new__(cls)
        # A frozen dataclass's __init__ sets each of its fields through object.__setattr__
        # (a quarter of an interceptor's cost per event, issue 21's bench); a checked
        # reading fills the same __dict__ at once: defaults, then the values read.
        event.__dict__.update(_reader(cls).defaults)
        event.__dict__.update(values)
        return event


_BODY_FIELDS: dict[type[Event], tuple[dataclasses.Field[Any], ...]] = {}


def _body_fields(cls: type[Event]) -> tuple[dataclasses.Field[Any], ...]:
    # Cached: every event handed to an interceptor is read through it (issue 21's bench).
    found = _BODY_FIELDS.get(cls)
    if found is None:
        found = tuple(f for f in dataclasses.fields(cls) if f.name not in _ENVELOPE)
        _BODY_FIELDS[cls] = found
    return found


@dataclass(frozen=True)
class _Reader:
    """How to read one type's dicts, worked out once per class: an interceptor gets every
    event of a run through :func:`_read`, so the per-event work is one dict look-up and
    one type check per key the event has (not one per field its type declares)."""

    #: field name -> its kind's exact types (:data:`_EXACT`)
    fields: dict[str, tuple[frozenset[type] | None, frozenset[type] | None]]
    #: The fields every event of the type records.
    required: frozenset[str]
    #: Keys that are neither fields nor ``extra`` (``type``, the chain's, the run id).
    skipped: frozenset[str]
    #: Each field's default (every field but ``extra`` has a plain one).
    defaults: dict[str, Any]
    #: The keys a builder writes: the fields and ``type``.
    declared: frozenset[str]


_READERS: dict[type[Event], _Reader] = {}

_NONE = type(None)
#: Per kind: the exact types of a value that fits (None: any value) and, for a container
#: of typed items, the exact type of its items. Exact types, not isinstance: a subclass
#: (a str enum, say) is not read here but by :func:`_parse`, which accepts it.
_EXACT: dict[str, tuple[frozenset[type] | None, frozenset[type] | None]] = {
    "str": (frozenset({str}), None),
    "str_or_null": (frozenset({str, _NONE}), None),
    "int": (frozenset({int}), None),
    "number": (frozenset({int, float}), None),
    "bool": (frozenset({bool}), None),
    "object": (frozenset({dict}), None),
    "array": (frozenset({list}), None),
    "str_list": (frozenset({list}), frozenset({str})),
    "bool_map": (frozenset({dict}), frozenset({bool})),
    "any": (None, None),
}


def _reader(cls: type[Event]) -> _Reader:
    found = _READERS.get(cls)
    if found is None:
        body = _body_fields(cls)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING}  # fmt: skip
        found = _READERS[cls] = _Reader(
            fields={f.name: _EXACT[f.metadata["kind"]] for f in body},
            required=frozenset(f.name for f in body if not f.metadata["optional"]),
            skipped=frozenset({"type", "run_id"} | _LINE_FIELDS),
            defaults=defaults,
            declared=frozenset({f.name for f in body} | {"type"}),
        )
    return found


def _read(cls: type[Event], data: Mapping[str, Any], run_id: str | None) -> dict[str, Any] | None:
    """What :func:`_parse` returns for a dict that fits, read key by key; ``None`` for
    one that does not (:func:`_parse` then raises the error, in field order)."""
    reader = _reader(cls)
    fields = reader.fields
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        spec = fields.get(key)
        if spec is None:
            if key not in reader.skipped:
                extra[key] = value
            continue
        types, items = spec
        if types is not None and type(value) not in types:
            return None
        if items is not None and not items.issuperset(
            map(type, value.values() if type(value) is dict else value)
        ):
            return None
        values[key] = value
    if not reader.required <= values.keys():
        return None
    rid = data.get("run_id") if cls is RunStarted else (
        run_id if run_id is not None else data.get("run", ""))  # fmt: skip
    if not isinstance(rid, str):
        return None
    values["run_id"] = rid
    values["extra"] = extra
    return values


def _parse(cls: type[Event], data: Mapping[str, Any], run_id: str | None) -> dict[str, Any]:
    where = f"{cls.TYPE!r} event" + (f" seq {data['seq']!r}" if "seq" in data else "")
    values: dict[str, Any] = {}
    for f in _body_fields(cls):
        kind, optional = f.metadata["kind"], f.metadata["optional"]
        if f.name not in data:
            if optional:
                continue
            raise EventError(
                f"{where}: field {f.name!r} is missing (every {cls.TYPE!r} event records "
                f"{_kind_text(kind)} there)"
            )
        value = data[f.name]
        if not _fits(kind, value):
            raise EventError(
                f"{where}: field {f.name!r} must be {_kind_text(kind)}, "
                f"got {type(value).__name__} {_short(value)}"
            )
        values[f.name] = value
    declared = {f.name for f in _body_fields(cls)} | {"type"}
    if cls is RunStarted:  # the header records its run id in its body
        if "run_id" not in data:
            raise EventError(f"{where}: field 'run_id' is missing (the header names its run)")
        rid = data["run_id"]
    else:
        rid = run_id if run_id is not None else data.get("run", "")
    if not isinstance(rid, str):
        raise EventError(f"{where}: the run id must be a string, got {type(rid).__name__}")
    values["run_id"] = rid
    # (``run_id`` is the envelope's: only the header records it in its body.)
    skip = declared | _LINE_FIELDS | {"run_id"}
    values["extra"] = {k: v for k, v in data.items() if k not in skip}
    return values


def _kind_text(kind: str) -> str:
    return {
        "str": "a string",
        "str_or_null": "a string or null",
        "int": "an integer",
        "number": "a number",
        "bool": "true or false",
        "object": "an object",
        "array": "an array",
        "str_list": "an array of strings",
        "bool_map": "an object of true/false values",
        "any": "any JSON value",
    }[kind]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ── the event types ───────────────────────────────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    """``run_start``: the header (seq 0): the settings the run is judged under."""

    TYPE: ClassVar[str] = "run_start"
    schema: str = _req("str")
    machine_hash: str = _req("str")
    policy: str = _req("str")
    budget: dict[str, Any] = _req("object")
    retry: dict[str, Any] = _req("object")
    allowed_tools: list[str] = _req("str_list")
    approvals: list[Any] = _req("array")
    #: The tools' declared facts (effect, idempotency, ...) by name.
    tools: dict[str, Any] | None = _opt("object")
    #: The chain mode: ``sha256`` or ``hmac-sha256`` (``trace/chain.py``).
    integrity: str | None = _opt("str")
    #: True when a redaction hook (``Runtime(redact=...)``) rewrote the events recorded.
    redacted: bool | None = _opt("bool")
    messages: list[Any] = _req("array")

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        # The header is the one event that records its run id in the body.
        return {"type": out.pop("type"), "seq": out.pop("seq"), "schema": out.pop("schema"),
                "run_id": self.run_id, **out}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Decided(Event):
    """``decision``: the model's reply as recorded (``message``), or why asking failed
    (``error``); ``malformed`` says why a reply was refused."""

    TYPE: ClassVar[str] = "decision"
    message: Any = _opt("any")
    error: str | None = _opt("str")
    malformed: str | None = _opt("str")
    #: call id -> its arguments' UTF-8 bytes in hex, for arguments holding lone
    #: surrogates (the message shows them as U+FFFD): what ``check`` replays admission on.
    raw_arguments: Any = _opt("any")
    #: A reply over ``max_reply_bytes``, recorded by its size (bytes of its JSON text)
    #: and ``usage`` instead of its ``message`` (the run stops ``reply_size``).
    oversized: int | None = _opt("int")
    usage: Any = _opt("any")


@dataclass(frozen=True, kw_only=True)
class Transitioned(Event):
    """``transition``: an edge taken, the guards evaluated to choose it (in table
    order), and the run's time ``t`` (seconds since it started); the call fields when
    a call is current, ``outcome``/``error`` on ``tool_returned``, ``reason``/``detail``
    on an edge that stops the run."""

    TYPE: ClassVar[str] = "transition"
    trigger: str = _req("str")
    source: str = _req("str")
    dest: str = _req("str")
    guards: dict[str, bool] = _req("bool_map")
    t: float = _req("number")
    call_id: str | None = _opt("str")
    tool: str | None = _opt("str")
    attempt: int | None = _opt("int")
    approval: str | None = _opt("str")
    #: The store's answer to spending a use of a limited approval (``granted`` /
    #: ``refused``), on the ``dispatch`` that asked.
    approval_use: str | None = _opt("str")
    outcome: str | None = _opt("str")
    error: str | None = _opt("str")
    reason: str | None = _opt("str")
    detail: str | None = _opt("str")
    #: What the world answered since the previous transition, in order (``check``
    #: replays them): ``idempotency_key``, ``begin_intent``, ``load_intent``, ``resumed``.
    inputs: Any = _opt("any")
    #: A ``cancel`` asked from outside the run (the review server, ``fsm-agent runs
    #: cancel``): who asked (an API key's name, ``--by``), when (ISO-8601 UTC) and why.
    by: str | None = _opt("str")
    at: str | None = _opt("str")
    note: str | None = _opt("str")


@dataclass(frozen=True, kw_only=True)
class Observed(Event):
    """``observation``: the result bound to a call as its tool message (``synthetic``:
    written by the runtime, not returned by the tool)."""

    TYPE: ClassVar[str] = "observation"
    call_id: str = _req("str")
    tool: str = _req("str")
    result: Any = _req("any")
    synthetic: bool = _req("bool")
    #: A result alone past the output budget: its size, ``result`` being the stand-in.
    oversized: int | None = _opt("int")
    #: Raw bytes of the images and files the tool message carries (``max_output_bytes``).
    media_bytes: int | None = _opt("int")


@dataclass(frozen=True, kw_only=True)
class Reviewed(Event):
    """``review``: a reviewer's decision on a paused call: ``digest`` (approve),
    ``reason`` (deny), ``result`` (reconcile), or for ``edit`` (approve with corrected
    arguments) the ``arguments`` the call runs with, their ``digest`` and the
    ``original_arguments`` the model asked for; who decided (``reviewer``, may be
    ``null``), when (``at``, ISO-8601 UTC) and why (``note``)."""

    TYPE: ClassVar[str] = "review"
    action: str = _req("str")
    call_id: str = _req("str")
    tool: str = _req("str")
    digest: str | None = _opt("str")
    reason: str | None = _opt("str")
    result: Any = _opt("any")
    reviewer: Any = _opt("str_or_null")
    at: str | None = _opt("str")
    note: str | None = _opt("str")
    arguments: dict[str, Any] | None = _opt("object")
    original_arguments: dict[str, Any] | None = _opt("object")


@dataclass(frozen=True, kw_only=True)
class RuleJudged(Event):
    """``rule``: one evaluation of a user's rule (issue 19): which rule, in which phase,
    for which call, a digest of what it read, and its verdict."""

    TYPE: ClassVar[str] = "rule"
    #: The rule that decided (null with verdict ``pass``: none of the tried rules held).
    rule: str | None = _req("str_or_null")
    phase: str = _req("str")
    inputs_digest: str = _req("str")
    verdict: str = _req("str")
    call_id: str | None = _opt("str")
    detail: str | None = _opt("str")
    #: Why the deciding rule could not be evaluated (it failed closed).
    error: str | None = _opt("str")
    #: The Python conditions that ran (``check`` cannot re-evaluate them).
    opaque: list[str] | None = _opt("str_list")
    #: A ``review`` verdict: the digest of the call's exact arguments a reviewer approves.
    args_digest: str | None = _opt("str")
    #: A ``review`` verdict a reviewer's approval of this call and digest already settled.
    reviewed: str | None = _opt("str")
    #: An ``after_tool`` deny: the result the tool returned, which the model never sees.
    result: Any = _opt("any")


@dataclass(frozen=True, kw_only=True)
class RunEnded(Event):
    """``run_end``: where the run stopped, its answer and its counters."""

    TYPE: ClassVar[str] = "run_end"
    status: str = _req("str")
    reason: str = _req("str")
    detail: str = _req("str")
    answer: Any = _req("any")
    counters: dict[str, Any] = _req("object")


@dataclass(frozen=True, kw_only=True)
class TextDelta(Event):
    """``text_delta``: a piece of the reply's text while it streams (observation only:
    the decision is taken on the whole reply)."""

    TYPE: ClassVar[str] = "text_delta"
    index: int = _req("int")
    text: str = _req("str")


@dataclass(frozen=True, kw_only=True)
class ReasoningDelta(Event):
    """``reasoning_delta``: a piece of the model's reasoning while it streams."""

    TYPE: ClassVar[str] = "reasoning_delta"
    index: int = _req("int")
    text: str = _req("str")


@dataclass(frozen=True, kw_only=True)
class ToolArgsDelta(Event):
    """``tool_args_delta``: a fragment of a call's arguments while they stream."""

    TYPE: ClassVar[str] = "tool_args_delta"
    call_id: str = _req("str")
    index: int = _req("int")
    fragment: str = _req("str")


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """What a consumer gets for a recorded dict no class here reads: a type a newer
    version or an extension added, an event a redaction hook left incomplete, or one it
    failed on (``redaction_failed``). ``data`` is the dict as recorded."""

    name: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.name

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


#: trace ``type`` -> its class (every type of the trace contract).
EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        Decided,
        Transitioned,
        Observed,
        Reviewed,
        RuleJudged,
        RunEnded,
        TextDelta,
        ReasoningDelta,
        ToolArgsDelta,
    )
}


def event_from_json(data: Mapping[str, Any], *, run_id: str | None = None) -> Event:
    """The typed event of a recorded dict; :class:`EventError` if it is none."""
    if not isinstance(data, Mapping):
        raise EventError(f"an event must be a JSON object, got {type(data).__name__}")
    name = data.get("type")
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise EventError(
            f"unknown event type {name!r} (one of: {', '.join(EVENT_TYPES)})"
            if "type" in data
            else "an event needs a 'type' field"
        )
    return cls.from_json(data, run_id=run_id)


def typed(data: Mapping[str, Any], run_id: str, *, built: bool = False) -> Event:
    """The typed event of ``data`` for a consumer: :class:`UnknownEvent` where no class
    reads it (a consumer never fails because of what a redaction hook recorded).

    ``built``: ``data`` is a dict as this module's builders made it (no redaction hook
    rewrote it), so its fields fit their kinds: they are taken as they are, unchecked
    (an interceptor gets every event of a run this way). A key no class declares still
    goes the checked way."""
    if built and type(data) is dict:
        cls = EVENT_TYPES.get(data.get("type"))  # type: ignore[arg-type]
        # (The header, once a run, is read checked: its run id is in its body.)
        if cls is not None and cls is not RunStarted and data.keys() <= _reader(cls).declared:
            event = object.__new__(cls)
            fields = event.__dict__
            fields.update(_reader(cls).defaults)
            fields.update(data)
            del fields["type"]
            fields["run_id"] = run_id
            fields["extra"] = {}
            return event
    try:
        return event_from_json(data, run_id=run_id)
    except EventError:
        seq = data.get("seq")
        return UnknownEvent(
            seq=seq if isinstance(seq, int) else -1,
            run_id=run_id,
            name=str(data.get("type", "")),
            data=dict(data),
        )


# ── building the recorded dicts (the one place each type's fields are written) ────
# (A ``transition`` is built where it is taken, ``core/loop.py``'s ``_after``: five
# times per tool round, one call less each.)


def run_start(run_id: str, schema: str, header: Mapping[str, Any], messages: Any) -> dict[str, Any]:
    return {"type": "run_start", "seq": 0, "schema": schema, "run_id": run_id, **header,
            "messages": messages}  # fmt: skip


def decision(seq: int, message: Any, malformed: str | None) -> dict[str, Any]:
    event = {"type": "decision", "seq": seq, "message": message}
    if malformed is not None:
        event["malformed"] = malformed
    return event


def decision_oversized(seq: int, size: int, usage: Any) -> dict[str, Any]:
    """A reply over ``max_reply_bytes``: its size and usage, never its message."""
    event: dict[str, Any] = {"type": "decision", "seq": seq, "oversized": size}
    if usage is not None:
        event["usage"] = usage
    return event


def decision_failed(seq: int, error: str) -> dict[str, Any]:
    return {"type": "decision", "seq": seq, "error": error}


def observation(call_id: str, tool: str, result: Any, synthetic: bool) -> dict[str, Any]:
    """An observation without its ``seq`` (given when it is recorded after its edge)."""
    return {"type": "observation", "call_id": call_id, "tool": tool, "result": result,
            "synthetic": synthetic}  # fmt: skip


def review(action: str, call_id: str, tool: str) -> dict[str, Any]:
    """A review's required fields, without its ``seq``; the decision's own fields
    (``digest``, ``reason``, ``result``, ``arguments``) are added by ``durable/review.py``."""
    return {"type": "review", "action": action, "call_id": call_id, "tool": tool}


def run_end(
    seq: int, status: str | None, reason: str | None, detail: str, answer: Any, counters: Any
) -> dict[str, Any]:
    return {"type": "run_end", "seq": seq, "status": status, "reason": reason,
            "detail": detail, "answer": answer, "counters": counters}  # fmt: skip


def redaction_failed(event: Mapping[str, Any], error: str) -> dict[str, Any]:
    """What is recorded when the redaction hook failed on ``event``: its type and seq
    only (a secret is never recorded because redaction broke)."""
    return {"type": event["type"], "seq": event["seq"], "redaction_failed": error}


# ── the JSON Schema ───────────────────────────────────────────────────────────────


def json_schema() -> dict[str, Any]:
    """One JSON Schema (draft 2020-12) of every event type, from the classes above.
    An event may carry fields no class declares (``extra``; a line's chain fields)."""
    defs: dict[str, Any] = {}
    for name, cls in EVENT_TYPES.items():
        props: dict[str, Any] = {"type": {"const": name}}
        required = ["type"]
        for f in _body_fields(cls):
            kind = f.metadata["kind"]
            prop = dict(_SCHEMAS[kind])
            props[f.name] = prop
            if not f.metadata["optional"]:
                required.append(f.name)
        if cls is RunStarted:
            props["run_id"] = {"type": "string"}
            required.append("run_id")
        defs[cls.__name__] = {
            "description": " ".join((cls.__doc__ or "").split()),
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": True,
        }
    defs["RedactionFailed"] = {
        "description": "Any event the redaction hook failed on: only its type and seq, and "
        "why (a secret is never recorded because redaction broke).",
        "type": "object",
        "properties": {
            "type": {"enum": list(EVENT_TYPES)},
            "seq": {"type": "integer"},
            "redaction_failed": {"type": "string"},
        },
        "required": ["type", "seq", "redaction_failed"],
        "additionalProperties": True,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "fsm-agent trace event",
        "description": "One event of a run, as recorded (a trace line adds 'run' and 'chain').",
        "anyOf": [{"$ref": f"#/$defs/{name}"} for name in defs],
        "$defs": defs,
    }


def json_schema_text() -> str:
    """:func:`json_schema` as the committed file holds it."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
