"""Who is asking: a bearer key (the API) or a signed-in session (the UI).

Every API request needs ``Authorization: Bearer KEY``: 401 without one, with a malformed,
unknown or revoked one; 403 when the key's scope does not allow the request. The key is
looked up by its id and its secret compared in constant time (``durable/feed.py``); the
record is re-read for every request (requests arriving while a read of the same key is in
flight share it), so a revocation takes effect at once on every server.

The UI signs in with a key into a server-side session: the cookie holds only a random
session id (HttpOnly, SameSite=Strict, Secure unless on loopback), and each session has
its own CSRF token that every form must echo (``csrf`` field or ``X-CSRF-Token``).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request

from fsm_agent._durable.feed import KeyRecord, Scope, parse_key, verify_key
from fsm_agent.server._errors import ApiError

__all__ = ["COOKIE", "Principal", "Sessions", "authenticate"]

COOKIE = "fsm_session"
SESSION_S = 8 * 3600.0


@dataclass(frozen=True)
class Principal:
    """The holder of a valid key: its name is the reviewer the audit trail records."""

    key: KeyRecord
    session: str | None = None
    csrf: str | None = None

    @property
    def name(self) -> str:
        return self.key.name

    def require(self, scope: Scope) -> None:
        if not self.key.allows(scope):
            raise ApiError(
                403,
                "forbidden",
                f"the key of {self.key.name} has scope {self.key.scope!r}; this needs {scope!r}",
            )


class Sessions:
    """Signed-in UI sessions, in this server's memory (a restart signs everyone out)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, tuple[str, str, float]] = {}

    def open(self, key_id: str) -> tuple[str, str]:
        session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            now = time.time()
            self._by_id = {k: v for k, v in self._by_id.items() if v[2] > now}
            self._by_id[session] = (key_id, csrf, now + SESSION_S)
        return session, csrf

    def get(self, session: str) -> tuple[str, str] | None:
        with self._lock:
            found = self._by_id.get(session)
        if found is None or found[2] < time.time():
            return None
        return found[0], found[1]

    def close(self, session: str) -> None:
        with self._lock:
            self._by_id.pop(session, None)


#: Reads a stored key by id: ``Server.key_of``, through the server's bounded store calls
#: (a store failure is a JSON 503), one read for the requests that ask at once.
KeyReader = Callable[[str], Awaitable["KeyRecord | None"]]


async def check_key(read: KeyReader, text: str) -> KeyRecord:
    """The active key ``text`` is, else a 401 naming what is wrong."""
    parsed = parse_key(text)
    if parsed is None:
        raise ApiError(401, "unauthorized", "malformed key (expected fsmk_<id>_<secret>)")
    record = await read(parsed[0])
    if not verify_key(record, parsed[1]) or record is None:
        raise ApiError(401, "unauthorized", "unknown key")
    if record.revoked is not None:
        raise ApiError(401, "unauthorized", f"the key of {record.name} was revoked")
    return record


async def authenticate(request: Request, read: KeyReader, sessions: Sessions) -> Principal:
    """The bearer key's holder, else the session's (unsafe methods then need the CSRF
    token), else 401."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthorized", "use Authorization: Bearer KEY")
        return Principal(await check_key(read, token))
    session = request.cookies.get(COOKIE)
    found = sessions.get(session) if session else None
    if found is None or session is None:
        raise ApiError(401, "unauthorized", "no key: send Authorization: Bearer KEY or sign in")
    key_id, csrf = found
    record = await read(key_id)
    if record is None or record.revoked is not None:
        sessions.close(session)
        raise ApiError(401, "unauthorized", "the session's key was revoked; sign in again")
    return Principal(record, session, csrf)


def check_csrf(principal: Principal, sent: str | None) -> None:
    """A session's unsafe request must carry its CSRF token (a bearer key needs none:
    a browser never sends one cross-site on its own)."""
    if principal.session is None:
        return
    if not sent or principal.csrf is None or not hmac.compare_digest(sent, principal.csrf):
        raise ApiError(403, "csrf", "missing or wrong CSRF token; reload the page")
