"""``fsm-agent check TRACE...`` (or ``--db runs.db RUN...``): verify recorded traces
against the run machine, their chain links and, for stored runs, the store."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fsm_agent._errors import ConfigError, StoreError, TraceError
from fsm_agent._trace.checker import Report, check_trace, message_line

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check",
        help="verify traces by replaying them through the engine, and their chain",
        description="Check each trace by replaying it: its recorded inputs (model replies, "
        "tool outcomes, clock readings, the store's answers, approval uses) are fed to the "
        "engine's own loop, and every event the engine writes must be the recorded one, "
        "field by field; also that its chain links are unbroken (with --key-env, that it "
        "was signed with that key) and that no idempotent write ran twice. With --db, the "
        "arguments are run ids: their stored traces are checked and compared with the "
        "store's idempotency records. Exit 0: all valid; 1: violations found; 2: a trace "
        "could not be read at all.",
    )
    p.add_argument(
        "traces", nargs="+", metavar="TRACE", help="JSON Lines trace file(s), or run ids"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    p.add_argument(
        "--key-env",
        metavar="NAME",
        help="environment variable holding the trace key (Runtime(trace_key=...)): verify "
        "that signed traces were signed with it",
    )
    p.add_argument(
        "--db",
        metavar="STORE",
        help="a store (a SQLite file or a postgresql:// DSN): check these stored runs",
    )
    p.add_argument(
        "--schema",
        default="fsm_agent",
        help="with a PostgreSQL --db: the schema that holds the runs (default fsm_agent)",
    )
    p.set_defaults(handler=run_check)


def _key(args: argparse.Namespace) -> tuple[bytes | None, str | None]:
    if not args.key_env:
        return None, None
    value = os.environ.get(args.key_env)
    if not value:
        return None, f"--key-env {args.key_env}: the variable is not set or empty"
    return value.encode("utf-8", "surrogateescape"), None


def run_check(args: argparse.Namespace) -> int:
    key, problem = _key(args)
    if problem:
        print(f"fsm-agent check: {problem}", file=sys.stderr)
        return 2
    if args.db:
        return _check_stored(args, key)
    code = 0
    for path in args.traces:
        try:
            report = check_trace(path, key=key)
        except TraceError as exc:
            print(f"error: {message_line(str(exc))}", file=sys.stderr)
            code = 2
            continue
        code = max(code, _print(report, path, args.quiet))
    return code


def _print(report: Report, where: str, quiet: bool) -> int:
    for violation in report.violations:
        print(violation.format(where))
    for note in report.notes:
        print(f"{where}: note: {note}", file=sys.stderr)
    if report.violations:
        more = f" (and {report.omitted} more not shown)" if report.omitted else ""
        print(f"{where}: {len(report.violations)} violation(s){more}", file=sys.stderr)
        return 1
    if not quiet:
        print(f"{where}: ok")
    return 0


def _check_stored(args: argparse.Namespace, key: bytes | None) -> int:
    from fsm_agent._durable.audit import audit_run
    from fsm_agent._durable.postgres import is_postgres_dsn
    from fsm_agent._durable.sqlite import SqliteStore

    store: Any
    try:
        if is_postgres_dsn(args.db):
            from fsm_agent._durable.postgres import PostgresStore

            store = PostgresStore(
                args.db, schema=args.schema, pool_size=1, create=False, readonly=True
            )
        else:
            store = SqliteStore(args.db, create=False, readonly=True)
    except (StoreError, ConfigError) as exc:
        print(f"error: {message_line(str(exc))}", file=sys.stderr)
        return 2
    # A DSN may hold a password: a PostgreSQL store is named without it.
    label = store.name if is_postgres_dsn(args.db) else args.db
    code = 0
    with store:
        for run_id in args.traces:
            where = f"{label}#{run_id}"
            try:
                report = audit_run(store, run_id, key=key, name=where)
            except StoreError as exc:
                print(f"error: {where}: {message_line(str(exc))}", file=sys.stderr)
                code = 2
                continue
            code = max(code, _print(report, where, args.quiet))
    return code
