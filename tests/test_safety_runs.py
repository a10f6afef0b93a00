"""Safety promises where real deployments break them (issue "Every safety promise holds"):
container restarts, deploys, hung tools, odd exits, mutating tools, reused approvals,
and what a new user trips over. Each test reproduces a failure 0.1 had."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent import (
    Approval,
    Budget,
    ConfigError,
    JsonlTrace,
    MemoryStore,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    ToolRegistry,
    TransientToolError,
)
from fsm_agent._core.events import Event, Transitioned
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import StoreError
from fsm_agent._runtime.interceptors import Interceptor, observing
from fsm_agent._trace.checker import check_events
from fsm_agent.testing._scenarios import Mortal, ProcessDied

HERE = Path(__file__).resolve().parent
WRITE = {"request_id": "R-1", "title": "refund"}


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def write(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


# ── 2. claims that survive containers ─────────────────────────────────────────────

CHILD = """
import os, sys
sys.path.insert(0, {tests!r})
import durable_scenario as scenario
scenario._die = lambda: os._exit(137)  # PID 1 of a namespace ignores its own SIGKILL
store = scenario.CrashingStore({db!r}, lease_s=float(os.environ.get("FSM_LEASE", "300")))
rt = scenario.runtime(store, scenario.Path({effects!r}))
result = rt.run("go", run_id="r1") if sys.argv[1] == "start" else rt.resume("r1")
print(os.getpid(), result.status, result.reason)
"""


def _as_pid_1(
    tmp: Path, mode: str, crash: str, lease_s: float = 300.0
) -> subprocess.CompletedProcess[str]:
    code = CHILD.format(tests=str(HERE), db=str(tmp / "runs.db"), effects=str(tmp / "fx.db"))
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code, mode],
        env={**os.environ, "FSM_CRASH": crash, "FSM_LEASE": str(lease_s)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a new PID namespace needs root and util-linux's unshare",
)
def test_a_container_that_died_as_pid_1_resumes_after_its_restart(tmp_path: Path) -> None:
    """The restarted container is PID 1 of another PID namespace: it cannot see whether
    the old one lives, so it waits for the lease — and then takes the run over."""
    lease = 6.0
    died = _as_pid_1(tmp_path, "start", "transition:6", lease)
    if died.returncode != 137 and "unshare" in died.stderr:
        pytest.skip(f"unshare refused here: {died.stderr.strip()}")
    assert died.returncode == 137, died.stderr
    crashed = time.monotonic()
    with SqliteStore(tmp_path / "runs.db", readonly=True) as store:
        owner = store._read("SELECT owner FROM runs WHERE run_id = 'r1'")[0][0]
    assert owner.split("|")[2] == "1"  # the dead driver was PID 1, on this very host
    early = _as_pid_1(tmp_path, "resume", "", lease)  # the restarted container: PID 1 again
    if time.monotonic() - crashed < lease - 0.5:  # (a slow machine may be past the lease)
        assert early.returncode != 0 and "RunBusy" in early.stderr, early.stderr
    time.sleep(max(lease - (time.monotonic() - crashed), 0.0) + 0.2)
    again = _as_pid_1(tmp_path, "resume", "", lease)
    assert again.returncode == 0, again.stderr  # not RunBusy: the lapsed claim is taken over
    pid, *status = again.stdout.split()
    assert pid == "1" and status in (
        ["done", "final_answer"],
        ["review_required", "outcome_unknown"],
    )


LIVE_CHILD = """
import os, sys, time
from pathlib import Path
from fsm_agent import Runtime, ToolRegistry
where, ready = sys.argv[1], Path(sys.argv[2])
if where.startswith("postgresql"):
    from fsm_agent._durable.postgres import PostgresStore
    store = PostgresStore(where, schema=sys.argv[3], lease_s=300)
else:
    from fsm_agent._durable.sqlite import SqliteStore
    store = SqliteStore(where)
tools = ToolRegistry()
@tools.tool(schema={"type": "object", "properties": {}}, effect="read")
def hold():
    ready.write_text(str(os.getpid()))
    time.sleep(120)
    return {}
replies = iter([
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "hold", "arguments": "{}"}}]},
    {"role": "assistant", "content": "held"}])
rt = Runtime(model=lambda m, s: next(replies), tools=tools, allowed_tools={"hold"}, store=store)
rt.run("hold it", run_id="r1")
"""


def live_in_another_pid_namespace(tmp: Path, *where: str) -> subprocess.Popen[str]:
    """A healthy driver in a PID namespace of its own on this host (a container with
    host networking: same host name, same boot id), holding run ``r1`` until killed."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a new PID namespace needs root and util-linux's unshare")
    ready = tmp / "ready"
    child = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
         "-c", LIVE_CHILD, where[0], str(ready), *where[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists():
        if child.poll() is not None:
            err = child.stderr.read() if child.stderr else ""
            if "unshare" in err:
                pytest.skip(f"unshare refused here: {err.strip()}")
            raise AssertionError(err)
        assert time.monotonic() < deadline, "the driver in the namespace did not start"
        time.sleep(0.05)
    assert ready.read_text() == "1"  # PID 1 there; on this side, PID 1 is init
    return child


def test_a_live_driver_in_another_pid_namespace_keeps_its_run(tmp_path: Path) -> None:
    from fsm_agent._durable import owners
    from fsm_agent._errors import RunBusy

    child = live_in_another_pid_namespace(tmp_path, str(tmp_path / "runs.db"))
    try:
        with SqliteStore(tmp_path / "runs.db") as store, pytest.raises(RunBusy, match="driven by"):
            store.claim("r1", owners.new_owner())
        assert child.poll() is None  # still driving, untouched
    finally:
        child.kill()
        child.wait()


def test_a_store_error_mid_run_leaves_the_run_resumable_here(tmp_path: Path) -> None:
    b = Backend()
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = make_runtime([calls(call("c1", "lookup", order_id="A")), say("ok")], b, store=store)
        broken = [True]

        def full_disk(real: Any) -> Any:
            def save(*args: Any, **kwargs: Any) -> None:
                if broken[0]:
                    broken[0] = False
                    raise StoreError(f"{store.path}: the disk is full")
                real(*args, **kwargs)

            return save

        # The first checkpoint after the run's creation fails, whichever way it is
        # saved (on its own, behind, or with the claim let go).
        for name in ("save", "save_behind", "save_and_release"):
            setattr(store, name, full_disk(getattr(store, name)))
        with pytest.raises(StoreError, match="disk is full"):
            rt.run("x", run_id="r1")
        # Its own claim did not lock it out, and the store kept its last good checkpoint:
        # the run goes on from there.
        assert rt.resume("r1").status == "done"


# ── 3. a deploy cannot lose a write ───────────────────────────────────────────────


def test_a_write_in_flight_resumed_after_its_tool_was_removed_goes_to_review() -> None:
    store = MemoryStore()
    b = Backend()
    old = make_runtime([calls(call("w1", "write", **WRITE))], b, store=store, keyed=False)
    mortal = Mortal(store)

    class Die(Interceptor):
        def on_event(self, event: Event) -> None:
            if isinstance(event, Transitioned) and event.trigger == "tool_returned":
                mortal.kill()
                raise ProcessDied("killed while the write was in flight")

    try:
        with pytest.raises(ProcessDied), observing(Die()):
            old.run("file it", run_id="r1")
    finally:
        mortal.restart()
    assert len(b.writes) == 1  # the write happened
    tools = ToolRegistry()  # the new deploy has no "write" tool any more
    tools.register(
        b.lookup, name="lookup", effect="read", schema={"type": "object"}, allow_extra_fields=True
    )
    new = Runtime(
        model=ScriptedModel([say("done")]), tools=tools, allowed_tools={"lookup"}, store=store
    )
    resumed = new.resume("r1")
    assert (resumed.status, resumed.reason) == ("review_required", "outcome_unknown")
    assert json.loads(resumed.messages[-1]["content"])["error"] == "outcome_unknown"
    assert len(b.writes) == 1 and check_events(resumed.events) == []


# ── 6. timeouts count from the start ──────────────────────────────────────────────


def test_a_call_that_never_started_never_runs_later() -> None:
    release = threading.Event()
    sent: list[str] = []
    tools = ToolRegistry()
    tools.register(
        lambda key: release.wait(5.0),
        name="hang",
        effect="read",
        timeout_s=0.05,
        schema={"type": "object"},
        allow_extra_fields=True,
    )
    tools.register(
        lambda to: sent.append(to),
        name="transfer",
        effect="write",
        timeout_s=0.05,
        schema={"type": "object"},
        allow_extra_fields=True,
    )
    script = [calls(call("c1", "hang", key="k"), call("c2", "transfer", to="bob")), say("ok")]
    rt = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools={"hang", "transfer"},
        tool_threads=1,
        retry=RetryPolicy(max_attempts=1),
    )
    result = rt.run("x")
    release.set()  # the hung call ends; the queued transfer must not run now either
    time.sleep(0.2)
    answers = {
        m["tool_call_id"]: json.loads(m["content"]) for m in result.messages if m["role"] == "tool"
    }
    assert answers["c1"]["error"] == "timeout"
    assert answers["c2"]["error"] == "not_executed" and sent == []
    assert result.status == "done"  # nothing to review: it certainly did not happen


def test_a_timeout_counts_from_when_the_tool_started() -> None:
    tools = ToolRegistry()

    def slow(key: str) -> dict[str, str]:
        time.sleep(0.2)
        return {"ok": key}

    tools.register(
        slow,
        name="slow",
        effect="read",
        timeout_s=0.5,
        schema={"type": "object"},
        allow_extra_fields=True,
    )
    script = [calls(*[call(f"c{i}", "slow", key=str(i)) for i in range(3)]), say("ok")]
    rt = Runtime(model=ScriptedModel(script), tools=tools, allowed_tools={"slow"})
    result = rt.run("x")  # 3 x 0.2 s in a row, each well inside its own 0.5 s
    assert all(json.loads(m["content"])["ok"] for m in result.messages if m["role"] == "tool")


# ── 7. every exit closes the run ──────────────────────────────────────────────────


class Custom(BaseException):
    pass


@pytest.mark.parametrize(
    "exc",
    [GeneratorExit(), asyncio.CancelledError(), Custom("stop")],
    ids=["GeneratorExit", "CancelledError", "custom BaseException"],
)
def test_any_exit_closes_the_run_before_it_propagates(exc: BaseException) -> None:
    b = Backend()
    b.fail_reads.append(exc)
    rt = make_runtime(
        [calls(call("c1", "lookup", order_id="A"), call("c2", "lookup", order_id="B"))], b
    )
    sink = ListSink()
    with pytest.raises(type(exc)):
        rt.run("x", trace=sink)
    events = sink.events
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "cancelled"
    assert check_events(events) == []
    answered = {e["call_id"] for e in events if e["type"] == "observation"}
    assert answered == {"c1", "c2"}  # every open call answered


# ── 8. no mutation leaks ──────────────────────────────────────────────────────────


def test_a_retry_gets_the_arguments_as_validated_not_as_mutated() -> None:
    seen: list[dict[str, Any]] = []
    tools = ToolRegistry()

    def lookup(**arguments: Any) -> Any:
        seen.append(dict(arguments))
        if len(seen) == 1:
            arguments["key"] = "MUTATED"  # a tool that scribbles on its arguments...
            raise TransientToolError("busy")
        return {"found": arguments["key"]}

    tools.register(
        lookup, name="lookup", effect="read", schema={"type": "object"}, allow_extra_fields=True
    )
    script = [calls(call("c1", "lookup", key="A17")), say("ok")]
    rt = Runtime(
        model=ScriptedModel(script), tools=tools, allowed_tools={"lookup"}, sleep=lambda s: None
    )
    result = rt.run("x")
    assert seen == [{"key": "A17"}, {"key": "A17"}]  # ...the retry does not see it
    assert json.loads(result.messages[2]["content"])["value"] == {"found": "A17"}


def test_a_tool_that_mutates_nested_arguments_changes_neither_calls_nor_the_trace(
    tmp_path: Path,
) -> None:
    """The first attempt gets a copy too: a tool appending to a list it was passed once
    changed the call's own arguments, so a rule reading ``calls`` denied the next call on
    what the model never sent, and ``check`` (replaying the recorded arguments) rejected
    the honest trace of that run."""
    from fsm_agent import Rule
    from fsm_agent._trace.checker import check_trace

    seen: list[Any] = []
    tools = ToolRegistry()

    def tag(items: list[str], meta: dict[str, Any]) -> Any:
        seen.append(list(items))
        items.append("MUTATED")  # scribbles on what it was given
        meta["x"] = 1
        return {"n": len(items)}

    tools.register(tag, name="tag", effect="read", schema={"type": "object"},
                   allow_extra_fields=True)  # fmt: skip
    scribbled = "calls.exists(c, 'MUTATED' in c.args.items || 'x' in c.args.meta)"
    rule = Rule("no-mutated", on="before_tool", tools=["tag"], then="deny", when=scribbled)
    script = [calls(call("a", "tag", items=["x"], meta={})),
              calls(call("b", "tag", items=["y"], meta={})), say("ok")]  # fmt: skip
    result = Runtime(model=ScriptedModel(script), tools=tools, allowed_tools={"tag"},
                     rules=[rule]).run("x", trace=tmp_path / "t.jsonl")  # fmt: skip
    assert result.status == "done" and seen == [["x"], ["y"]]
    verdicts = [(e["call_id"], e["verdict"]) for e in result.events if e["type"] == "rule"]
    assert verdicts == [("a", "pass"), ("b", "pass")]
    report = check_trace(tmp_path / "t.jsonl")
    assert report.ok, report.violations


def test_a_replay_returns_what_was_stored_not_what_the_tool_changed_later() -> None:
    kept: dict[str, Any] = {"ticket": "T-1", "notes": []}
    tools = ToolRegistry()
    tools.register(
        lambda request_id, title: kept,
        name="write",
        effect="write",
        idempotency_key=lambda a: a["request_id"],
        schema={"type": "object"},
        allow_extra_fields=True,
    )
    store = MemoryStore()
    rt = Runtime(
        model=ScriptedModel([calls(call("w1", "write", **WRITE)), say("ok")]),
        tools=tools,
        allowed_tools={"write"},
        store=store,
    )
    first = rt.run("x")
    kept["notes"].append("changed after it returned")
    again = rt.run("x", model=ScriptedModel([calls(call("w2", "write", **WRITE)), say("ok")]))
    replayed = json.loads(again.messages[2]["content"])
    assert replayed["replayed"] is True and replayed["value"] == {"ticket": "T-1", "notes": []}
    recorded = next(e for e in first.events if e["type"] == "observation")
    assert recorded["result"]["value"]["notes"] == []  # the trace kept a copy too


# ── 9. an approval covers what it says ────────────────────────────────────────────


def test_a_reviewers_approval_covers_that_call_once() -> None:
    b = Backend()

    def transfer(call_id: str) -> dict[str, Any]:  # the same payload each time
        return call(call_id, "write", **WRITE)

    script = [calls(transfer("c1")), calls(transfer("c2")), calls(transfer("c3")), say("ok")]
    rt = make_runtime(script, b, approval=True, keyed=False)
    paused = rt.run("x", run_id="r1")
    assert (paused.status, paused.reason) == ("review_required", "approval_required")
    after = rt.approve("r1", "c1", resume=True)
    assert (after.status, after.reason) == ("review_required", "approval_required")
    assert len(b.writes) == 1  # c1 ran; c2, same payload, needs its own approval
    (consumed,) = [e["approval"] for e in after.events if e.get("approval")]
    assert consumed == "review:c1"


def test_a_configured_approval_with_max_uses_covers_that_many_calls() -> None:
    b = Backend()
    script = [calls(call("c1", "write", **WRITE)), calls(call("c2", "write", **WRITE)), say("ok")]
    rt = make_runtime(
        script, b, approval=True, keyed=False, approvals=[Approval("write", WRITE, max_uses=1)]
    )
    result = rt.run("x")
    assert (result.status, result.reason) == ("review_required", "approval_required")
    assert len(b.writes) == 1
    (consumed,) = [e["approval"] for e in result.events if e.get("approval")]
    assert consumed == Approval("write", WRITE).id
    header = result.events[0]["approvals"]
    assert header == [{"tool": "write", "digest": Approval("write", WRITE).digest, "max_uses": 1}]


# ── 12. what a new user trips over ────────────────────────────────────────────────


def test_a_trace_file_holds_one_run(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    make_runtime([say("one")]).run("x", trace=path)
    with pytest.raises(ConfigError, match="the trace file exists; one file holds one run"):
        make_runtime([say("two")]).run("x", trace=path)
    assert check_events([json.loads(line) for line in path.read_text().splitlines()]) == []
    sink = JsonlTrace(path, append=True)  # appending only when asked
    sink.close()


@pytest.mark.parametrize("budget", [Budget(max_cost=1.0), Budget(max_tokens=1000)])
def test_a_reply_without_usage_never_slips_past_a_budget(budget: Budget) -> None:
    result = make_runtime([say("free?")], budget=budget).run("x")
    assert (result.status, result.reason) == ("budget_exhausted", "usage_unknown")


def test_the_cause_of_a_retry_is_in_the_trace() -> None:
    b = Backend()
    b.fail_reads.append(TransientToolError("index rebuilding"))
    result = make_runtime([calls(call("c1", "lookup", order_id="A")), say("ok")], b).run("x")
    (retry,) = [e for e in result.events if e.get("dest") == "retry_wait"]
    assert retry["error"] == "TransientToolError: index rebuilding"
