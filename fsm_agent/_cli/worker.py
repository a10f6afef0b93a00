"""``fsm-agent worker``: drive runs from a PostgreSQL queue (``runtime/worker.py``).

    fsm-agent worker --db postgresql://... --app myapp.agent:make_runtime --concurrency 8
    fsm-agent worker --db postgresql://... --status

``--app`` names a function ``make_runtime(store)`` that returns the application's
:class:`~fsm_agent.Runtime` built on the store it is given (its model, tools, allow-list,
approvals). SIGTERM or Ctrl-C drains: no new claims, ``--grace`` seconds for the runs in
progress, then the rest are released for another worker.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "worker",
        help="drive runs from a PostgreSQL queue (a fleet of workers on many hosts)",
        description="Claim runs from a PostgreSQL store and drive them with your application's "
        "Runtime; or, with --status, show the fleet and the queue.",
    )
    p.add_argument("--db", required=True, help="the PostgreSQL DSN (postgresql://user@host/db)")
    p.add_argument(
        "--app",
        metavar="MODULE:FUNCTION",
        help="a function make_runtime(store) returning your Runtime on that store",
    )
    p.add_argument("--concurrency", type=_positive_int, default=4, help="runs at once (default 4)")
    p.add_argument(
        "--grace",
        type=_seconds,
        default=30.0,
        help="seconds runs in progress get to finish after SIGTERM (default 30)",
    )
    p.add_argument(
        "--lease",
        type=_seconds,
        default=30.0,
        help="seconds a claim holds without a heartbeat (default 30)",
    )
    p.add_argument(
        "--poll",
        type=_seconds,
        default=5.0,
        help="seconds between looks for expired leases when nothing is announced (default 5)",
    )
    p.add_argument(
        "--schema", default="fsm_agent", help="the PostgreSQL schema (default fsm_agent)"
    )
    p.add_argument("--status", action="store_true", help="print the fleet and the queue, and exit")
    p.add_argument("--json", action="store_true", help="with --status: one JSON object")
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.set_defaults(handler=_main)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _fail(message: str) -> int:
    print(f"fsm-agent worker: {message}", file=sys.stderr)
    return 2


def _main(args: argparse.Namespace) -> int:
    from fsm_agent._errors import ConfigError, StoreError, UsageError

    try:
        if args.status:
            return _status(args)
        if not args.app:
            raise UsageError("--app MODULE:FUNCTION is required (or --status)")
        return _work(args)
    except (StoreError, ConfigError, UsageError) as exc:
        return _fail(str(exc))


def _check_dsn(args: argparse.Namespace) -> None:
    from fsm_agent._durable.postgres import is_postgres_dsn
    from fsm_agent._errors import UsageError

    if not is_postgres_dsn(args.db):
        raise UsageError(f"--db must be a postgresql:// DSN, got {args.db!r}")


def _store(args: argparse.Namespace, **options: Any) -> Any:
    from fsm_agent._durable.postgres import PostgresStore

    _check_dsn(args)
    return PostgresStore(args.db, schema=args.schema, lease_s=args.lease, **options)


def _load_factory(spec: str) -> Any:
    """The ``--app`` function, refused before any store is opened unless it can be
    called as ``make_runtime(store)``."""
    from fsm_agent._errors import UsageError

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--app must be MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # an app module next to where the worker starts
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load --app {spec}: {exc}") from None
    if not callable(factory):
        raise UsageError(f"--app {spec} is not a function")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: try it as given
        return factory
    try:
        signature.bind(object())
    except TypeError:
        raise UsageError(
            f"--app {spec} has the signature {attr}{signature}; it must take the store: "
            f"def {attr}(store): return Runtime(..., store=store) (the worker opens the "
            "store from --db and every run it drives must be kept there)"
        ) from None
    return factory


def _load_app(spec: str, factory: Any, store: Any) -> Any:
    from fsm_agent._errors import UsageError
    from fsm_agent._runtime.runtime import Runtime

    try:
        runtime = factory(store)
    except Exception as exc:  # the application's own error: one line, exit 2
        raise UsageError(f"--app {spec} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(runtime, Runtime):
        raise UsageError(f"--app {spec} returned {type(runtime).__name__}, not a Runtime")
    if runtime.store is not store:
        raise UsageError(
            f"--app {spec} must build its Runtime on the store it is given "
            "(Runtime(..., store=store)), not on a store of its own"
        )
    return runtime


def _work(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from fsm_agent._runtime.worker import Worker

    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(message)s",
        stream=sys.stderr,
    )
    # The pool's own reconnection warnings span lines; the worker logs its own one-liners.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    _check_dsn(args)
    factory = _load_factory(args.app)
    # Each run in progress may hold a connection (a store operation, its heartbeat).
    store = _store(args, pool_size=args.concurrency + 4)
    with store:
        worker = Worker(
            _load_app(args.app, factory, store),
            concurrency=args.concurrency,
            grace_s=args.grace,
            poll_s=args.poll,
        )

        async def main() -> None:
            loop = asyncio.get_running_loop()
            # Store operations run on threads: enough of them for every run at once.
            loop.set_default_executor(ThreadPoolExecutor(max_workers=args.concurrency * 2 + 4))
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await worker.run(stop)

        asyncio.run(main())
    return 0


def _status(args: argparse.Namespace) -> int:
    with _store(args, readonly=True, pool_size=1) as store:
        fleet = store.fleet()
    if args.json:
        print(json.dumps(fleet))
        return 0
    workers = fleet["workers"]
    print(f"workers ({len(workers)}):")
    for w in workers:
        seen = "" if w["state"] == "stopped" else f", seen {w['seen_s']:.0f}s ago"
        print(
            f"  {w['worker']}  {w['state']}{seen}  active {w['active']}/{w['concurrency']}  "
            f"claimed {w['claimed']} finished {w['finished']} released {w['released']} "
            f"failed {w['failed']} fenced {w['fenced']}"
        )
    print("runs:")
    for state, n in sorted(fleet["runs"].items()):
        extra = [f"{k} {v}" for k, v in n.items() if k != "runs" and v]
        print(f"  {state:<18} {n['runs']:>7}" + (f"  ({', '.join(extra)})" if extra else ""))
    if not fleet["runs"]:
        print("  none")
    return 0
