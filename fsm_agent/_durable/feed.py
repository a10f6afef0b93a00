"""The change feed and the API keys a store keeps for the review server.

A run's events are append-only and numbered (``seq``), so "what happened since" is a
range read: :meth:`events_since` answers the events after a sequence number, in order.
A *watch* (``store.watch()``) tells a reader when to read again: it wakes on any commit
(new events, a status change, a review) — ``LISTEN/NOTIFY`` on PostgreSQL, a condition
variable in memory, and on SQLite a poll of ``PRAGMA data_version`` on a connection of
its own (it changes on every commit by any other connection, process or thread). A
wake-up is a hint, never data: the reader re-reads from its last ``seq``, so a missed or
spurious wake-up can delay an event but never lose or repeat one.

API keys: only a salted SHA-256 of the secret is stored (``KeyRecord``); a key is
``fsmk_<key_id>_<secret>``, its id finds the row and the secret is compared in constant
time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from fsm_agent._errors import ConfigError

__all__ = [
    "SCOPES",
    "ConditionWatch",
    "FeedStore",
    "KeyRecord",
    "Scope",
    "Watch",
    "make_key",
    "parse_key",
    "supports_feed",
    "verify_key",
]

Scope = Literal["read", "review", "admin"]
#: Each scope allows what the ones before it allow.
SCOPES: tuple[Scope, ...] = ("read", "review", "admin")

_KEY = re.compile(r"fsmk_([0-9a-f]{16})_([A-Za-z0-9_-]{20,})")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


@dataclass(frozen=True)
class KeyRecord:
    """A stored API key: never the secret, only its salted hash."""

    key_id: str
    name: str
    scope: Scope
    salt: str
    digest: str
    created: float
    revoked: float | None = None

    def allows(self, needed: Scope) -> bool:
        return self.revoked is None and SCOPES.index(self.scope) >= SCOPES.index(needed)


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()


def make_key(name: str, scope: str) -> tuple[str, KeyRecord]:
    """A new key for ``name``: ``(the key to show once, the record to store)``."""
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"key name {name!r}: use 1-64 letters, digits and . _ @ - (it names the "
            "reviewer in the audit trail)"
        )
    if scope not in SCOPES:
        raise ConfigError(f"key scope {scope!r}: use one of {', '.join(SCOPES)}")
    key_id, secret, salt = secrets.token_hex(8), secrets.token_urlsafe(32), secrets.token_hex(16)
    record = KeyRecord(key_id, name, scope, salt, _digest(salt, secret), time.time())
    return f"fsmk_{key_id}_{secret}", record


def parse_key(key: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else ``None``."""
    match = _KEY.fullmatch(key.strip())
    return (match.group(1), match.group(2)) if match else None


def verify_key(record: KeyRecord | None, secret: str) -> bool:
    """Whether ``secret`` is ``record``'s (constant time in the secret)."""
    if record is None:
        # Same work as a real check, so timing does not tell which key ids exist.
        hmac.compare_digest(_digest("x" * 32, secret), "0" * 64)
        return False
    return hmac.compare_digest(_digest(record.salt, secret), record.digest)


class Watch(Protocol):
    """Wakes a reader when the store may hold something new. A watch that can tell
    which runs changed (PostgreSQL's notifications name them) also has ``changed``:
    the run ids of its last wake-up, or ``None`` for "any run may have"."""

    def wait(self, timeout: float) -> bool:
        """Block until a commit may have happened since the last call (``True``) or
        ``timeout`` seconds passed (``False``)."""
        ...

    def close(self) -> None: ...


class ConditionWatch:
    """A watch on a version counter that a store bumps under its condition."""

    def __init__(self, condition: threading.Condition, version: Any) -> None:
        self._condition, self._version = condition, version
        self._seen = version()

    def wait(self, timeout: float) -> bool:
        with self._condition:
            changed = self._condition.wait_for(lambda: self._version() != self._seen, timeout)
            self._seen = self._version()
        return bool(changed)

    def close(self) -> None:
        pass


@runtime_checkable
class FeedStore(Protocol):
    """A run store with a change feed and API keys (all three stores)."""

    def events_since(self, run_id: str, seq: int, limit: int = 1000) -> list[dict[str, Any]]:
        """The run's events with ``seq`` greater than ``seq``, in order, at most
        ``limit``; :class:`~fsm_agent._errors.RunNotFound` if there is no such run."""
        ...

    def watch(self) -> Watch: ...

    def add_key(self, record: KeyRecord) -> None:
        """Store a key; ``ConfigError`` if an active key already has this name."""

    def get_key(self, key_id: str) -> KeyRecord | None: ...

    def list_keys(self) -> list[KeyRecord]: ...

    def revoke_key(self, name: str) -> int:
        """Revoke the active keys named ``name``; how many were revoked."""
        ...


def supports_feed(store: object) -> bool:
    return isinstance(store, FeedStore)
