"""``fsm-agent keys add|list|revoke``: the review server's API keys.

A key is printed once, by ``add``; the store keeps only a salted hash of it (see
``durable/feed.py``). Its name is who the audit trail says decided a review.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from fsm_agent._cli.runs import _guarded, _open, _seconds

__all__ = ["register"]


def register(subparsers: Any) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="add, list or revoke the review server's API keys",
        description="API keys of `fsm-agent serve`, stored (hashed) in the runs database.",
    )
    sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--db", required=True, help="the SQLite file (e.g. runs.db) or a postgresql:// DSN"
        )
        p.add_argument("--timeout", type=_seconds, default=5.0, help="lock/connect timeout (s)")
        p.add_argument("--schema", default="fsm_agent", help="PostgreSQL only: the schema")
        return p

    p = add("add", "make a key and print it (once: only its hash is stored)")
    p.add_argument("name", help="who holds the key (recorded as the reviewer)")
    p.add_argument(
        "--scope",
        required=True,
        choices=("read", "review", "admin"),
        help="read: view runs; review: also decide reviews; admin: also submit and cancel",
    )
    p.set_defaults(handler=_add)
    p = add("list", "the keys: name, scope, created, revoked (never the key)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=_list)
    p = add("revoke", "revoke the active key of this name (at once, for every server)")
    p.add_argument("name")
    p.set_defaults(handler=_revoke)


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return datetime.fromtimestamp(stamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


@_guarded
def _add(args: argparse.Namespace) -> int:
    from fsm_agent._durable.feed import make_key
    from fsm_agent._errors import ConfigError

    try:
        key, record = make_key(args.name, args.scope)
        with _open(args, write=True) as store:
            store.add_key(record)
    except ConfigError as exc:
        print(f"fsm-agent keys: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"key {record.key_id} for {record.name} ({record.scope}); shown once, store it now",
        file=sys.stderr,
    )
    return 0


@_guarded
def _list(args: argparse.Namespace) -> int:
    with _open(args) as store:
        records = store.list_keys()
    for r in records:
        if args.json:
            row = {"key_id": r.key_id, "name": r.name, "scope": r.scope}
            print(json.dumps({**row, "created": r.created, "revoked": r.revoked}))
        else:
            state = f"revoked {_when(r.revoked)}" if r.revoked else "active"
            print(f"{r.key_id}  {r.name:<20} {r.scope:<7} {_when(r.created)}  {state}")
    if not records and not args.json:
        print("no keys (fsm-agent keys add NAME --scope read|review|admin --db ...)")
    return 0


@_guarded
def _revoke(args: argparse.Namespace) -> int:
    with _open(args, write=True) as store:
        count = store.revoke_key(args.name)
    if not count:
        print(f"fsm-agent keys: no active key named {args.name!r}", file=sys.stderr)
        return 1
    print(f"revoked the key of {args.name}")
    return 0
