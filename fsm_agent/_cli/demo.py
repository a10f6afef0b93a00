"""``fsm-agent demo``: the scenarios of both seed articles, run with scripted models.

Each scenario builds a fresh backend and runtime, runs it, and checks the stop reason and
the side-effect counts (tool attempts, tickets created, replays) taken from the backend
itself. By default it prints one readable block per scenario (what happened, the path
through the machine, the stop, each check ✓/✗) and a final table; ``--json`` prints the
machine-readable stream instead (one JSON line per trace event and a summary line per
scenario). Any mismatch makes the command exit 1.

Scenarios are importable (:data:`SCENARIOS`) so other commands can run one with a real
model instead of the script: ``SCENARIOS["happy"].run(model=...)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsm_agent._cli import demo_report as report
from fsm_agent._cli.demo_report import ScenarioOutcome
from fsm_agent._cli.model_args import ModelArgsError, add_model_arguments, model_from_args
from fsm_agent._core.approvals import Approval
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.events import Event, TextDelta, ToolArgsDelta
from fsm_agent._errors import ToolRejected, TransientToolError, UsageError
from fsm_agent._runtime.result import RunResult
from fsm_agent._runtime.runtime import Model, Runtime
from fsm_agent.models._scripted import ScriptedModel, StreamingScriptedModel
from fsm_agent.tools._registry import ToolRegistry

__all__ = ["SCENARIOS", "Backend", "Scenario", "ScenarioOutcome", "register"]

DOCS = (
    "Order A17 left the Shanghai warehouse and is in transit.",
    "Refunds are issued to the original payment method within 5 days.",
    "Tickets are created by support for damaged or missing parcels.",
    "Order A18 was delivered to the front desk.",
)


class Backend:
    """The demo's external systems, in memory: an order lookup, a search index, tickets.

    Counts are taken from the backend's own final state, never from what a tool said.
    """

    def __init__(self, *, transient_searches: int = 0, lose_write_responses: int = 0) -> None:
        self.tickets: dict[str, dict[str, Any]] = {}
        self.transient_searches = transient_searches
        self.lose_write_responses = lose_write_responses

    def search(self, query: str) -> list[str]:
        if self.transient_searches > 0:
            self.transient_searches -= 1
            raise TransientToolError("search index timed out (injected)")
        words = set(query.lower().split())
        hits = [(len(words & set(d.lower().rstrip(".").split())), d) for d in DOCS]
        return [d for score, d in sorted(hits, key=lambda h: -h[0]) if score][:2]

    def create_ticket(self, request_id: str, title: str) -> dict[str, Any]:
        existing = self.tickets.get(request_id)
        if existing is not None and existing["title"] != title:
            raise ToolRejected(f"request {request_id} already exists with another title")
        ticket = existing or {"ticket_id": f"T-{len(self.tickets) + 1}", "title": title}
        self.tickets[request_id] = ticket
        if self.lose_write_responses > 0:
            self.lose_write_responses -= 1
            raise ConnectionResetError("ticket created, but the response was lost (injected)")
        return dict(ticket)

    def registry(self) -> ToolRegistry:
        tools = ToolRegistry()
        tools.register(
            lambda order_id: {"order_id": order_id, "status": "in_transit"},
            name="check_order",
            effect="read",
            description="Look up an order's status.",
            schema={
                "type": "object",
                "required": ["order_id"],
                "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 80}},
            },
        )
        tools.register(
            self.search,
            name="search",
            effect="read",
            description="Search the help centre.",
            schema={
                "type": "object",
                "required": ["query"],
                "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
            },
        )
        tools.register(
            self.create_ticket,
            name="create_ticket",
            effect="write",
            requires_approval=True,
            idempotency_key=lambda args: args["request_id"],
            description="Open a support ticket (needs approval).",
            schema={
                "type": "object",
                "required": ["request_id", "title"],
                "properties": {
                    "request_id": {"type": "string", "pattern": "^R-[0-9]+$"},
                    "title": {"type": "string", "minLength": 1, "maxLength": 120},
                },
            },
        )
        return tools


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def calls(*tool_calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(tool_calls)}


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


TICKET = {"request_id": "R-1", "title": "Parcel A17 arrived damaged"}
ALLOWED = ("check_order", "search", "create_ticket")


@dataclass
class Scenario:
    """One demo: a script, the runtime options, and what must hold afterwards."""

    name: str
    description: str
    task: str
    script: list[Any]
    expect_status: str
    expect_reason: str
    expect_counts: dict[str, int]
    backend: Callable[[], Backend] = Backend
    budget: Budget = field(default_factory=Budget)
    approvals: tuple[Approval, ...] = ()
    follow_up: Callable[[Runtime, Backend, RunResult, Path | None], list[RunResult]] | None = None

    def _first_run(
        self, runtime: Runtime, trace: Path | None, on_event: Callable[[Event], None] | None
    ) -> RunResult:
        run_id = f"demo-{self.name}"
        if on_event is None:
            return runtime.run(self.task, run_id=run_id, trace=trace)
        with runtime.stream(self.task, run_id=run_id, trace=trace, trace_deltas=True) as live:
            for event in live:
                on_event(event)
        return live.result

    def run(
        self,
        model: Model | None = None,
        trace_dir: str | Path | None = None,
        on_event: Callable[[Event], None] | None = None,
        db: Any = None,
    ) -> ScenarioOutcome:
        """Run the scenario; with ``model`` the script is replaced and only the stop is
        checked (a real model's tool use is its own business). With ``on_event`` the run
        is streamed (``Runtime.stream``, the script through a ``StreamingScriptedModel``,
        raw deltas kept in the trace) and each event goes to it as it happens. ``db``: a
        store that gets a copy of each of its runs, as stored (for ``fsm-agent serve``)."""
        backend = self.backend()
        scripted: Model = (
            StreamingScriptedModel(self.script, chunk=6)
            if on_event is not None
            else ScriptedModel(self.script)
        )
        runtime = Runtime(
            model=model or scripted,
            tools=backend.registry(),
            allowed_tools=ALLOWED,
            budget=self.budget,
            retry=RetryPolicy(max_attempts=2, backoff_s=0.01),
            approvals=self.approvals,
        )
        folder = Path(trace_dir) if trace_dir is not None else None
        trace = folder / f"{self.name}.jsonl" if folder is not None else None
        if trace is not None and trace.exists():
            trace.unlink()
        first = self._first_run(runtime, trace, on_event)
        results = [first]
        checks: dict[str, tuple[Any, Any]] = {
            "status": (self.expect_status, first.status),
            "reason": (self.expect_reason, first.reason),
        }
        if model is None:
            actual = {
                "search_attempts": first.counters["tool_attempts"].get("search", 0),
                "write_attempts": first.counters["write_attempts"],
                "replays": first.counters["replays"],
                "tickets_created": len(backend.tickets),
                "model_calls": first.counters["model_calls"],
                "tool_attempts": sum(first.counters["tool_attempts"].values()),
            }
            for key, expected in self.expect_counts.items():
                checks[key] = (expected, actual[key])
            if self.follow_up is not None:
                results += self.follow_up(runtime, backend, first, folder)
                checks["tickets_after_follow_up"] = (1, len(backend.tickets))
                checks["follow_up_replayed"] = (1, results[-1].counters["replays"])
                checks["follow_up_status"] = ("done", results[-1].status)
        if db is not None:
            for result in results:
                _copy_run(runtime.store, db, result.run_id)
        return ScenarioOutcome(self.name, results, checks, _notes(results))


def _copy_run(source: Any, target: Any, run_id: str) -> None:
    """``run_id`` as ``source`` stores it (header, events, checkpoint, history), stored in
    ``target``. Each scenario runs on a store of its own (their idempotency keys overlap
    on purpose: the same request in another scenario must not replay), and the demo's
    database then holds them all."""
    from fsm_agent._durable import owners
    from fsm_agent._durable.store import Checkpoint
    from fsm_agent._trace.chain import encode_events, strip_links

    stored = source.load_run(run_id)
    events = strip_links(stored.events)
    lines = encode_events(events, run_id) if getattr(target, "wants_lines", False) else None
    owner = owners.new_owner()
    rows = list(enumerate(stored.messages))
    target.create_run(run_id, stored.header, owner, events,
                      Checkpoint(stored.snapshot, rows, lines))  # fmt: skip
    target.release(run_id, owner)


def _reconcile_and_resubmit(
    runtime: Runtime, backend: Backend, first: RunResult, folder: Path | None
) -> list[RunResult]:
    """The lost write, settled the safe way: a trusted party looks up the ticket in the
    backend and records that outcome under the same key; resubmitting replays it."""
    observed = backend.tickets.get(TICKET["request_id"])
    record = runtime.store.get_intent("create_ticket", TICKET["request_id"])
    if observed is not None and record is not None and record.status == "pending":
        runtime.store.commit_intent(
            "create_ticket", TICKET["request_id"], record.owner, dict(observed)
        )
    trace = folder / "lost_write_resubmit.jsonl" if folder is not None else None
    if trace is not None and trace.exists():
        trace.unlink()
    again = runtime.run(
        "Open a ticket for the damaged parcel (resubmitted).",
        run_id="demo-lost_write-resubmit",
        trace=trace,
        model=ScriptedModel(
            [calls(call("call-1", "create_ticket", **TICKET)), say("Ticket T-1 is open.")]
        ),
    )
    return [again]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "happy",
            "one search, then an answer",
            "Where is order A17?",
            [
                calls(call("call-1", "search", query="order A17 transit")),
                say("Order A17 is in transit."),
            ],
            "done",
            "final_answer",
            {"search_attempts": 1, "tickets_created": 0, "write_attempts": 0},
        ),
        Scenario(
            "retry",
            "the first search fails transiently; the read is retried once",
            "Where is order A17?",
            [calls(call("call-1", "search", query="order A17")), say("Order A17 is in transit.")],
            "done",
            "final_answer",
            {"search_attempts": 2, "tickets_created": 0},
            backend=lambda: Backend(transient_searches=1),
        ),
        Scenario(
            "approval",
            "an approved ticket is requested twice: created once, then replayed",
            "Parcel A17 arrived damaged; open a ticket.",
            [
                calls(call("call-1", "create_ticket", **TICKET)),
                calls(call("call-2", "create_ticket", **TICKET)),
                say("Ticket T-1 is open."),
            ],
            "done",
            "final_answer",
            {"write_attempts": 2, "tickets_created": 1, "replays": 1},
            approvals=(Approval("create_ticket", TICKET),),
        ),
        Scenario(
            "denied",
            "a ticket whose approval was issued for other arguments runs nothing",
            "Parcel A17 arrived damaged; open a ticket.",
            [calls(call("call-1", "create_ticket", **TICKET))],
            "review_required",
            "approval_required",
            {"write_attempts": 0, "tickets_created": 0},
            approvals=(Approval("create_ticket", {**TICKET, "title": "Another title"}),),
        ),
        Scenario(
            "loop",
            "the model keeps searching; the round budget stops it before a 4th decision",
            "Find everything about A17.",
            [calls(call(f"call-{i}", "search", query=f"A17 page {i}")) for i in range(1, 6)],
            "budget_exhausted",
            "tool_rounds",
            {"search_attempts": 2, "model_calls": 3},
            budget=Budget(max_tool_rounds=2),
        ),
        Scenario(
            "lost_write",
            "the ticket is created but the response is lost: stop for review, never "
            "redo it; a trusted reconcile then makes the resubmission a replay",
            "Parcel A17 arrived damaged; open a ticket.",
            [
                calls(
                    call("call-1", "create_ticket", **TICKET),
                    call("call-2", "search", query="damaged parcel"),
                )
            ],
            "review_required",
            "outcome_unknown",
            {"write_attempts": 1, "tickets_created": 1, "search_attempts": 0},
            backend=lambda: Backend(lose_write_responses=1),
            approvals=(Approval("create_ticket", TICKET),),
            follow_up=_reconcile_and_resubmit,
        ),
        Scenario(
            "bad_batch",
            "two calls share one id: the whole batch is refused before any runs",
            "Where are orders A17 and A18?",
            [
                calls(
                    call("call-1", "check_order", order_id="A17"),
                    call("call-1", "check_order", order_id="A18"),
                )
            ],
            "protocol_error",
            "duplicate_tool_call_id",
            {"tool_attempts": 0},
        ),
    )
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the scripted scenarios of the seed articles and check them",
        description="Run demo scenarios with scripted models and check each stop and its "
        "side effects: a readable block per scenario and a table (or, with --json, one "
        "JSON line per trace event and a summary per scenario); exit 1 on any mismatch.",
    )
    p.add_argument(
        "--scenario",
        default=None,
        choices=[*SCENARIOS, "all"],
        help="which scenario to run (default: all; 'happy' with a real --model)",
    )
    p.add_argument("--trace-dir", metavar="DIR", help="write <scenario>.jsonl traces here")
    p.add_argument(
        "--db",
        metavar="FILE",
        help="also store every scenario's runs in this SQLite file, replaced on each run "
        "(e.g. traces/demo.db, for fsm-agent serve --db traces/demo.db)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the machine-readable stream: every trace event and a summary per "
        "scenario, one JSON object a line",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print only the final table (with --json: only the summaries)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="stream each run: print the answer and the tool-call arguments as they are "
        "produced (the trace keeps the deltas)",
    )
    add_model_arguments(p)
    p.set_defaults(handler=run_demo)


def _shown(text: str) -> str:
    # A real model's text must not reach the terminal's control sequences raw.
    return "".join(ch if ch.isprintable() or ch in "\n\t" else "\N{REPLACEMENT CHARACTER}"
                   for ch in text)  # fmt: skip


def _ignore(event: Event) -> None:
    return None


class _LivePrinter:
    """``--stream``: the deltas of a run as they arrive, a line per decision (its text,
    then each call's arguments on a line of its own)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.call: tuple[str, int] | None = None
        self.open = False  # a decision's line is being written

    def __call__(self, event: Event) -> None:
        out = sys.stdout
        if isinstance(event, TextDelta):
            self._line(out, self.call is not None)
            self.call = None
            out.write(_shown(event.text))
        elif isinstance(event, ToolArgsDelta):
            if (event.call_id, event.index) != self.call:
                self._line(out, self.open)
                self.call = (event.call_id, event.index)
                out.write(f"\u2192 {event.call_id} ")
            out.write(_shown(event.fragment))
        elif event.type == "decision" and self.open:
            out.write("\n")
            self.open, self.call = False, None
        out.flush()

    def _line(self, out: Any, new: bool) -> None:
        if not self.open:
            out.write(f"[{self.name}] ")
            self.open = True
        elif new:
            out.write(f"\n[{self.name}] ")


def _trace_folder(text: str | None) -> Path | None:
    """``--trace-dir`` as a folder that exists and takes files, or a :class:`UsageError`
    naming the problem (before any scenario runs, so nothing is half written)."""
    if text is None:
        return None
    folder = Path(text)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--trace-dir {text}: not a folder (a file is in the way)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".fsm-agent-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            f"--trace-dir {text}: cannot write there ({exc.strerror or exc})"
        ) from None
    return folder


#: What a file the demo may replace holds: nothing, or only the demo's own runs.
_DEMO_RUN = "demo-"


def _demo_db(text: str | None) -> Path | None:
    """``--db`` as a file the demo may replace: absent, or a SQLite file of demo runs
    only (a :class:`UsageError` otherwise, before any scenario runs: the demo never
    overwrites someone's runs)."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"--db {text}: a folder, not a database file")
    if not path.parent.is_dir():
        raise UsageError(f"--db {text}: the folder {path.parent} does not exist")
    if path.exists():
        from fsm_agent._errors import StoreError

        try:
            foreign = _foreign_runs(path)
        except StoreError as exc:
            raise UsageError(f"--db {text}: not a database the demo wrote ({exc})") from None
        if foreign:
            raise UsageError(
                f"--db {text}: it holds runs that are not the demo's ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); pick another file"
            )
    return path


def _foreign_runs(path: Path) -> list[str]:
    """The runs in ``path`` that are not the demo's. A file an older fsm-agent wrote
    (the last ``make demo`` before an upgrade) is migrated first, as any writable open
    of it would be; anything else that is not this fsm-agent's database is refused."""
    import sqlite3

    from fsm_agent._durable.sqlite import APPLICATION_ID, SCHEMA_VERSION, SqliteStore

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error:
        app_id = version = 0  # not a database at all: the store's open says so
    finally:
        conn.close()
    if app_id == APPLICATION_ID and 0 < version < SCHEMA_VERSION:
        SqliteStore(path, create=False).close()
    with SqliteStore(path, create=False, readonly=True) as old:
        return [r.run_id for r in old.list_runs() if not r.run_id.startswith(_DEMO_RUN)]


def _building(path: Path) -> Path:
    return path.with_name(path.name + ".building")


def _fresh_db(path: Path) -> Any:
    """A new database to fill, holding the old one's API keys (a reviewer's key made
    for the demo's server keeps working after the next ``make demo``)."""
    from fsm_agent._durable.sqlite import SqliteStore

    building = _building(path)
    for leftover in _with_sidecars(building):
        leftover.unlink(missing_ok=True)
    store = SqliteStore(building)
    if path.exists():
        with SqliteStore(path, create=False, readonly=True) as old:
            for record in old.list_keys():
                store.add_key(record)
    return store


def _with_sidecars(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))]


def _replace_db(path: Path) -> None:
    """The new database in the old one's place, at once (a server reading the old one
    keeps its open file until it reopens)."""
    for old in _with_sidecars(path)[1:]:
        old.unlink(missing_ok=True)
    building = _building(path)
    for side in _with_sidecars(building)[1:]:
        side.unlink(missing_ok=True)  # closed cleanly: the WAL is checkpointed in
    os.replace(building, path)


def _notes(results: list[RunResult]) -> list[str]:
    if len(results) < 2:
        return []
    last = results[-1]
    return [
        "a trusted party looked the ticket up and recorded it under the same "
        f"key; the resubmitted request replayed it ({last.status}/{last.reason})"
    ]


def run_demo(args: argparse.Namespace, model: Model | None = None) -> int:
    if model is None and hasattr(args, "model"):  # flags of fsm_agent._cli.model_args
        try:
            model = model_from_args(args)
        except ModelArgsError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 2
    try:
        folder = _trace_folder(args.trace_dir)
        db_path = _demo_db(getattr(args, "db", None))
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    scenario = args.scenario or ("all" if model is None else "happy")
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    as_json = bool(getattr(args, "json", False))
    outcomes = []
    db = _fresh_db(db_path) if db_path is not None else None
    try:
        for name in names:
            live: Callable[[Event], None] | None = None
            if getattr(args, "stream", False):  # printed live unless JSON or quiet
                live = _LivePrinter(name) if not (as_json or args.quiet) else _ignore
            outcome = SCENARIOS[name].run(model=model, trace_dir=folder, on_event=live, db=db)
            outcomes.append(outcome)
            _report(outcome, args, as_json, model)
    finally:
        if db is not None:
            db.close()
    if db_path is not None:
        _replace_db(db_path)
    return _finish(outcomes, names, folder, db_path, as_json)


def _report(
    outcome: ScenarioOutcome, args: argparse.Namespace, as_json: bool, model: Model | None
) -> None:
    if as_json:
        _print_json(outcome, args.quiet)
    elif not args.quiet:
        print(report.scenario_block(SCENARIOS[outcome.name], outcome, scripted=model is None))


def _finish(
    outcomes: list[ScenarioOutcome],
    names: list[str],
    folder: Path | None,
    db_path: Path | None,
    as_json: bool,
) -> int:
    failed = [o.name for o in outcomes if not o.ok]
    if not as_json:
        print(report.final_table(outcomes))
        if folder is not None:
            print(report.where_traces_are(folder, [o.name for o in outcomes]))
        if db_path is not None:
            print(
                f"the runs are in {db_path}: fsm-agent keys add me --scope review --db "
                f"{db_path}, then fsm-agent serve --db {db_path}"
            )
    if failed:
        print(
            f"demo: {len(failed)} scenario(s) did not behave as expected: {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    if as_json:
        print(f"demo: all {len(names)} scenario(s) behaved as expected", file=sys.stderr)
    return 0


def _print_json(outcome: ScenarioOutcome, quiet: bool) -> None:
    name = outcome.name
    if not quiet:
        for result in outcome.results:
            for event in result.events:
                print(json.dumps({"scenario": name, **event}, ensure_ascii=False, default=repr))
    mismatches = {k: {"expected": e, "actual": a} for k, (e, a) in outcome.checks.items() if e != a}
    first = outcome.results[0]
    print(
        json.dumps(
            {
                "type": "summary",
                "scenario": name,
                "ok": outcome.ok,
                "status": first.status,
                "reason": first.reason,
                "checks": {k: a for k, (_, a) in outcome.checks.items()},
                "mismatches": mismatches,
            },
            ensure_ascii=False,
        )
    )
