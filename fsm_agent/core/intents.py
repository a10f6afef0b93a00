"""Idempotency records: a write's intent and its result under its idempotency key (R7).

What a store keeps per key, and what beginning an intent answers. Stores implement the
semantics (``durable/store.py``); the loop asks for them with requests
(``core/requests.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["IdempotencyRecord", "IntentClaim", "may_claim"]


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
