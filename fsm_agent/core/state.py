"""One run's state: everything the loop, the guards and the actions read and write.

:class:`RunState` is the model ``transitions`` fires (its ``state`` attribute is the
machine state). It is plain data plus a reference to the run's :class:`RunConfig` (what
the trusted caller configured: budget, retry, policy, allow-list, tools, approvals), and
it serialises itself: :meth:`RunState.snapshot` gives a small versioned, checksummed
dict (the checkpoint) and :meth:`RunState.restore` reads one back, so durable code never
knows its fields. The history (``messages``) and the trace (``events``) are kept apart
from the snapshot: stores append them row by row.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from fsm_agent.core.approvals import ApprovalBook
from fsm_agent.core.budget import Budget, RetryPolicy
from fsm_agent.core.decision import NO_DECISION, Decision, PreparedCall, ToolLike, parse_decision
from fsm_agent.core.requests import ToolOutcome
from fsm_agent.core.table import INITIAL_STATE, MACHINE_HASH, TRANSITIONS, Transition, edge_by_key
from fsm_agent.errors import CorruptRecord, MachineMismatch

__all__ = ["SNAPSHOT_VERSION", "Counters", "RunConfig", "RunState", "SaveMode"]

#: Version of :meth:`RunState.snapshot`'s layout (bump with a reader for the old one).
SNAPSHOT_VERSION = 2

#: When the loop saves a checkpoint: never (no store keeps runs), around writes and at
#: ends (a store that dies with the process), or also after every model reply (SQLite,
#: PostgreSQL).
SaveMode = Literal["never", "writes", "replies"]

_NO_CALL = PreparedCall(-1, "", "", "")


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
        out = {name: getattr(self, name) for name in self.__slots__}
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
    #: Events go to a trace sink as they happen (``EmitEvents`` requests).
    emit: bool = False
    #: Extra fields of the ``run_start`` header (the tools' declared facts, ...).
    header: dict[str, Any] = field(default_factory=dict)
    #: Rewrites each event before it is recorded (``Runtime(redact=...)``).
    redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def header_fields(self) -> dict[str, Any]:
        """The caller's settings as the trace header and the store record them."""
        return {
            "machine_hash": MACHINE_HASH,
            "policy": self.policy,
            "budget": self.budget.to_dict(),
            "retry": self.retry.to_dict(),
            "allowed_tools": sorted(self.allowed),
            "approvals": self.approvals.header(),
            **self.header,
        }


@dataclass(eq=False)
class RunState:
    """The state of one run (see the module docstring). Mutated only by the loop."""

    run_id: str
    config: RunConfig
    messages: list[dict[str, Any]]
    state: str = INITIAL_STATE  # the attribute ``transitions`` reads and writes
    seq: int = 0
    counters: Counters = field(default_factory=Counters)
    started: float = 0.0
    now: float = 0.0
    decision: Decision = NO_DECISION
    batch_appended: bool = False
    index: int = 0
    call: PreparedCall = _NO_CALL
    attempt: int = 0
    outcome: ToolOutcome = field(default_factory=lambda: ToolOutcome("ok"))
    in_flight: bool = False
    #: This driving's resume counted the attempt of a keyed call whose intent the dead
    #: process had begun (its ``dispatch`` transition died with it). Not saved.
    attempt_resumed: bool = False
    #: A reply reported no usable token count / cost (it then counts as over a set limit).
    tokens_unknown: bool = False
    cost_unknown: bool = False
    guard_log: dict[str, bool] = field(default_factory=dict)
    taken: Transition = TRANSITIONS[0]
    answered: set[str] = field(default_factory=set)
    #: call id -> (index in ``messages``, error) of a synthetic answer a reviewer may replace.
    placeholders: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: call id -> a reviewer's decision on a paused call of the current batch.
    reviews: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: call id -> the approval a call of the current batch consumes.
    approvals: dict[str, str] = field(default_factory=dict)
    status: str | None = None
    reason: str | None = None
    detail: str = ""
    answer: str | None = None
    model_error: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    # Bookkeeping of what left the loop: events emitted / saved, messages saved, and
    # history rows replaced in place since the last save.
    emitted: int = 0
    saved_events: int = 0
    saved_messages: int = 0
    rewritten: list[int] = field(default_factory=list)
    #: What the world answered since the last transition (intent claims, loaded records,
    #: approval uses): recorded on the next transition event (``inputs``), so ``check``
    #: replays them. A loop cursor, not saved.
    inputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status is not None

    def select_call(self, index: int) -> None:
        self.index = index
        self.call = self.decision.calls[index]
        self.attempt = 0

    def clear_call(self) -> None:
        self.call = _NO_CALL

    # ── serialisation ─────────────────────────────────────────────────────────────

    def snapshot(self) -> dict[str, Any]:
        """The checkpoint: this state without its history and events, versioned and
        covered by a checksum (:meth:`restore` verifies it)."""
        call = self.call
        body: dict[str, Any] = {
            "state": self.state,
            "seq": self.seq,
            "status": self.status,
            "reason": self.reason,
            "detail": self.detail,
            "answer": self.answer,
            "model_error": self.model_error,
            "counters": self.counters.as_dict(),
            "elapsed": self.now - self.started,
            "decision": None if self.decision is NO_DECISION else self.decision.message,
            "batch_appended": self.batch_appended,
            "index": self.index,
            "call": None
            if call.index < 0
            else {
                "index": call.index,
                "effect": call.effect,
                "dedup": call.dedup,
                "key": call.idempotency_key,
                "digest": call.args_digest,
                "claimed": call.claimed,
            },
            "attempt": self.attempt,
            "outcome": [self.outcome.kind, self.outcome.error],
            "tokens_unknown": self.tokens_unknown,
            "cost_unknown": self.cost_unknown,
            "answered": sorted(self.answered),
            "placeholders": {k: list(v) for k, v in self.placeholders.items()},
            "reviews": self.reviews,
            "approvals": self.approvals,
            "taken": self.taken.key,
            "machine_hash": MACHINE_HASH,
        }
        return {"version": SNAPSHOT_VERSION, "checksum": _checksum(body), "body": body}

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
        """The state a :meth:`snapshot` recorded. Calls are parsed again but not admitted
        (the loop admits what it still has to run, with the current registry); the current
        call keeps the facts it was checkpointed with. Raises :class:`CorruptRecord` for a
        snapshot that fails its checksum or cannot be read, :class:`MachineMismatch` for
        one recorded under another transition table."""
        body = _verified(snapshot, run_id)
        if body.get("machine_hash") != MACHINE_HASH:
            raise MachineMismatch(
                f"run {run_id!r} was checkpointed by machine {body.get('machine_hash')}; this "
                f"fsm-agent runs machine {MACHINE_HASH}. Finish or export it with the version "
                "that started it (no migration is registered between these tables)."
            )
        try:
            return cls._from_body(body, run_id, config, messages, events)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CorruptRecord(
                f"run {run_id!r}: unreadable checkpoint ({type(exc).__name__}: {exc})"
            ) from None

    @classmethod
    def _from_body(
        cls,
        body: dict[str, Any],
        run_id: str,
        config: RunConfig,
        messages: list[dict[str, Any]],
        events: list[dict[str, Any]],
    ) -> RunState:
        taken = edge_by_key(body["taken"])
        if taken is None:  # guessing here could mean running a write twice: refuse
            raise ValueError(f"its last transition {body['taken']!r} is no edge of this table")
        s = cls(run_id=run_id, config=config, messages=messages, events=events)
        s.state, s.seq, s.taken = body["state"], body["seq"], taken
        s.status, s.reason, s.detail = body["status"], body["reason"], body["detail"]
        s.answer, s.model_error = body["answer"], body["model_error"]
        s.counters = Counters.from_dict(body["counters"])
        # The loop re-bases ``started`` on its clock: wall-clock budgets count the time
        # the run was alive, not the time it lay stored.
        s.started, s.now = -float(body["elapsed"]), 0.0
        if body["decision"] is not None:
            s.decision = parse_decision(body["decision"])
        s.batch_appended, s.index, s.attempt = (
            body["batch_appended"],
            body["index"],
            body["attempt"],
        )
        stored_call = body["call"]
        if stored_call is not None:
            call = s.decision.calls[stored_call["index"]]
            call.effect, call.dedup = stored_call["effect"], stored_call["dedup"]
            call.idempotency_key, call.args_digest = stored_call["key"], stored_call["digest"]
            call.claimed = stored_call["claimed"]
            s.call = call
        kind, error = body["outcome"]
        s.outcome = ToolOutcome(kind, error=error)
        s.tokens_unknown, s.cost_unknown = body["tokens_unknown"], body["cost_unknown"]
        s.answered = set(body["answered"])
        s.placeholders = {k: (int(v[0]), str(v[1])) for k, v in body["placeholders"].items()}
        s.reviews = dict(body["reviews"])
        s.approvals = dict(body["approvals"])
        s.emitted = s.saved_events = len(events)
        s.saved_messages = len(messages)
        return s


def _checksum(body: dict[str, Any]) -> str:
    """CRC-32 of the body's compact JSON (key order as written: a JSON round trip keeps
    it). A checksum against damage, cheap enough for every checkpoint; protection
    against deliberate edits is the trace's hash chain and signature, not this."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return f"crc32:{zlib.crc32(text.encode('utf-8')):08x}"


def _verified(snapshot: Any, run_id: str) -> dict[str, Any]:
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("body"), dict):
        raise CorruptRecord(f"run {run_id!r}: the checkpoint is not a state snapshot")
    version = snapshot.get("version")
    if version != SNAPSHOT_VERSION:
        raise CorruptRecord(
            f"run {run_id!r}: checkpoint layout {version!r} is not {SNAPSHOT_VERSION} "
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
    return body


def allowed_tools(header: dict[str, Any], narrowed_by: Collection[str]) -> frozenset[str]:
    """The allow-list a resumed run keeps: the one it started with, narrowed (never
    widened) by the resuming caller's."""
    return frozenset(header.get("allowed_tools") or ()) & frozenset(narrowed_by)
