"""One run's state: everything the loop, the guards and the actions read and write.

:class:`RunState` is the model ``transitions`` fires (its ``state`` attribute is the
machine state). It is plain data plus a reference to the run's :class:`RunConfig` (what
the trusted caller configured: budget, retry, policy, allow-list, tools, approvals, the
machine), and it serialises itself: :meth:`RunState.snapshot` gives a small versioned,
checksummed dict (the checkpoint) and :meth:`RunState.restore` reads one back, so durable
code never knows its fields.

Every field declares whether it is persisted (in attrs' style: the declaration is the
format). :func:`persisted` marks a field the checkpoint carries, with its key and, where
its value is not plain JSON, how it is written and read back; :func:`apart` marks one
that is not, and why: stored by other means (the history and the trace, which stores
append row by row), the loop's cursors over what left it, or scratch of one transition.
One serialiser walks ``fields()``, so a field cannot be added and silently forgotten: a
field that declares neither fails at import.
"""

# persisted()/apart() are field specifiers (they return dataclasses.field), which RUF009
# cannot tell from a call whose result would be shared between instances.
# ruff: noqa: RUF009

from __future__ import annotations

import json
import operator
import zlib
from collections.abc import Callable, Collection
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal

from fsm_agent._core.approvals import ApprovalBook
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.decision import NO_DECISION, Decision, PreparedCall, ToolLike, parse_decision
from fsm_agent._core.jsonsafe import c_dumps
from fsm_agent._core.requests import ToolOutcome
from fsm_agent._core.table import DEFAULT_MACHINE, INITIAL_STATE, TRANSITIONS, Machine, Transition
from fsm_agent._errors import CorruptRecord, MachineMismatch
from fsm_agent._rules import RuleSet

__all__ = [
    "NO_CALL",
    "SNAPSHOT_VERSION",
    "Counters",
    "RunConfig",
    "RunState",
    "SaveMode",
    "apart",
    "declarations",
    "persisted",
    "snapshot_machine",
]

#: Version of :meth:`RunState.snapshot`'s layout (bump with a reader for the old one).
#: 3: the machine hash is on the envelope, next to the version (the machine is the frame
#: the body is read in, not a field of it); the body holds exactly the persisted fields.
#: 2: the same body with ``machine_hash`` inside it (read by :func:`_verified`).
SNAPSHOT_VERSION = 3

#: When the loop saves a checkpoint: never (no store keeps runs), around writes and at
#: ends (a store that dies with the process), or also after every model reply (SQLite,
#: PostgreSQL).
SaveMode = Literal["never", "writes", "replies"]

#: The current call of a run between batches (``RunState.call``).
NO_CALL = PreparedCall(-1, "", "", "")


class Counters:
    """What a run has spent so far; ``as_dict()`` is ``RunResult.counters``."""

    __slots__ = (
        "cost",
        "input_tokens",
        "model_calls",
        "output_bytes",
        "output_tokens",
        "replays",
        "retries",
        "tokens",
        "tool_attempts",
        "tool_calls",
        "tool_rounds",
        "write_attempts",
    )

    def __init__(self) -> None:
        self.model_calls = self.tool_rounds = self.tool_calls = 0
        self.write_attempts = self.replays = self.retries = self.output_bytes = 0
        self.input_tokens = self.output_tokens = self.tokens = 0
        self.cost = 0.0
        self.tool_attempts: dict[str, int] = {}

    def as_dict(self) -> dict[str, Any]:
        out = dict(zip(self.__slots__, _ALL_COUNTERS(self), strict=True))
        out["tool_attempts"] = dict(self.tool_attempts)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Counters:
        counters = cls()
        for name in cls.__slots__:
            if name in data:
                setattr(counters, name, data[name])
        counters.tool_attempts = dict(counters.tool_attempts)
        return counters


#: Every counter of a run at once (``Counters.as_dict``: at every judgement of a rule).
_ALL_COUNTERS = operator.attrgetter(*Counters.__slots__)


@dataclass(frozen=True, eq=False)
class RunConfig:
    """What the trusted caller set for one run; never changed by the run."""

    budget: Budget
    retry: RetryPolicy
    policy: Literal["default", "strict"]
    allowed: frozenset[str]
    tools: Callable[[str], ToolLike | None]
    tool_specs: list[dict[str, Any]]
    approvals: ApprovalBook = field(default_factory=ApprovalBook)
    save: SaveMode = "never"
    #: The run has a consumer of its events (a trace sink, an interceptor's on_event):
    #: the loop yields ``EmitEvents`` after every edge, before any other request.
    emit: bool = False
    #: Extra fields of the ``run_start`` header (the tools' declared facts, ...).
    header: dict[str, Any] = field(default_factory=dict)
    #: Rewrites each event before it is recorded (``Runtime(redact=...)``).
    redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    #: The machine the run fires (``Runtime(machine=...)``; a resumed run's is the one
    #: its checkpoint names).
    machine: Machine = DEFAULT_MACHINE
    #: The application's rules (``Runtime(rules=...)``), judged by the loop
    #: (``core/judging.py``); ``machine`` then carries their rows. None: no judging at all.
    rules: RuleSet | None = None

    def header_fields(self) -> dict[str, Any]:
        """The caller's settings as the trace header and the store record them."""
        return {
            "machine_hash": self.machine.hash,
            "policy": self.policy,
            "budget": self.budget.to_dict(),
            "retry": self.retry.to_dict(),
            "allowed_tools": sorted(self.allowed),
            "approvals": self.approvals.header(),
            **({"rules": self.rules.to_json()} if self.rules is not None else {}),
            **self.header,
        }


# ── field declarations ────────────────────────────────────────────────────────────

#: ``dump(state) -> JSON value`` and ``load(state, value)``: how a persisted field that is
#: not plain JSON is written and read back (``load`` runs in declaration order, so it may
#: read fields declared before its own).
Dump = Callable[["RunState"], Any]
Load = Callable[["RunState", Any], None]


def persisted(
    default: Any = None,
    *,
    factory: Callable[[], Any] | None = None,
    key: str | None = None,
    dump: Dump | None = None,
    load: Load | None = None,
    optional: bool = False,
) -> Any:
    """A field the checkpoint carries, under ``key`` (default: its name); a plain JSON
    value unless ``dump``/``load`` say otherwise. ``optional``: left out while empty, and
    its default when absent (a field added later: checkpoints without it still read, and
    a run that never sets it writes the same checkpoint as before it existed)."""
    meta = {"persist": True, "key": key, "dump": dump, "load": load, "optional": optional}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def apart(why: str, default: Any = None, *, factory: Callable[[], Any] | None = None) -> Any:
    """A field the checkpoint does not carry, and ``why`` (``stored`` elsewhere, a loop
    ``cursor``, transition ``scratch``)."""
    meta = {"persist": False, "why": why}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _required(why: str) -> Any:
    """A constructor argument the checkpoint does not carry (it is stored apart)."""
    return field(metadata={"persist": False, "why": why})


def _dump_call(s: RunState) -> dict[str, Any] | None:
    call = s.call
    if call.index < 0:
        return None
    return {
        "index": call.index,
        "effect": call.effect,
        "dedup": call.dedup,
        "key": call.idempotency_key,
        "digest": call.args_digest,
        "claimed": call.claimed,
    }


def _load_call(s: RunState, stored: dict[str, Any] | None) -> None:
    if stored is None:
        return
    # The current call keeps the facts it was checkpointed with (admission may differ
    # under today's registry).
    call = s.decision.calls[stored["index"]]
    call.effect, call.dedup = stored["effect"], stored["dedup"]
    call.idempotency_key, call.args_digest = stored["key"], stored["digest"]
    call.claimed = stored["claimed"]
    s.call = call


def _load_decision(s: RunState, message: dict[str, Any] | None) -> None:
    if message is not None:
        s.decision = parse_decision(message)  # parsed again, not admitted: see restore()


def _load_taken(s: RunState, key: str) -> None:
    taken = s.config.machine.edge_by_key(key)
    if taken is None:  # guessing here could mean running a write twice: refuse
        raise ValueError(f"its last transition {key!r} is no edge of this table")
    s.taken = taken


def _load_started(s: RunState, elapsed: float) -> None:
    # The loop re-bases ``started`` on its clock: wall-clock budgets count the time the
    # run was alive, not the time it lay stored.
    s.started, s.now = -float(elapsed), 0.0


def _set(name: str, convert: Callable[[Any], Any]) -> Load:
    def load(s: RunState, value: Any) -> None:
        setattr(s, name, convert(value))

    return load


@dataclass(eq=False)
class RunState:
    """The state of one run (see the module docstring). Mutated only by the loop."""

    run_id: str = _required("stored: the store's key")
    config: RunConfig = _required("stored: rebuilt from the trace header")
    messages: list[dict[str, Any]] = _required("stored: history rows")
    state: str = persisted(INITIAL_STATE)  # the attribute ``transitions`` reads and writes
    seq: int = persisted(0)
    counters: Counters = persisted(
        factory=Counters,
        dump=lambda s: s.counters.as_dict(),
        load=_set("counters", Counters.from_dict),
    )
    started: float = persisted(
        0.0, key="elapsed", dump=lambda s: s.now - s.started, load=_load_started
    )
    #: The clock reading of the last I/O (``started`` is re-based on it).
    now: float = apart("scratch: the loop's last clock reading", 0.0)
    decision: Decision = persisted(
        NO_DECISION,
        dump=lambda s: None if s.decision is NO_DECISION else s.decision.message,
        load=_load_decision,
    )
    batch_appended: bool = persisted(False)
    index: int = persisted(0)
    call: PreparedCall = persisted(NO_CALL, dump=_dump_call, load=_load_call)
    attempt: int = persisted(0)
    outcome: ToolOutcome = persisted(
        factory=lambda: ToolOutcome("ok"),
        dump=lambda s: [s.outcome.kind, s.outcome.error],
        load=_set("outcome", lambda v: ToolOutcome(v[0], error=v[1])),
    )
    #: A reply reported no usable token count / cost (it then counts as over a set limit).
    tokens_unknown: bool = persisted(False)
    cost_unknown: bool = persisted(False)
    #: Bytes of the JSON text of the last reply (``max_reply_bytes``): read only by the
    #: ``model_replied`` that follows the reply, so a checkpoint never needs it.
    reply_bytes: int = apart("scratch: the size of the reply just received", 0)
    answered: set[str] = persisted(
        factory=set, dump=lambda s: sorted(s.answered), load=_set("answered", set)
    )
    #: call id -> (index in ``messages``, error) of a synthetic answer a reviewer may replace.
    placeholders: dict[str, tuple[int, str]] = persisted(
        factory=dict,
        dump=lambda s: {k: list(v) for k, v in s.placeholders.items()},
        load=_set("placeholders", lambda v: {k: (int(i), str(e)) for k, (i, e) in v.items()}),
    )
    #: call id -> a reviewer's decision on a paused call of the current batch.
    reviews: dict[str, dict[str, Any]] = persisted(factory=dict, load=_set("reviews", dict))
    #: call id -> the limited approval a call of the current batch spent a use of (the
    #: store granted it: a retry or a resume does not ask again).
    approvals: dict[str, str] = persisted(factory=dict, load=_set("approvals", dict))
    status: str | None = persisted(None)
    reason: str | None = persisted(None)
    detail: str = persisted("")
    answer: str | None = persisted(None)
    model_error: str = persisted("")
    #: The edge of the last transition (a resume reads whether an attempt had started).
    taken: Transition = persisted(TRANSITIONS[0], dump=lambda s: s.taken.key, load=_load_taken)
    events: list[dict[str, Any]] = apart("stored: trace rows", factory=list)
    #: The trusted caller's facts for the rules (``run(..., context={...})``).
    context: dict[str, Any] = persisted(factory=dict, optional=True)
    #: The run's executed calls as rules read them (``calls``): one entry per call that
    #: ran, oldest first, never changed once added (only kept when the run has rules).
    executed: list[dict[str, Any]] = persisted(factory=list, optional=True)
    #: The rules that decided the judgement the next edge acts on (guards ``rule:<id>``).
    ruled: frozenset[str] = apart("scratch: the rules of the last judgement", frozenset())
    #: What those rules said (the stop detail of a rule's edge).
    rule_detail: str = apart("scratch: the words of the last judgement", "")
    #: The current call's result as its observation records it (``actions.Recorded``),
    #: made for its ``after_tool`` judgement: the answer takes it rather than remake it.
    ahead: Any = apart("scratch: the result an after_tool judgement read", None)
    #: The record of the last answer made (``actions.Recorded``): what ``calls`` keeps.
    recorded: Any = apart("scratch: the last answer's record", None)
    #: A reviewer's decision being recorded (the ``review`` trigger).
    review_request: dict[str, Any] | None = apart("scratch: the review being fired", None)
    #: Who asked for the ``cancel`` being fired, when and why (``loop.Cancelled``).
    cancel_request: dict[str, Any] = apart("scratch: the cancel being fired", factory=dict)
    #: The store's answer to this dispatch's ``ConsumeApproval`` (granted | refused), until
    #: the ``dispatch`` transition records it.
    approval_use: str | None = apart("scratch: this dispatch's approval use", None)
    # Transition scratch: set by one firing or one step, meaningless after a restart.
    guard_log: dict[str, bool] = apart("scratch: the guards of the last firing", factory=dict)
    #: From the call until ``tool_returned`` is taken (a cancel then may not say the
    #: write did not happen); a process that died there resumes through its intent.
    in_flight: bool = apart("scratch: a tool call is running now", False)
    #: This driving's resume counted the attempt of a keyed call whose intent the dead
    #: process had begun (its ``dispatch`` transition died with it).
    attempt_resumed: bool = apart("scratch: this driving's resume", False)
    #: The W3C trace context (``traceparent``/``tracestate``) of the run's first driving
    #: or its submitter, for tracing (``fsm_agent.otel``): kept on the checkpoint's
    #: envelope, outside the body and its checksum (it changes nothing the run decides).
    trace_context: dict[str, str] = apart("stored: on the checkpoint envelope", factory=dict)
    # The loop's cursors over what left it: events emitted / saved, messages saved, and
    # history rows replaced in place since the last save (a restore starts them at what
    # the store holds).
    emitted: int = apart("cursor", 0)
    saved_events: int = apart("cursor", 0)
    saved_messages: int = apart("cursor", 0)
    rewritten: list[int] = apart("cursor", factory=list)
    #: The ids of the calls the history held when this driving began and of every call
    #: parsed since (``None``: not kept), and whether a parsed call's id was among them:
    #: only then can a reply have repeated a call (``runtime/call_ids.py`` warns of it).
    call_ids: set[Any] | None = apart("scratch: this driving's call ids", None)
    call_id_repeated: bool = apart("scratch: this driving's call ids", False)
    #: What the world answered since the last transition (intent claims, loaded records,
    #: approval uses, keys): recorded on the next transition event (``inputs``), so
    #: ``check`` replays them.
    inputs: list[dict[str, Any]] = apart("scratch: inputs for the next transition", factory=list)

    @property
    def terminal(self) -> bool:
        return self.status is not None

    def select_call(self, index: int) -> None:
        self.index = index
        self.call = self.decision.calls[index]
        self.attempt = 0

    def clear_call(self) -> None:
        self.call = NO_CALL

    # ── serialisation ─────────────────────────────────────────────────────────────

    def snapshot(self) -> dict[str, Any]:
        """The checkpoint: the persisted fields, versioned, naming the machine they were
        written under, and covered by a checksum (:meth:`restore` verifies it)."""
        body = {key: dump(self) for key, dump, _ in _PERSISTED}
        for key in _OPTIONAL:
            if not body[key]:
                del body[key]
        text = _compact(body)
        head = {
            "version": SNAPSHOT_VERSION,
            "machine_hash": self.config.machine.hash,
            "checksum": f"crc32:{zlib.crc32(text.encode('utf-8')):08x}",
        }
        # The whole checkpoint's compact JSON, from the body's text the checksum was
        # computed over: a store that keeps text writes it without encoding it again.
        whole = _compact(head)[:-1] + ',"body":' + text
        out = _Snapshot(head, body=body)
        if self.trace_context:
            out["trace_context"] = dict(self.trace_context)
            whole += ',"trace_context":' + _compact(out["trace_context"])
        out.text = whole + "}"
        return out

    @classmethod
    def restore(
        cls,
        snapshot: dict[str, Any],
        *,
        run_id: str,
        config: RunConfig,
        messages: list[dict[str, Any]],
        events: list[dict[str, Any]],
    ) -> RunState:
        """The state a :meth:`snapshot` recorded, under ``config`` (whose machine must be
        the one the snapshot names). Calls are parsed again but not admitted (the loop
        admits what it still has to run, with the current registry); the current call
        keeps the facts it was checkpointed with. Raises :class:`CorruptRecord` for a
        snapshot that fails its checksum or cannot be read, :class:`MachineMismatch` for
        one recorded under another transition table."""
        recorded, body = _verified(snapshot, run_id)
        if recorded != config.machine.hash:
            raise MachineMismatch(
                f"run {run_id!r} was checkpointed by machine {recorded}; this runtime runs "
                f"machine {config.machine.hash}. Resume it with a runtime that knows the "
                "machine that started it (Runtime(machines=[...]))."
            )
        try:
            s = cls(run_id=run_id, config=config, messages=messages, events=events)
            for key, _, load in _PERSISTED:
                if key in body or key not in _OPTIONAL:
                    load(s, body[key])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CorruptRecord(
                f"run {run_id!r}: unreadable checkpoint ({type(exc).__name__}: {exc})"
            ) from None
        carried = snapshot.get("trace_context")
        if isinstance(carried, dict):
            s.trace_context = {k: v for k, v in carried.items() if isinstance(v, str)}
        s.emitted = s.saved_events = len(events)
        s.saved_messages = len(messages)
        return s


def _codec(f: Field[Any]) -> tuple[str, Dump, Load]:
    name, meta = f.name, f.metadata
    dump: Dump = meta["dump"] or (lambda s: getattr(s, name))
    load: Load = meta["load"] or (lambda s, value: setattr(s, name, value))
    return meta["key"] or name, dump, load


def declarations(cls: type[RunState]) -> tuple[tuple[str, Dump, Load], ...]:
    """``(key, dump, load)`` of every persisted field of ``cls``, in declaration order;
    ``TypeError`` naming each field that declares neither :func:`persisted` nor
    :func:`apart` (one nobody decided about would silently not survive a restart)."""
    undeclared = [f.name for f in fields(cls) if "persist" not in f.metadata]
    if undeclared:
        raise TypeError(
            f"{cls.__name__} fields {undeclared} declare neither persisted(...) nor apart(...)"
        )
    return tuple(_codec(f) for f in fields(cls) if f.metadata["persist"])


_PERSISTED = declarations(RunState)
#: The keys of the persisted fields a checkpoint may leave out (``persisted(optional=)``).
_OPTIONAL = frozenset(
    f.metadata["key"] or f.name
    for f in fields(RunState)
    if f.metadata["persist"] and f.metadata.get("optional")
)


class _Snapshot(dict[str, Any]):
    """A checkpoint (:meth:`RunState.snapshot`) and its compact JSON text, ``text``:
    the very JSON of the dict as it was built (a store that keeps text writes it)."""

    __slots__ = ("text",)
    text: str


def _checksum(body: dict[str, Any]) -> str:
    """CRC-32 of the body's compact JSON (key order as written: a JSON round trip keeps
    it). A checksum against damage, cheap enough for every checkpoint; protection
    against deliberate edits is the trace's hash chain and signature, not this."""
    text = _compact(body)
    return f"crc32:{zlib.crc32(text.encode('utf-8')):08x}"


def _plain_compact(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


#: The body's compact JSON, by an encoder built once (a checkpoint per round, durable).
_compact: Callable[[Any], str] = c_dumps(",", ":", allow_nan=True) or _plain_compact


def snapshot_machine(snapshot: Any) -> str | None:
    """The hash of the machine a snapshot was written under (``None`` if it names none):
    what a runtime picks the run's machine by, before reading the body."""
    if not isinstance(snapshot, dict):
        return None
    if snapshot.get("version") == 2:
        body = snapshot.get("body")
        found = body.get("machine_hash") if isinstance(body, dict) else None
    else:
        found = snapshot.get("machine_hash")
    return found if isinstance(found, str) else None


def _verified(snapshot: Any, run_id: str) -> tuple[str | None, dict[str, Any]]:
    """The machine hash and the body of a snapshot whose checksum holds; a layout 2
    body is read as layout 3 (its ``machine_hash`` moved out of it)."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("body"), dict):
        raise CorruptRecord(f"run {run_id!r}: the checkpoint is not a state snapshot")
    version = snapshot.get("version")
    if version not in (2, SNAPSHOT_VERSION):
        raise CorruptRecord(
            f"run {run_id!r}: checkpoint layout {version!r} is not {SNAPSHOT_VERSION} or 2 "
            "(written by another version of fsm-agent)"
        )
    body: dict[str, Any] = snapshot["body"]
    try:
        ok = snapshot.get("checksum") == _checksum(body)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise CorruptRecord(
            f"run {run_id!r}: the checkpoint fails its checksum (the stored row was changed "
            "or damaged); refusing to resume from it"
        )
    if version == 2:
        body = {k: v for k, v in body.items() if k != "machine_hash"}
    return snapshot_machine(snapshot), body


def allowed_tools(header: dict[str, Any], narrowed_by: Collection[str]) -> frozenset[str]:
    """The allow-list a resumed run keeps: the one it started with, narrowed (never
    widened) by the resuming caller's."""
    return frozenset(header.get("allowed_tools") or ()) & frozenset(narrowed_by)
