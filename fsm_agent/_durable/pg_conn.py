"""Connections of :class:`~fsm_agent._durable.postgres.PostgresStore` (private): the
connection string with fsm-agent's session settings, the pool's check of a connection it
hands out, and one-line ``StoreError``s for every driver failure."""

from __future__ import annotations

import select
from typing import Any

from fsm_agent._errors import StoreError

__all__ = ["alive", "conninfo", "is_postgres_dsn", "store_error"]


def is_postgres_dsn(text: str) -> bool:
    """Whether ``text`` names a PostgreSQL server (a URI) rather than a SQLite file."""
    return text.startswith(("postgresql://", "postgres://"))


def alive(conn: Any) -> None:
    """The pool's check of a connection it hands out, without a round trip: an idle
    connection the server has something to say on is one it closed (a restart, an
    administrator, an idle timeout) — discarded, so the operation gets a fresh one instead
    of failing. A connection cut *during* an operation still fails that operation: it may
    have committed."""
    import psycopg

    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        conn.close()  # (else the pool would take it back as healthy and hand it out again)
        raise psycopg.OperationalError("the server closed this idle connection")


def conninfo(
    dsn: str, statement_timeout_s: float, readonly: bool, timeout: float
) -> tuple[str, str]:
    """The connection string with fsm-agent's session settings, and a name for messages
    (user, host, port and database; never the password)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    if not isinstance(dsn, str) or not dsn.strip():
        raise StoreError("an empty PostgreSQL DSN")
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        first = " ".join(str(exc).split())
        raise StoreError(f"not a valid PostgreSQL DSN ({first})") from None
    host = str(params.get("host") or "localhost")
    port = params.get("port")
    name = (
        f"postgresql://{params.get('user') or ''}{'@' if params.get('user') else ''}"
        f"{host}{':' + str(port) if port else ''}/{params.get('dbname') or ''}"
    )
    options = [str(params.get("options") or "")]
    options.append(f"-c statement_timeout={int(statement_timeout_s * 1000)}")
    # Every statement of the store is a lookup by key: a generic plan is always right, and
    # planning each execution (the custom plans PostgreSQL tries first) would cost more
    # than running it.
    options.append("-c plan_cache_mode=force_generic_plan")
    if readonly:
        options.append("-c default_transaction_read_only=on")
    params["options"] = " ".join(o for o in options if o)
    params.setdefault("connect_timeout", max(int(timeout), 1))
    params.setdefault("application_name", "fsm-agent")
    return make_conninfo("", **params), name


def store_error(
    name: str, exc: BaseException, timeout: float, statement_timeout_s: float
) -> StoreError:
    """One line naming the server (never the password) and the cause."""
    import psycopg
    from psycopg import errors
    from psycopg_pool import PoolTimeout

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, PoolTimeout):
        return StoreError(
            f"{name}: no connection within {timeout:g}s (the server is down, "
            "restarting or unreachable, or every connection is busy)"
        )
    if isinstance(exc, errors.QueryCanceled):
        return StoreError(
            f"{name}: a statement ran past the statement timeout "
            f"({statement_timeout_s:g}s) and was cancelled; nothing of it was stored"
        )
    if isinstance(exc, (errors.AdminShutdown, errors.CrashShutdown)):
        return StoreError(
            f"{name}: the server closed the connection ({text}); the interrupted "
            "statement was rolled back"
        )
    if isinstance(exc, errors.CannotConnectNow):
        return StoreError(f"{name}: the server is starting or shutting down ({text})")
    if isinstance(exc, errors.ReadOnlySqlTransaction):
        return StoreError(f"{name}: opened read-only; this command does not write")
    if isinstance(exc, psycopg.OperationalError):
        return StoreError(f"{name}: connection failed or lost: {text}")
    return StoreError(f"{name}: {text}")
