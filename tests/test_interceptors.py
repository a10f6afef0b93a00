"""Interceptors: one seam around every request a driver performs and every event.

What is proven here: an interceptor sees every request kind and every event, each event
before the next request is performed; one that raises (before ``call_next``, after it, or
in ``on_event``) is logged and counted and the run is exactly the run without it, for
every request kind, sync and async; a ``BaseException`` it raises is a crash; and
``ToolFaults`` fails a tool's calls without touching the tool.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Interceptor, RetryPolicy, Runtime, ToolRegistry
from fsm_agent._core.events import Event, RunEnded, RunStarted, Transitioned
from fsm_agent._core.requests import (
    AskModel,
    CallTool,
    EmitEvents,
    Request,
    SaveCheckpoint,
    Sleep,
    ToolOutcome,
)
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._runtime.interceptors import AsyncCallNext, CallNext
from fsm_agent._runtime.result import RunResult
from fsm_agent.models._scripted import ScriptedModel
from fsm_agent.testing import FaultyTools, ProcessDied, ToolFaults, answer, call, decide
from fsm_agent.testing._scenarios import Mortal, scripted_runtime

EVERY_KIND = {
    "ReadClock",
    "AskModel",
    "CallTool",
    "Sleep",
    "EmitEvents",
    "SaveCheckpoint",
    "BeginIntent",
    "CommitIntent",
    "AbortIntent",
    "LoadIntent",
}


class RaisesBefore(Interceptor):
    """Raises before ``call_next`` on every request, and in every ``on_event``."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.events = 0

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        self.kinds.add(type(request).__name__)
        raise RuntimeError(f"broken before {type(request).__name__}")

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        self.kinds.add(type(request).__name__)
        raise RuntimeError(f"broken before {type(request).__name__}")

    def on_event(self, event: Event) -> None:
        self.events += 1
        raise ValueError(f"broken on {event.type}")


class RaisesAfter(Interceptor):
    """Performs every request, then raises (the answer must still reach the loop)."""

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        call_next(request)
        raise RuntimeError("broken after")

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        await call_next(request)
        raise RuntimeError("broken after")


@dataclass
class DieAfterWrite(Interceptor):
    """The process dies right after the write of ``key`` ran (its store dies first)."""

    key: str
    mortal: Mortal

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        return self.after(request, call_next(request))

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        return self.after(request, await call_next(request))

    def after(self, request: Request, outcome: Any) -> Any:
        if isinstance(request, CallTool) and request.arguments.get("key") == self.key:
            self.mortal.kill()
            raise ProcessDied(f"died after {self.key} ran")
        return outcome


@dataclass
class World:
    results: list[RunResult]
    kit: FaultyTools
    errors: int
    trace: bytes
    runtimes: list[Runtime] = field(default_factory=list)


def world(tmp: Path, extra: Callable[[], list[Any]], *, use_async: bool = False) -> World:
    """Two runs over one store that make every kind of request: a read retried after a
    transient failure (Sleep), a keyed write refused (BeginIntent, AbortIntent) and one
    that succeeds (CommitIntent), a trace file (EmitEvents), checkpoints; then a keyed
    write the process dies after, resumed (LoadIntent)."""
    tmp.mkdir()
    kit = FaultyTools()
    kit.read("lookup", faults=["transient"])
    kit.write("ticket", faults=["rejected"], idempotent=True)
    store = MemoryStore()
    mortal = Mortal(store)
    retry = RetryPolicy(max_attempts=2, backoff_s=0.5)
    first = [
        decide(call("lookup", {"q": "A17"}), call("ticket", {"key": "K1"})),
        decide(call("ticket", {"key": "K2"})),
        answer("filed"),
    ]
    rt1 = scripted_runtime(kit, first, store=store, retry=retry, interceptors=extra())
    if use_async:
        results = [asyncio.run(rt1.arun("go", run_id="r1", trace=tmp / "r1.jsonl"))]
    else:
        results = [rt1.run("go", run_id="r1", trace=tmp / "r1.jsonl")]
    second = [decide(call("ticket", {"key": "K3"})), answer("filed")]
    rt2 = scripted_runtime(
        kit, second, store=store, retry=retry, interceptors=[DieAfterWrite("K3", mortal), *extra()]
    )
    with pytest.raises(ProcessDied):
        asyncio.run(rt2.arun("go", run_id="r2")) if use_async else rt2.run("go", run_id="r2")
    mortal.restart()
    rt3 = scripted_runtime(kit, [answer("done")], store=store, retry=retry, interceptors=extra())
    results.append(asyncio.run(rt3.aresume("r2")) if use_async else rt3.resume("r2"))
    runtimes = [rt1, rt2, rt3]
    errors = sum(r.interceptor_errors for r in runtimes)
    return World(results, kit, errors, (tmp / "r1.jsonl").read_bytes(), runtimes)


def same_runs(a: World, b: World) -> None:
    for x, y in zip(a.results, b.results, strict=True):
        assert (x.status, x.reason, x.detail) == (y.status, y.reason, y.detail)
        assert x.events == y.events and x.messages == y.messages and x.counters == y.counters
    assert a.kit.effects == b.kit.effects
    assert [t.attempts for t in a.kit.tools.values()] == [t.attempts for t in b.kit.tools.values()]
    assert a.trace == b.trace  # the trace file, byte for byte


@pytest.mark.parametrize("use_async", [False, True], ids=["run", "arun"])
def test_a_raising_interceptor_never_changes_a_run_for_any_request_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, use_async: bool
) -> None:
    baseline = world(tmp_path / "plain", list, use_async=use_async)
    broken: list[RaisesBefore] = []

    def raising() -> list[Any]:
        broken.append(RaisesBefore())
        return [broken[-1], RaisesAfter()]

    with caplog.at_level(logging.ERROR, logger="fsm_agent"):
        faulty = world(tmp_path / "broken", raising, use_async=use_async)
    same_runs(baseline, faulty)
    assert set().union(*(b.kinds for b in broken)) == EVERY_KIND
    # Every failure was logged on "fsm_agent" and counted on its runtime.
    logged = [r for r in caplog.records if r.name == "fsm_agent" and "interceptor" in r.message]
    assert faulty.errors == len(logged) > 0
    assert sum(b.events for b in broken) > 0
    assert {"RaisesBefore", "RaisesAfter"} <= {r.args[0] for r in logged if r.args}  # type: ignore[index]
    assert baseline.errors == 0


def test_an_async_raising_interceptor_never_changes_a_run(tmp_path: Path) -> None:
    def arun(extra: list[Any]) -> tuple[RunResult, FaultyTools, Runtime]:
        kit = FaultyTools()
        kit.read("lookup", faults=["transient"])
        kit.write("ticket", idempotent=True)
        script = [
            decide(call("lookup", {"q": "A17"}), call("ticket", {"key": "K1"})),
            answer("filed"),
        ]
        rt = scripted_runtime(kit, script, retry=RetryPolicy(max_attempts=2, backoff_s=0.5),
                              interceptors=extra)  # fmt: skip
        return asyncio.run(rt.arun("go", run_id="a1")), kit, rt

    plain, plain_kit, _ = arun([])
    broken = RaisesBefore()
    faulty, faulty_kit, rt = arun([broken, RaisesAfter()])
    assert faulty.events == plain.events and faulty.messages == plain.messages
    assert faulty_kit.effects == plain_kit.effects
    assert {"AskModel", "CallTool", "Sleep", "EmitEvents", "SaveCheckpoint"} <= broken.kinds
    assert {"BeginIntent", "CommitIntent", "ReadClock"} <= broken.kinds
    assert rt.interceptor_errors > 0


class Live(Interceptor):
    """Checks, at every request, that it has every event the request depends on."""

    def __init__(self) -> None:
        self.seen: list[Event] = []
        self.checked: list[str] = []

    def on_event(self, event: Event) -> None:
        self.seen.append(event)

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        last = self.seen[-1] if self.seen else None
        if isinstance(request, SaveCheckpoint):  # every event it stores was seen first
            assert all(e["seq"] <= self.seen[-1].seq for e in request.events)
        if isinstance(request, CallTool):  # the dispatch of this very call
            assert isinstance(last, Transitioned) and last.trigger == "dispatch"
            assert last.call_id == request.call_id
        if isinstance(request, AskModel):
            assert isinstance(last, (RunStarted, Transitioned))
            assert isinstance(last, RunStarted) or last.dest == "deciding"
        if isinstance(request, Sleep):
            assert isinstance(last, Transitioned) and last.dest == "retry_wait"
        self.checked.append(type(request).__name__)
        return call_next(request)


def test_an_interceptor_has_each_event_before_the_next_request_is_performed() -> None:
    live = Live()
    kit = FaultyTools()
    kit.read("lookup", faults=["transient"])
    kit.write("ticket", idempotent=True)
    script = [decide(call("lookup", {"q": "A"}), call("ticket", {"key": "K"})), answer("ok")]
    rt = scripted_runtime(kit, script, retry=RetryPolicy(max_attempts=2, backoff_s=0.5),
                          interceptors=[live])  # fmt: skip
    result = rt.run("go")
    assert {"AskModel", "CallTool", "Sleep", "SaveCheckpoint"} <= set(live.checked)
    assert [e.to_json() for e in live.seen] == result.events  # each once, in order
    assert isinstance(live.seen[-1], RunEnded) and live.seen[-1].run_id == result.run_id


def test_an_interceptor_sees_events_as_recorded_after_redaction() -> None:
    live = Live()
    kit = FaultyTools()
    kit.read("lookup")

    def redact(event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] == "observation":
            return {**event, "result": "[redacted]"}
        return event

    script = [decide(call("lookup", {"q": "A"})), answer("ok")]
    result = scripted_runtime(kit, script, interceptors=[live], redact=redact).run("go")
    observed = [e.to_json() for e in live.seen if e.type == "observation"]
    assert observed and all(e["result"] == "[redacted]" for e in observed)
    assert [e.to_json() for e in live.seen] == result.events


def test_a_base_exception_from_an_interceptor_is_a_crash_the_run_stops_at() -> None:
    class Crash(Interceptor):
        def intercept(self, request: Request, call_next: CallNext) -> Any:
            if isinstance(request, CallTool):
                raise ProcessDied("the process died as the tool was called")
            return call_next(request)

    kit = FaultyTools()
    lookup = kit.read("lookup")
    rt = scripted_runtime(kit, [decide(call("lookup", {"q": "A"})), answer("ok")],
                          interceptors=[Crash()])  # fmt: skip
    with pytest.raises(ProcessDied):
        rt.run("go", run_id="c1")
    assert lookup.attempts == 0 and rt.interceptor_errors == 0
    stored = rt.store.load_run("c1")  # type: ignore[attr-defined]
    assert stored.events[-1]["type"] == "run_end"  # the run closed itself as it stopped
    assert stored.events[-1]["reason"] == "cancelled"


def test_an_interceptor_may_change_an_answer_on_purpose() -> None:
    class Refuse(Interceptor):
        def intercept(self, request: Request, call_next: CallNext) -> Any:
            if isinstance(request, CallTool):
                return ToolOutcome("rejected", error="refused by policy")
            return call_next(request)

    kit = FaultyTools()
    lookup = kit.read("lookup")
    result = scripted_runtime(kit, [decide(call("lookup", {"q": "A"})), answer("ok")],
                              interceptors=[Refuse()]).run("go")  # fmt: skip
    assert lookup.attempts == 0 and result.status == "done"
    observation = next(e for e in result.events if e["type"] == "observation")
    assert observation["result"]["error"] == "rejected"


def test_a_failure_of_the_request_itself_propagates_through_interceptors() -> None:
    class Passes(Interceptor):
        def __init__(self) -> None:
            self.kinds: list[str] = []

        def intercept(self, request: Request, call_next: CallNext) -> Any:
            self.kinds.append(type(request).__name__)
            try:
                return call_next(request)
            except KeyboardInterrupt:
                raise RuntimeError("an interceptor's own error, raised while handling") from None

    kit = FaultyTools()
    kit.read("lookup", faults=["interrupt"])
    passes = Passes()
    rt = scripted_runtime(kit, [decide(call("lookup", {"q": "A"})), answer("ok")],
                          interceptors=[passes])  # fmt: skip
    with pytest.raises(KeyboardInterrupt):  # the tool's Ctrl-C, not the interceptor's error
        rt.run("go")
    assert "CallTool" in passes.kinds and rt.interceptor_errors == 1


def test_tool_faults_fail_a_real_tool_without_touching_it() -> None:
    effects: list[str] = []

    def search(q: str) -> list[str]:
        return [f"result for {q}"]

    def create_ticket(key: str) -> dict[str, str]:
        effects.append(key)
        return {"ticket": key}

    tools = ToolRegistry()
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    tools.register(search, name="search", effect="read", schema=schema)
    schema = {"type": "object", "properties": {"key": {"type": "string"}}}
    tools.register(create_ticket, name="create_ticket", effect="write", schema=schema)
    faults = ToolFaults({"search": ["transient"], "create_ticket": ["error_after_effect"]})
    script = [decide(call("search", {"q": "A17"}), call("create_ticket", {"key": "T1"})),
              answer("ok")]  # fmt: skip
    rt = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools={"search", "create_ticket"},
        retry=RetryPolicy(max_attempts=3, backoff_s=0.0),
        interceptors=[faults],
    )
    result = rt.run("file it")
    # transient: the search never ran and is retried; error_after_effect: the write ran,
    # then failed as far as the run can tell (a write that may have happened: review).
    assert faults.calls == [
        ("search", "transient"),
        ("search", "ok"),
        ("create_ticket", "error_after_effect"),
    ]
    assert effects == ["T1"] and result.counters["retries"] == 1
    assert (result.status, result.reason) == ("review_required", "outcome_unknown")


def test_tool_faults_refuse_an_unknown_behaviour_precisely() -> None:
    with pytest.raises(ValueError, match="tool 'x': unknown behaviours \\['explode'\\]"):
        ToolFaults({"x": ["explode"]})


def test_a_run_without_interceptors_asks_for_no_emits() -> None:
    seen: list[str] = []

    class Counts(Interceptor):
        def intercept(self, request: Request, call_next: CallNext) -> Any:
            seen.append(type(request).__name__)
            return call_next(request)

    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "A"})), answer("ok")]
    # In a context of its own: under --fsm-coverage the plugin's coverage watches every run
    # of the session's context, and a watcher is a consumer.
    contextvars.Context().run(scripted_runtime(kit, script, interceptors=[Counts()]).run, "go")
    assert "EmitEvents" not in seen  # no consumer of events: none emitted
    assert isinstance(EmitEvents([]), EmitEvents)


@pytest.mark.parametrize(
    ("interceptors", "message"),
    [
        ("timing", "interceptors must be a list of interceptor objects, got 'timing'"),
        ([42], "interceptors[0] (int) has none of intercept, aintercept, on_event"),
    ],
)
def test_a_bad_interceptor_is_a_config_error_naming_it(interceptors: Any, message: str) -> None:
    from fsm_agent import ConfigError

    kit = FaultyTools()
    kit.read("lookup")
    with pytest.raises(ConfigError) as caught:
        scripted_runtime(kit, [answer("ok")], interceptors=interceptors)
    assert message in str(caught.value)


def test_an_async_intercept_is_refused_with_the_name_to_use() -> None:
    from fsm_agent import ConfigError

    class Wrong(Interceptor):
        async def intercept(self, request: Request, call_next: Any) -> Any:
            return await call_next(request)

    kit = FaultyTools()
    kit.read("lookup")
    with pytest.raises(ConfigError, match="intercept is an async def; name it aintercept"):
        scripted_runtime(kit, [answer("ok")], interceptors=[Wrong()])


def test_interceptors_belong_to_their_runtime_and_observing_to_its_context() -> None:
    import fsm_agent._core.engine as engine
    from fsm_agent._runtime.interceptors import observing

    assert not hasattr(engine, "TRANSITION_LISTENERS")  # no process-global hook is left

    class Seen(Interceptor):
        def __init__(self) -> None:
            self.runs: set[str] = set()

        def on_event(self, event: Event) -> None:
            self.runs.add(event.run_id)

    mine, ambient = Seen(), Seen()
    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "A"})), answer("ok")]
    watched = scripted_runtime(kit, script, interceptors=[mine])
    other = scripted_runtime(kit, script)
    watched.run("go", run_id="w1")
    other.run("go", run_id="o1")
    with observing(ambient):
        other.run("go", run_id="o2")
    other.run("go", run_id="o3")
    assert mine.runs == {"w1"} and ambient.runs == {"o2"}


def test_a_sink_that_fails_stops_the_run_and_interceptors_still_see_it_end() -> None:
    class BrokenDisk:
        def __init__(self) -> None:
            self.written: list[dict[str, Any]] = []

        def write(self, event: dict[str, Any]) -> None:
            if event["type"] == "observation":
                raise OSError("No space left on device")
            self.written.append(event)

        def close(self) -> None:
            pass

    live = Live()
    kit = FaultyTools()
    kit.read("lookup")
    disk = BrokenDisk()
    rt = scripted_runtime(kit, [decide(call("lookup", {"q": "A"})), answer("ok")],
                          interceptors=[live])  # fmt: skip
    with pytest.raises(OSError, match="No space left"):
        rt.run("go", run_id="d1", trace=disk)
    assert disk.written and all(e["type"] != "observation" for e in disk.written)
    # The sink is not written again; the interceptor saw the run to its end.
    assert isinstance(live.seen[-1], RunEnded) and live.seen[-1].reason == "cancelled"
    stored = rt.store.load_run("d1")  # type: ignore[attr-defined]
    assert [e.to_json() for e in live.seen] == [
        {k: v for k, v in e.items() if k not in ("run", "chain")} for e in stored.events
    ]


def test_an_interceptor_is_called_only_for_the_request_types_it_names() -> None:
    seen: dict[str, list[str]] = {"all": [], "some": [], "async": []}

    class All(Interceptor):
        def intercept(self, request: Request, call_next: CallNext) -> Any:
            seen["all"].append(type(request).__name__)
            return call_next(request)

    class Some(Interceptor):
        requests = (AskModel, CallTool)

        def intercept(self, request: Request, call_next: CallNext) -> Any:
            seen["some"].append(type(request).__name__)
            return call_next(request)

        async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
            seen["async"].append(type(request).__name__)
            return await call_next(request)

        def on_event(self, event: Event) -> None:  # a watcher: the run emits events
            return None

    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "A"})), answer("ok")]
    rt = scripted_runtime(kit, script, interceptors=[All(), Some()])
    assert rt.run("go").status == "done"
    assert {"EmitEvents", "ReadClock"} <= set(seen["all"])
    assert seen["some"] == ["AskModel", "CallTool", "AskModel"]
    rt = scripted_runtime(kit, script, interceptors=[Some()])
    assert asyncio.run(rt.arun("go")).status == "done"
    assert seen["async"] == ["AskModel", "CallTool", "AskModel"]


def test_requests_that_are_no_tuple_of_classes_is_a_config_error() -> None:
    from fsm_agent import ConfigError

    class Wrong(Interceptor):
        requests = ("AskModel",)  # type: ignore[assignment]

        def intercept(self, request: Request, call_next: CallNext) -> Any:
            return call_next(request)

    with pytest.raises(ConfigError, match=r"interceptors\[0\] \(Wrong\): requests must be None"):
        scripted_runtime(FaultyTools(), [answer("ok")], interceptors=[Wrong()])
