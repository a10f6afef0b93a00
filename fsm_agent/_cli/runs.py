"""``fsm-agent runs``: list, inspect, review and export stored runs.

``approve``, ``deny`` and ``reconcile`` only *record* the reviewer's decision (the
table's ``review`` transition and a ``review`` event in the run's trace, with ``--by`` who
decided and ``--note`` why, and an approval bound to the call's exact arguments, or with
``approve --arguments JSON`` to the reviewer's corrected ones, an ``edit``): this
process has neither the run's model nor its tools. A worker, or the application's
``Runtime.resume(run_id)``, continues the run once every blocking call is settled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from fsm_agent._core.table import STATES

__all__ = ["register"]


def register(subparsers: Any) -> None:  # long: declarations of the subcommands and flags
    runs = subparsers.add_parser(
        "runs",
        help="list, show, approve, deny, reconcile, cancel or export stored runs",
        description="Inspect and review durable runs stored in a SQLite file or PostgreSQL.",
    )
    sub = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--db", required=True, help="the SQLite file (e.g. runs.db) or a postgresql:// DSN"
        )
        p.add_argument(
            "--timeout",
            type=_seconds,
            default=5.0,
            help="seconds to wait for a lock held by another process, or for a PostgreSQL "
            "connection (default 5)",
        )
        p.add_argument(
            "--schema",
            default="fsm_agent",
            help="PostgreSQL only: the schema that holds the runs (default fsm_agent)",
        )
        return p

    p = add("list", "list stored runs, newest first")
    p.add_argument("--status", choices=STATES, help="only runs in this state")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=_list)

    p = add("show", "a run's state, pending calls and last events")
    p.add_argument("run_id")
    p.add_argument(
        "--events",
        type=_count,
        default=10,
        metavar="N",
        help="how many of the last events to print (default 10)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_show)

    def review(name: str, help_text: str) -> argparse.ArgumentParser:
        p = add(name, help_text)
        p.add_argument("run_id")
        p.add_argument("call_id")
        p.add_argument(
            "--key-env",
            metavar="NAME",
            help="environment variable holding the runtime's trace_key (runs with a signed "
            "trace: the review event is chained onto it)",
        )
        p.add_argument(
            "--by",
            metavar="NAME",
            help="who decides, recorded in the review event (default: this OS user)",
        )
        p.add_argument("--note", metavar="TEXT", help="why, recorded in the review event")
        return p

    p = review("approve", "approve a call waiting for approval (bound to its exact arguments)")
    p.add_argument(
        "--arguments",
        type=_json_value,
        metavar="JSON",
        help="approve the call with these corrected arguments instead (a JSON object the "
        "tool's schema accepts; the call runs with them), e.g. "
        '\'{"order_id": "A17", "amount_cents": 4000}\'',
    )
    p.set_defaults(handler=_review, action="approve")

    p = review("deny", "deny a paused call; the model is told the reason")
    p.add_argument("--reason", required=True, help="what the model is told")
    p.set_defaults(handler=_review, action="deny")

    p = review("reconcile", "settle a write of unknown outcome with the result observed outside")
    p.add_argument(
        "--result",
        required=True,
        type=_json_value,
        metavar="JSON",
        help='the observed result as JSON, e.g. \'{"ticket": "T-1"}\'',
    )
    p.set_defaults(handler=_review, action="reconcile")

    p = add(
        "cancel",
        "cancel a run: at once if it waits to be driven, else a request its driver "
        "honours at its next step",
    )
    p.add_argument("run_id")
    p.add_argument(
        "--key-env",
        metavar="NAME",
        help="environment variable holding the runtime's trace_key (a signed trace)",
    )
    p.add_argument(
        "--by",
        metavar="NAME",
        help="who cancels, recorded in the cancel transition (default: this OS user)",
    )
    p.add_argument("--note", metavar="TEXT", help="why, recorded in the cancel transition")
    p.set_defaults(handler=_cancel)

    p = add("export", "write a run's trace as JSON Lines (for fsm-agent check / replay)")
    p.add_argument("run_id")
    p.add_argument("-o", "--output", help="file to write (default: standard output)")
    p.set_defaults(handler=_export)

    p = add("prune", "delete finished runs (never one waiting for review) and old records")
    p.add_argument(
        "--older-than",
        required=True,
        type=_age,
        metavar="AGE",
        help="how long ago a run must have ended, e.g. 7d, 12h, 30m, 90s",
    )
    p.add_argument(
        "--keep-intents",
        action="store_true",
        help="keep committed idempotency records (by default those as old go too: a "
        "request that old then runs again instead of replaying)",
    )
    p.set_defaults(handler=_prune)


# ── argument types (argparse turns their ValueError into a usage error, exit 2) ───


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

#: The states a run never leaves (a cancel request on such a run is history, not news).
_ENDED = frozenset({"done", "budget_exhausted", "protocol_error", "cancelled"})


def _age(text: str) -> float:
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"an age like 7d, 12h, 30m or 90s, got {text!r}")
    return float(number) * _UNITS[unit]


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return int(text)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# ── handlers ──────────────────────────────────────────────────────────────────────


def _fail(message: str, code: int = 2, command: str = "runs") -> int:
    print(f"fsm-agent {command}: {message}", file=sys.stderr)
    return code


def _guarded(fn: Any) -> Any:
    """Store problems become one line on stderr and an exit code, never a traceback
    (named by the subcommand that failed: ``runs``, ``keys``, ``serve``)."""

    def wrapper(args: argparse.Namespace) -> int:
        from fsm_agent._errors import ReviewError, RunBusy, StoreError, UsageError

        command = str(getattr(args, "command", None) or "runs")
        try:
            return int(fn(args))
        except RunBusy as exc:  # a fine request at a bad moment: try again later
            return _fail(str(exc), 1, command)
        except (ReviewError, StoreError, UsageError) as exc:
            return _fail(str(exc), 2, command)
        except BrokenPipeError:
            raise  # `runs show --json | head`: the reader left; main() ends quietly
        except OSError as exc:
            return _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), 2, command)

    return wrapper


def _open(args: argparse.Namespace, *, write: bool = False) -> Any:
    """The store; read-only unless the command records something (reading never writes,
    not even a schema)."""
    from fsm_agent._durable.postgres import is_postgres_dsn
    from fsm_agent._durable.sqlite import SqliteStore

    if is_postgres_dsn(args.db):
        from fsm_agent._durable.postgres import PostgresStore

        return PostgresStore(
            args.db,
            schema=args.schema,
            timeout=args.timeout,
            pool_size=1,
            create=False,
            readonly=not write,
        )
    return SqliteStore(args.db, timeout=args.timeout, create=False, readonly=not write)


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


@_guarded
def _list(args: argparse.Namespace) -> int:
    with _open(args) as store:
        runs = store.list_runs(args.status)
    if args.json:
        for r in runs:
            print(
                json.dumps(
                    {
                        "run_id": r.run_id,
                        "state": r.state,
                        "reason": r.reason,
                        "pending": r.pending,
                        "created": r.created,
                        "updated": r.updated,
                    }
                )
            )
        return 0
    if not runs:
        print("no runs" + (f" in state {args.status}" if args.status else ""))
        return 0
    rows = [
        [
            r.run_id,
            f"{r.state}/{r.reason}" if r.reason else r.state,
            str(r.pending),
            _when(r.updated),
        ]
        for r in runs
    ]
    for line in _columns(["RUN", "STATUS", "PENDING", "UPDATED"], rows):
        print(line)
    return 0


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a table whose columns line up on a terminal whatever the cells hold:
    each cell is made printable on one line, then padded to its column's display width
    (wide characters take two cells, combining marks none)."""
    cells = [[_printable(c) for c in row] for row in [header, *rows]]
    widths = [max(_width(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c + " " * (w - _width(c)) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def _printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped (a run id may
    hold a newline or a tab and would break the row)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _width(text: str) -> int:
    import unicodedata

    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
        for c in text
    )


@_guarded
def _show(args: argparse.Namespace) -> int:
    from fsm_agent._durable.review import pending_calls

    with _open(args) as store:
        stored = store.load_run(args.run_id)
    ctx = stored.body
    pending = pending_calls(stored)
    events = stored.events[-args.events :] if args.events else []
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": stored.run_id,
                    "state": ctx.get("state"),
                    "reason": ctx.get("reason"),
                    "detail": ctx.get("detail"),
                    "answer": ctx.get("answer"),
                    "counters": ctx.get("counters"),
                    "pending": pending,
                    "events": events,
                    "cancel_requested": stored.cancel_request and stored.cancel_request.to_json(),
                },
                ensure_ascii=False,
            )
        )
        return 0
    status = ctx.get("state", "?") + (f"/{ctx['reason']}" if ctx.get("reason") else "")
    print(f"run {stored.run_id}: {status}")
    _print_asked(stored)
    if ctx.get("detail"):
        print(f"  detail: {ctx['detail']}")
    if ctx.get("answer"):
        print(f"  answer: {ctx['answer']}")
    counters = ctx.get("counters") or {}
    print(
        "  counters: "
        + " ".join(
            f"{k}={v}"
            for k, v in counters.items()
            if k
            in ("model_calls", "tool_rounds", "tool_calls", "write_attempts", "replays", "tokens")
        )
    )
    if pending:
        print("  pending calls:")
        for p in pending:
            decided = f"  [recorded: {p['review']['action']}]" if p["review"] else ""
            print(
                f"    {p['call_id']}  {p['tool']}  {p['arguments']}  waiting for "
                f"{p['waiting_for']}{decided}"
            )
    if events:
        print(f"  last {len(events)} events:")
        for e in events:
            print("    " + _describe(e))
    return 0


def _describe(e: dict[str, Any]) -> str:
    kind, seq = e.get("type"), e.get("seq")
    if kind == "transition":
        where = f" ({e['call_id']} {e.get('tool')})" if e.get("call_id") else ""
        why = f" reason={e['reason']}" if e.get("reason") else ""
        return f"{seq:>4} {e['trigger']}: {e['source']} -> {e['dest']}{where}{why}"
    if kind == "observation":
        result = json.dumps(e.get("result"), ensure_ascii=False)
        result = result if len(result) <= 100 else result[:97] + "..."
        return f"{seq:>4} observation {e.get('call_id')}: {result}"
    if kind == "review":
        shown = ("reason", "result", "arguments", "reviewer", "at", "note")
        extra = {k: v for k, v in e.items() if k in shown}
        return f"{seq:>4} review {e.get('action')} {e.get('call_id')} {json.dumps(extra)}"
    if kind == "run_end":
        return f"{seq:>4} run_end {e.get('status')}/{e.get('reason')}"
    return f"{seq:>4} {kind}"


def _os_user() -> str | None:
    """The name of the user running the CLI, if the system knows one."""
    import getpass

    try:
        return getpass.getuser() or None
    except Exception:  # no name for this uid (a container), no LOGNAME/USER set
        return None


@_guarded
def _review(args: argparse.Namespace) -> int:
    from fsm_agent._durable.review import BLOCKING, pending_calls, record_review

    key = None
    if args.key_env:
        key = os.environ.get(args.key_env)
        if not key:
            return _fail(f"--key-env {args.key_env}: the variable is not set or empty")
    arguments = getattr(args, "arguments", None)
    action = "edit" if arguments is not None else args.action
    with _open(args, write=True) as store:
        event = record_review(
            store,
            args.run_id,
            args.call_id,
            action,
            reason=getattr(args, "reason", None),
            result=getattr(args, "result", None),
            arguments=arguments,
            key=key,
            reviewer=args.by if args.by is not None else _os_user(),
            note=args.note,
        )
        waiting = [
            p["call_id"]
            for p in pending_calls(store.load_run(args.run_id))
            if p["waiting_for"] in BLOCKING and not p["review"]
        ]
    by = f" by {event['reviewer']}" if event.get("reviewer") else ""
    edited = ""
    if arguments is not None:
        edited = f" with arguments {json.dumps(arguments, ensure_ascii=False)}"
    print(f"recorded {args.action} of {args.call_id} in run {args.run_id}{by}{edited}")
    if waiting:
        print(f"still waiting for: {', '.join(waiting)}")
    elif hasattr(store, "claim_next"):
        print("a worker continues the run (fsm-agent worker)")
    else:
        print("the run continues when the application resumes it (Runtime.resume)")
    return 0


def _print_asked(stored: Any) -> None:
    """A cancel requested of a run not yet ended (its driver has not stopped it yet)."""
    asked = stored.cancel_request
    if asked is not None and stored.body.get("state") not in _ENDED:
        who = f" by {asked.by}" if asked.by else ""
        why = f": {asked.note}" if asked.note else ""
        print(f"  cancel requested{who} at {asked.at}{why} (its driver stops it at its next step)")


@_guarded
def _cancel(args: argparse.Namespace) -> int:
    from fsm_agent._durable.cancel import ask_cancel
    from fsm_agent._durable.store import CancelRequest

    key = None
    if args.key_env:
        key = os.environ.get(args.key_env)
        if not key:
            return _fail(f"--key-env {args.key_env}: the variable is not set or empty")
    by = args.by if args.by is not None else _os_user()
    with _open(args, write=True) as store:
        done = ask_cancel(store, args.run_id, key=key, by=by, note=args.note)
    if isinstance(done, CancelRequest):
        who = f" by {done.by}" if done.by else ""
        print(
            f"cancel requested for run {args.run_id}{who} at {done.at}: its driver stops "
            "it at its next step (fsm-agent runs show to see it end)"
        )
        return 0
    print(f"cancelled run {args.run_id} ({done.state}/{done.reason})" + (f" by {by}" if by else ""))
    return 0


@_guarded
def _export(args: argparse.Namespace) -> int:
    from fsm_agent._cli._output import (
        refuse_clobber,
        refuse_stdout_clobber,
        sqlite_inputs,
        write_output,
    )
    from fsm_agent._durable.postgres import is_postgres_dsn

    inputs = [] if is_postgres_dsn(args.db) else sqlite_inputs(args.db)
    # Before the store is opened: nothing is read for a refused output.
    if args.output:
        refuse_clobber("-o", args.output, inputs)
    else:
        refuse_stdout_clobber(inputs)
    with _open(args) as store:
        events = store.load_run(args.run_id).events
    from fsm_agent._trace.chain import dumps_event

    # The stored lines, byte for byte: a stored event is its chained line read back, and
    # compact JSON of it is that line again (so `fsm-agent check` verifies its links).
    lines = "".join(dumps_event(e) + "\n" for e in events)
    if args.output:
        write_output("-o", args.output, lines.encode("utf-8"), inputs)
        print(f"wrote {len(events)} events to {args.output}")
    else:
        sys.stdout.write(lines)
    return 0


@_guarded
def _prune(args: argparse.Namespace) -> int:
    with _open(args, write=True) as store:
        runs, intents = store.prune(args.older_than, intents=not args.keep_intents)
    print(
        f"pruned {runs} finished runs and {intents} idempotency records older than "
        f"{args.older_than:g}s"
    )
    return 0
