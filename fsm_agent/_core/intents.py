"""Idempotency records: a write's intent and its result under its idempotency key (R7).

What a store keeps per key, and what beginning an intent answers. Stores implement the
semantics (``durable/store.py``); the loop asks for them with requests
(``core/requests.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fsm_agent._core.jsonsafe import make_safe

__all__ = [
    "IdempotencyRecord",
    "IntentClaim",
    "claim_from_json",
    "claim_json",
    "may_claim",
    "record_from_json",
    "record_json",
]


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A write's intent (``pending``) or result (``committed``) under its idempotency key.

    ``run_id``/``call_id`` own it. ``effect`` and ``dedup`` are the registrar's facts at
    the time the intent was written, so a resume decides from the record, never from
    whatever the registry holds then (R11).
    """

    tool: str
    key: str
    args_digest: str
    status: Literal["pending", "committed"]
    run_id: str
    call_id: str
    result: Any = None
    effect: str = "write"
    dedup: bool = False

    @property
    def owner(self) -> tuple[str, str]:
        return (self.run_id, self.call_id)


@dataclass(frozen=True, slots=True)
class IntentClaim:
    """The answer to :class:`BeginIntent`. ``owned``: the store now holds a pending
    intent owned by this (run, call) — new, already ours, or taken over for a
    deduplicating tool. ``found``: the record that was there before (``None`` if none)."""

    owned: bool
    found: IdempotencyRecord | None


def may_claim(found: IdempotencyRecord | None, record: IdempotencyRecord, take_over: bool) -> bool:
    """The compare of ``begin_intent``'s compare-and-set: may ``record`` become the
    pending intent where ``found`` is? Yes if nothing is there, or a pending intent of
    the same (run, call), or — ``take_over``, for a deduplicating tool — a pending intent
    of another owner with the same arguments. A committed record is never replaced.
    (``PostgresStore`` states the same rule in SQL: ``begin_intent`` in
    ``durable/pg_schema.py``.)"""
    return found is None or (
        found.status == "pending"
        and (found.owner == record.owner or (take_over and found.args_digest == record.args_digest))
    )


# A store's answers as the trace records them (``inputs`` of a transition event), so that
# ``fsm-agent check`` can give the replayed loop the very answers the live one got.

_RECORD_FIELDS = ("tool", "key", "args_digest", "status", "run_id", "call_id", "result", "effect",
                  "dedup")  # fmt: skip


def record_json(record: IdempotencyRecord | None) -> dict[str, Any] | None:
    """``record`` as JSON data (its result made JSON-safe), ``None`` for no record."""
    if record is None:
        return None
    return {name: make_safe(getattr(record, name)) for name in _RECORD_FIELDS}


def claim_json(claim: IntentClaim) -> dict[str, Any]:
    return {"owned": claim.owned, "found": record_json(claim.found)}


def record_from_json(data: Any) -> IdempotencyRecord | None:
    """The record :func:`record_json` wrote; ``ValueError`` naming what does not fit."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != set(_RECORD_FIELDS):
        raise ValueError(f"an idempotency record has the fields {', '.join(_RECORD_FIELDS)}")
    strings = ("tool", "key", "args_digest", "run_id", "call_id", "effect")
    if not all(isinstance(data[k], str) for k in strings) or not isinstance(data["dedup"], bool):
        raise ValueError("an idempotency record's names are strings and its dedup a boolean")
    if data["status"] not in ("pending", "committed"):
        raise ValueError(f"record status {data['status']!r} is neither pending nor committed")
    return IdempotencyRecord(**data)


def claim_from_json(data: Any) -> IntentClaim:
    if not isinstance(data, dict) or set(data) != {"owned", "found"}:
        raise ValueError("an intent claim is {owned, found}")
    if not isinstance(data["owned"], bool):
        raise ValueError("an intent claim's owned is a boolean")
    return IntentClaim(data["owned"], record_from_json(data["found"]))
