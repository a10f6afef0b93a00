"""``fsm-agent serve``: the review server (JSON API, live events, web UI) over a store.

    fsm-agent keys add alice --scope review --db runs.db
    fsm-agent serve --db runs.db [--app myapp:make_runtime] [--host 127.0.0.1] [--port 8321]

Every request needs a key. Listening beyond loopback with no active key is refused: such
a server would answer everyone with 401 and invite a weaker fix. With ``--app`` the
server submits runs (``POST /api/runs``) and continues decided ones itself.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from typing import Any

from fsm_agent._cli.runs import _guarded, _open, _seconds

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the review API and web UI over a runs database",
        description="An authenticated JSON API, live event streams and a web UI for "
        "stored runs and their reviews (fsm-agent keys add makes the keys).",
    )
    p.add_argument(
        "--db", required=True, help="the SQLite file (e.g. runs.db) or a postgresql:// DSN"
    )
    p.add_argument(
        "--app",
        metavar="MODULE:FACTORY",
        help="a function make_runtime(store) returning your Runtime: the server then "
        "submits runs and continues decided ones",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8321, help="port (default 8321)")
    p.add_argument("--timeout", type=_seconds, default=5.0, help="lock/connect timeout (s)")
    p.add_argument("--schema", default="fsm_agent", help="PostgreSQL only: the schema")
    p.set_defaults(handler=_serve)


def _store(args: argparse.Namespace) -> Any:
    """The store, writable (reviews are recorded); on PostgreSQL with a pool for the
    requests served at once (``runs``' one connection would serialise them)."""
    from fsm_agent._durable.postgres import PostgresStore, is_postgres_dsn

    if is_postgres_dsn(args.db):
        return PostgresStore(
            args.db, schema=args.schema, timeout=args.timeout, pool_size=16, create=False
        )
    return _open(args, write=True)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@_guarded
def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from fsm_agent.server._app import create_app
    except ImportError as exc:
        print(
            f"fsm-agent serve: needs the server extra ({exc.name} is missing): "
            "pip install 'fsm-agent[server]'",
            file=sys.stderr,
        )
        return 2
    from fsm_agent._cli.worker import _load_app, _load_factory

    factory = _load_factory(args.app) if args.app else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with _store(args) as store:
        active = [k for k in store.list_keys() if k.revoked is None]
        if not active and not _loopback(args.host):
            print(
                f"fsm-agent serve: refusing to listen on {args.host} with no API keys "
                "(every request would be refused); add one: fsm-agent keys add NAME "
                f"--scope review --db {args.db}",
                file=sys.stderr,
            )
            return 2
        if not active:
            print(
                "fsm-agent serve: no API keys yet: every request gets 401 until you run "
                f"fsm-agent keys add NAME --scope review --db {args.db}",
                file=sys.stderr,
            )
        runtime = _load_app(args.app, factory, store) if factory is not None else None
        app = create_app(
            store,
            runtime=runtime,
            secure_cookies=not _loopback(args.host),
            trace_key=getattr(runtime, "_trace_key", None),
        )
        print(f"fsm-agent serve: http://{args.host}:{args.port}/ over {args.db}", file=sys.stderr)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
    return 0
