"""The fleet chaos run: real worker processes on a real PostgreSQL server, real signals.

:func:`chaos` submits runs of every kind (``fleet_app.py``) in waves while 4 worker
processes (``fsm-agent worker``) drive them and reviewer threads approve paused refunds
concurrently; meanwhile it SIGKILLs random workers (starting a replacement each time),
SIGSTOPs others for longer than the lease and then SIGCONTs them (so they wake up holding
runs another worker took over), and restarts the PostgreSQL server once. Then it waits
until nothing is left to drive, stops the fleet, and audits the store against the
side-effect ledger the tools wrote, and runs the real CLI on the traces: ``fsm-agent
check --db`` on every stored run, ``fsm-agent runs export`` then ``fsm-agent check`` on
the exported files of every run that did not simply end ``done`` and a sample of the
rest (all signed with the fleet's ``trace_key``). ``python tests/fleet_chaos.py`` runs
it alone.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet_app

from fsm_agent._core.actions import BLOCKING
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.review import pending_calls, record_review
from fsm_agent._errors import ReviewError, StoreError
from fsm_agent.testing._pgserver import Server

HERE = Path(__file__).resolve().parent
SCHEMA = "chaos"
LEASE_S = 1.5
FINISHED = {"done", "budget_exhausted", "protocol_error", "cancelled"}
KEYED_TOOLS = {"create_ticket": "keyed", "refund": "approval"}
#: Every runtime of the chaos run signs its traces with this key (``fleet_app.py``).
TRACE_KEY = "chaos-fleet-key"
#: Of the runs that ended ``done``, every this-many-th is exported and checked from its
#: file too (each export is a process of its own: all of them would double the run).
EXPORT_EVERY = 8


@dataclass
class Report:
    runs: int = 0
    kills: int = 0
    stalls: int = 0
    restarts: int = 0
    approvals: int = 0
    writes: int = 0  # side effects in the ledger
    duplicates: int = 0  # an idempotent write executed twice for one key
    lost: int = 0  # a write executed but neither recorded nor flagged for review
    phantom: int = 0  # a write recorded as done that never executed
    unsettled: int = 0  # a run neither ended nor waiting for a reviewer
    trace_problems: int = 0  # problems `fsm-agent check` finds in stored traces
    checked: int = 0  # stored runs `fsm-agent check --db` passed
    exported: int = 0  # of them, exported with `fsm-agent runs export` and checked again
    stale_accepted: int = 0  # commits of a fenced (older-epoch) driver found in the store
    fenced: int = 0  # commits the store refused to a worker that had lost its run
    stalled_holding: int = 0  # runs the stalled workers held when they were stopped
    dedup_repeats: int = 0  # extra executions of a dedup write (its downstream dedups)
    states: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def line(self) -> str:
        states = ", ".join(f"{k} {v}" for k, v in sorted(self.states.items()))
        return (
            f"chaos: {self.runs} runs, {self.kills} kills, {self.stalls} stalls past the lease, "
            f"{self.restarts} PostgreSQL restart(s), {self.approvals} concurrent approvals, "
            f"{self.stalled_holding} runs held by stalled workers, "
            f"{self.writes} writes in the ledger; duplicates {self.duplicates}, lost "
            f"{self.lost}, phantom {self.phantom}, unsettled {self.unsettled}, trace problems "
            f"{self.trace_problems} ({self.checked} stored traces checked, {self.exported} "
            f"exported and checked), stale commits accepted {self.stale_accepted} (refused "
            f"{self.fenced}), dedup re-executions {self.dedup_repeats}; ends: {states}; "
            f"{self.seconds:.0f}s"
        )


class Fleet:
    """The worker processes: start, kill, stall, stop."""

    def __init__(self, dsn: str, tmp: Path, ledger: Path, tool_s: float) -> None:
        self.dsn, self.tmp, self.ledger, self.tool_s = dsn, tmp, ledger, tool_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = open(self.tmp / f"worker-{self.started}.log", "wb")  # noqa: SIM115 - the child owns it
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "FSM_LEDGER": str(self.ledger),
            "FSM_TOOL_S": str(self.tool_s),
            "FSM_TRACE_KEY": TRACE_KEY,
        }
        cmd = [sys.executable, "-m", "fsm_agent", "worker", "--db", self.dsn, "--schema", SCHEMA,
               "--app", "fleet_app:make_runtime", "--concurrency", "4", "--lease", str(LEASE_S),
               "--poll", "0.5", "--grace", "5"]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        log.close()
        self.procs.append(proc)
        return proc

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        for p in self.live():
            os.kill(p.pid, signal.SIGCONT)  # a stalled one must be able to hear SIGTERM
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def logs(self) -> str:
        return "".join(f.read_text(errors="replace") for f in sorted(self.tmp.glob("worker-*.log")))


def _resume(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:  # (it may have been killed while stopped)
        os.kill(proc.pid, signal.SIGCONT)


def _wait_until_running(store: PostgresStore, count: int) -> None:
    deadline = time.monotonic() + 60
    while sum(w["state"] == "running" for w in store.fleet()["workers"]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start")
        time.sleep(0.1)


def _held_by_pid(store: PostgresStore) -> dict[int, int]:
    """Runs held under a live lease, by the process id in the owner token."""
    try:
        with store.connection() as conn:
            rows = conn.execute(
                f"SELECT owner FROM {SCHEMA}.runs WHERE owner IS NOT NULL AND lease_until > now()"
            ).fetchall()
    except StoreError:
        return {}
    held: Counter[int] = Counter()
    for (owner,) in rows:
        parts = owner.split("|")
        if len(parts) == 5 and parts[2].isdigit():
            held[int(parts[2])] += 1
    return dict(held)


def _plans(count: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """(run id, kind, key): every kind equally; keyed runs share keys in pairs."""
    out = []
    for i in range(count):
        kind = fleet_app.KINDS[i % len(fleet_app.KINDS)]
        key = f"K{i // 10}" if kind == "keyed" else f"{kind[0]}{i}"
        out.append((f"run-{i:04d}", kind, key))
    rng.shuffle(out)
    return out


def _reviewer(dsn: str, stop: threading.Event, report: Report, lock: threading.Lock) -> None:
    """Approve paused refunds as they appear (two of these race each other)."""
    store = None
    while not stop.is_set():
        try:
            store = store or PostgresStore(dsn, schema=SCHEMA, lease_s=LEASE_S, pool_size=2)
            for summary in store.list_runs("review_required"):
                for p in pending_calls(store.load_run(summary.run_id)):
                    if p["waiting_for"] != "approval_required" or p["review"]:
                        continue
                    try:
                        record_review(store, summary.run_id, p["call_id"], "approve", key=TRACE_KEY)
                    except (ReviewError, StoreError):
                        continue  # the other reviewer was first, or the run is busy
                    with lock:
                        report.approvals += 1
        except StoreError:
            pass  # the server is restarting
        stop.wait(0.2)
    if store is not None:
        store.close()


def _quiet(store: PostgresStore) -> bool:
    """Nothing left to drive, and no refund waiting for an approval."""
    with store.connection() as conn:
        (busy,) = conn.execute(f"SELECT count(*) FROM {SCHEMA}.runs WHERE runnable").fetchone()
    if busy:
        return False
    for summary in store.list_runs("review_required"):
        for p in pending_calls(store.load_run(summary.run_id)):
            if p["waiting_for"] == "approval_required" and not p["review"]:
                return False
    return True


def chaos(tmp: Path, *, runs: int = 240, seed: int | None = None, tool_s: float = 0.05) -> Report:  # noqa: C901 - one scripted scenario
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    report = Report(runs=runs)
    started = time.monotonic()
    ledger = tmp / "ledger.jsonl"
    server = Server.start(own=True)
    fleet = None
    os.environ["FSM_TRACE_KEY"] = TRACE_KEY  # the submitter's runtime signs too
    try:
        store = PostgresStore(server.dsn, schema=SCHEMA, lease_s=LEASE_S, timeout=10)
        submitter = fleet_app.make_runtime(store)
        fleet = Fleet(server.dsn, tmp, ledger, tool_s)
        for _ in range(4):
            fleet.spawn()
        _wait_until_running(store, 4)  # chaos for workers still importing would test little
        stop_reviews = threading.Event()
        lock = threading.Lock()
        reviewers = [
            threading.Thread(target=_reviewer, args=(server.dsn, stop_reviews, report, lock))
            for _ in range(2)
        ]
        for t in reviewers:
            t.start()

        plans = _plans(runs, rng)
        waves = [plans[i : i + 12] for i in range(0, len(plans), 12)]
        # What happens after which wave: kills, stalls and one restart, spread out.
        actions: dict[int, str] = {}
        for n, planned in enumerate(["kill", "stall", "kill", "kill", "stall", "restart", "kill",
                                  "stall", "kill", "kill"]):  # fmt: skip
            actions[1 + n * max(len(waves) // 10, 1)] = planned
        stalled: list[threading.Timer] = []
        stalled_pids: set[int] = set()
        for n, wave in enumerate(waves):
            for run_id, kind, key in wave:
                for _ in range(50):
                    try:
                        submitter.submit(fleet_app.plan(run_id, kind, key), run_id=run_id)
                        break
                    except StoreError:
                        time.sleep(0.2)  # the server is restarting
            time.sleep(0.15)  # mid-wave: the workers are driving these runs now
            what = actions.get(n)
            live = fleet.live()
            # A stalled worker is never a kill's victim: it must wake up holding runs
            # that were taken over, and have its next commit refused.
            killable = [p for p in live if p.pid not in stalled_pids]
            if what == "kill" and killable:
                victim = rng.choice(killable)
                victim.kill()
                victim.wait()
                report.kills += 1
                fleet.spawn()
            elif what == "stall" and live:
                # The worker holding the most runs: it wakes up holding runs another
                # worker took over meanwhile.
                held = _held_by_pid(store)
                victim = max(live, key=lambda p: (held.get(p.pid, 0), rng.random()))
                os.kill(victim.pid, signal.SIGSTOP)
                stalled_pids.add(victim.pid)
                report.stalls += 1
                report.stalled_holding += held.get(victim.pid, 0)
                timer = threading.Timer(LEASE_S * 2.5, _resume, (victim,))
                timer.start()
                stalled.append(timer)
            elif what == "restart" and server.throwaway:
                server.restart()
                report.restarts += 1
            time.sleep(0.35)
        for timer in stalled:
            timer.join()

        deadline = time.monotonic() + 150
        quiet_since = None
        while time.monotonic() < deadline:
            try:
                quiet = _quiet(store)
            except StoreError:
                quiet = False
            if quiet:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > LEASE_S * 2:
                    break
            else:
                quiet_since = None
            time.sleep(0.3)
        stop_reviews.set()
        for t in reviewers:
            t.join()
        fleet.stop()
        _audit(store, ledger, report)
        _check_with_the_cli(server.dsn, tmp, store, report)
        # (from the logs: a worker killed later never reported its counts)
        report.fenced = fleet.logs().count(" (fenced, committed nothing more)")
        store.close()
    except BaseException:
        if fleet is not None:
            print(fleet.logs()[-5000:], file=sys.stderr)
        raise
    finally:
        os.environ.pop("FSM_TRACE_KEY", None)
        if fleet is not None:
            fleet.stop()
        server.stop()
    report.seconds = time.monotonic() - started
    print(f"(seed {seed})", file=sys.stderr)
    return report


def _audit(store: PostgresStore, ledger_path: Path, report: Report) -> None:
    """Check the store against the ledger (see the module docstring of the test)."""
    ledger = fleet_app.ledger(str(ledger_path))
    report.writes = len(ledger)
    executed = Counter((e["tool"], e["key"]) for e in ledger)
    report.duplicates = sum(
        n - 1 for (tool, _), n in executed.items() if tool in KEYED_TOOLS and n > 1
    )
    report.dedup_repeats = sum(n - 1 for (tool, _), n in executed.items() if tool == "charge")

    runs = {r.run_id: store.load_run(r.run_id) for r in store.list_runs()}
    flagged: set[tuple[str, str]] = set()  # (tool, key) of writes a run waits on a reviewer for
    recorded: set[tuple[str, str]] = set()  # (tool, key) of writes a run recorded as done
    for run_id, stored in runs.items():
        body = stored.body
        state = body.get("state", "")
        report.states[state + (f"/{body.get('reason')}" if body.get("reason") else "")] += 1
        settled_review = state == "review_required" and not _runnable_review(body)
        if state not in FINISHED and not settled_review:
            report.unsettled += 1
        report.stale_accepted += _stale_commits(store, run_id)
        plan = json.loads(stored.messages[0]["content"])
        for p in pending_calls(stored):
            if p["waiting_for"] in BLOCKING and p["tool"]:
                flagged.add((p["tool"], _key_of(p["tool"], json.loads(p["arguments"]), plan)))
        for m in stored.messages:
            if m.get("role") == "tool" and m.get("tool_call_id") == "c2":
                content = json.loads(m["content"])
                tool = _tool_of(plan["kind"])
                if (
                    tool
                    and isinstance(content, dict)
                    and content.get("ok", True)
                    and ("error" not in content)
                ):
                    recorded.add((tool, _key_of(tool, {}, plan)))
    for tool, key in executed:
        intent = store.get_intent(tool, key) if tool != "notify" else None
        if intent is not None and intent.status == "committed":
            continue
        if (tool, key) in recorded or (tool, key) in flagged:
            continue
        report.lost += 1
    report.phantom = sum(1 for w in recorded if w not in executed)


def _check_with_the_cli(dsn: str, tmp: Path, store: PostgresStore, report: Report) -> None:
    """Problems ``fsm-agent check`` reports on the stored runs (``--db``) and on the
    files ``fsm-agent runs export`` writes of them; a check that cannot run at all
    counts as one."""
    env = {**os.environ, "FSM_TRACE_KEY": TRACE_KEY}
    db = ["--db", dsn, "--schema", SCHEMA]
    summaries = sorted(store.list_runs(), key=lambda r: r.run_id)
    run_ids = [r.run_id for r in summaries]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fsm_agent", *args], env=env,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip

    def problems(done: subprocess.CompletedProcess[str], expected_ok: int) -> tuple[int, int]:
        """(violations, traces found ok)"""
        found = sum(" violation(s)" in line for line in done.stderr.splitlines())
        ok = sum(line.endswith(": ok") for line in done.stdout.splitlines())
        if done.returncode not in (0, 1) or ok + found != expected_ok:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return max(found, 1), ok
        if found:
            print(done.stdout[-3000:], file=sys.stderr)
        return found, ok

    found, report.checked = problems(
        cli("check", "--key-env", "FSM_TRACE_KEY", *db, *run_ids), len(run_ids)
    )
    exported = []
    for n, r in enumerate(summaries):
        if r.state == "done" and n % EXPORT_EVERY:
            continue
        path = tmp / f"export-{r.run_id}.jsonl"
        done = cli("runs", "export", r.run_id, *db, "-o", str(path))
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            found += 1
            continue
        exported.append(str(path))
    if exported:
        more, report.exported = problems(
            cli("check", "--key-env", "FSM_TRACE_KEY", *exported), len(exported)
        )
        found += more
    report.trace_problems = found


def _runnable_review(body: dict[str, Any]) -> bool:
    from fsm_agent._durable.postgres import runnable

    return runnable(body)


def _tool_of(kind: str) -> str | None:
    return {"keyed": "create_ticket", "unkeyed": "notify", "dedup": "charge",
            "approval": "refund"}.get(kind)  # fmt: skip


def _key_of(tool: str, args: dict[str, Any], plan: dict[str, Any]) -> str:
    if tool == "notify":
        return str(args.get("text") or f"hello from {plan['tag']}")
    return str(plan["key"])


def _stale_commits(store: PostgresStore, run_id: str) -> int:
    """Events of one run whose writer's epoch is older than an earlier event's: a commit
    by a driver that had been fenced off."""
    with store.connection() as conn:
        (n,) = conn.execute(
            f"SELECT count(*) FROM (SELECT epoch, max(epoch) OVER (ORDER BY seq ROWS "
            f"BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM {SCHEMA}.events "
            f"WHERE num = (SELECT num FROM {SCHEMA}.runs WHERE run_id = %s)) e "
            "WHERE e.epoch < e.before",
            [run_id],
        ).fetchone()
    return int(n)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(chaos(Path(d)).line())
