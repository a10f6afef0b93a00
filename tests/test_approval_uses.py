"""Approvals as effects: a limited approval's use is spent by the store, only for a call
that is about to start, once per (approval, run, call), never past ``max_uses`` across
runs, runtimes, processes and a fleet (issue 18, item 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_valid_run, call, calls, say

from fsm_agent import Approval, Budget, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.loop import start, steps
from fsm_agent._core.requests import ConsumeApproval
from fsm_agent._core.state import RunState
from fsm_agent._durable import review
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import ConfigError
from fsm_agent._trace.checker import check_events
from fsm_agent.testing._scenarios import Mortal, ProcessDied

PAY = {"to": "A", "amount": 10}


class Bank:
    """A write that needs approval (``pay``) and a read (``look``), counting effects."""

    def __init__(self, *, die: Callable[[], None] | None = None) -> None:
        self.paid: list[dict[str, Any]] = []
        self.die = die

    def pay(self, to: str, amount: int) -> dict[str, Any]:
        if self.die is not None:
            die, self.die = self.die, None
            die()  # the process dies while the payment is in flight
        self.paid.append({"to": to, "amount": amount})
        return {"receipt": len(self.paid)}

    def registry(self, *, keyed: bool = False) -> ToolRegistry:
        tools = ToolRegistry()
        tools.register(
            self.pay,
            name="pay",
            effect="write",
            requires_approval=True,
            idempotency_key=(lambda a: f"{a['to']}:{a['amount']}") if keyed else None,
            dedup=keyed,
            schema={
                "type": "object",
                "required": ["to", "amount"],
                "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}},
            },
        )
        tools.register(
            lambda key: {"key": key, "balance": 5},
            name="look",
            effect="read",
            schema={"type": "object", "properties": {"key": {"type": "string"}}},
        )
        return tools


def pays(call_id: str = "c1") -> dict[str, Any]:
    return calls(call(call_id, "pay", **PAY))


def bank_runtime(bank: Bank, store: Any, max_uses: int, **options: Any) -> Runtime:
    return Runtime(
        model=ScriptedModel([]),
        tools=bank.registry(keyed=options.pop("keyed", False)),
        allowed_tools=["pay", "look"],
        approvals=[Approval("pay", PAY, max_uses=max_uses)],
        store=store,
        **options,
    )


def pay_once(rt: Runtime, run_id: str) -> tuple[str | None, str | None]:
    result = rt.run("pay A", run_id=run_id, model=ScriptedModel([pays(), say("paid")]))
    assert_valid_run(result)
    return result.status, result.reason


APPROVAL_ID = Approval("pay", PAY).id


# ── the reproduction (engine-v2 review §2.2) ──────────────────────────────────────


def test_a_batch_refused_by_a_budget_spends_no_approval() -> None:
    bank = Bank()
    store = MemoryStore()
    rt = bank_runtime(bank, store, 1, budget=Budget(max_calls_per_round=1))
    both = calls(call("c1", "pay", **PAY), call("c2", "look", key="B"))
    first = rt.run("pay and look", run_id="r1", model=ScriptedModel([both]))
    assert (first.status, first.reason) == ("budget_exhausted", "calls_per_round")
    assert bank.paid == [] and store.approval_uses(APPROVAL_ID) == 0
    # The single use is still there for the payment that does run.
    assert pay_once(rt, "r2") == ("done", "final_answer")
    assert bank.paid == [PAY] and store.approval_uses(APPROVAL_ID) == 1
    assert pay_once(rt, "r3") == ("review_required", "approval_required")
    assert bank.paid == [PAY]


def test_a_use_is_spent_only_for_a_call_about_to_start() -> None:
    """Driven by hand: admission yields nothing; ``ConsumeApproval`` comes right before the
    payment's ``CallTool``, and its answer is recorded on the dispatch transition."""
    bank = Bank()
    rt = bank_runtime(bank, MemoryStore(), 3)
    s = RunState(run_id="h1", config=rt.config(), messages=[{"role": "user", "content": "x"}])
    start(s)
    loop = steps(s)
    kinds: list[str] = []
    answers: dict[str, Any] = {"ReadClock": 0.0, "AskModel": pays(), "ConsumeApproval": True}
    request = next(loop)
    try:
        while True:
            kind = type(request).__name__
            kinds.append(kind)
            if kind == "ConsumeApproval":
                assert request == ConsumeApproval(APPROVAL_ID, 3, "h1", "c1")
            if kind == "CallTool":
                answer: Any = bank_outcome()
            else:
                answer = answers.get(kind)
            if kind == "AskModel":
                answers["AskModel"] = say("paid")
            request = loop.send(answer)
    except StopIteration:
        pass
    consumed = kinds.index("ConsumeApproval")
    assert kinds[consumed + 1 : consumed + 3] == ["SaveCheckpoint", "CallTool"], kinds
    assert kinds.count("ConsumeApproval") == 1
    (dispatch,) = [e for e in s.events if e.get("trigger") == "dispatch"]
    assert dispatch["approval_use"] == "granted" and dispatch["approval"] == APPROVAL_ID
    assert check_events(s.events) == []


def bank_outcome() -> Any:
    from fsm_agent._core.requests import ToolOutcome

    return ToolOutcome("ok", {"receipt": 1})


def test_a_refused_use_stops_for_approval_and_a_reviewer_can_approve_the_call() -> None:
    bank = Bank()
    store = MemoryStore()
    rt = bank_runtime(bank, store, 1)
    assert pay_once(rt, "r1") == ("done", "final_answer")
    second = rt.run("pay", run_id="r2", model=ScriptedModel([pays(), say("paid")]))
    assert (second.status, second.reason) == ("review_required", "approval_required")
    assert list(second.pending) == ["c1"]
    (dispatch,) = [e for e in second.events if e.get("trigger") == "dispatch"]
    assert dispatch["approval_use"] == "refused" and "approval" not in dispatch
    assert dispatch["guards"]["approval_refused"] is True
    assert bank.paid == [PAY]
    # The reviewer's approval covers that call once, outside the configured uses.
    review.record_review(store, "r2", "c1", "approve")
    after = rt.resume("r2", model=ScriptedModel([say("paid")]))
    assert (after.status, after.reason) == ("done", "final_answer")
    assert bank.paid == [PAY, PAY] and store.approval_uses(APPROVAL_ID) == 1
    assert_valid_run(after)


def test_a_store_without_approval_uses_is_refused_for_limited_approvals() -> None:
    class Plain:
        blocking = False

        def begin_intent(self, *a: Any, **k: Any) -> Any: ...
        def commit_intent(self, *a: Any, **k: Any) -> None: ...
        def abort_intent(self, *a: Any, **k: Any) -> None: ...
        def get_intent(self, *a: Any, **k: Any) -> Any: ...

    with pytest.raises(ConfigError, match="max_uses need a store that counts their uses"):
        bank_runtime(Bank(), Plain(), 1)


# ── across runtimes, processes, a fleet ───────────────────────────────────────────


def test_max_uses_holds_across_two_runtimes_on_one_sqlite_file(tmp_path: Path) -> None:
    bank = Bank()
    path = tmp_path / "runs.db"
    with SqliteStore(path) as one, SqliteStore(path) as two:
        a, b = bank_runtime(bank, one, 2), bank_runtime(bank, two, 2)
        outcomes = [pay_once(rt, f"r{n}") for n, rt in enumerate((a, b, a, b))]
        assert outcomes.count(("done", "final_answer")) == 2
        assert outcomes[2:] == [("review_required", "approval_required")] * 2
        assert len(bank.paid) == 2 and one.approval_uses(APPROVAL_ID) == 2


_WORKER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[3])
    from test_approval_uses import Bank, bank_runtime, pay_once
    from fsm_agent._durable.sqlite import SqliteStore

    with SqliteStore(sys.argv[1], timeout=30.0) as store:
        rt = bank_runtime(Bank(), store, 3)
        print(json.dumps([pay_once(rt, f"{sys.argv[2]}-{n}") for n in range(2)]))
    """
)


def test_max_uses_holds_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    SqliteStore(path).close()  # created (and migrated) once, before the race
    here = str(Path(__file__).parent)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(path), f"p{n}", here],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    outcomes = []
    for w in workers:
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 0
        outcomes += [tuple(o) for o in json.loads(out)]
    assert outcomes.count(("done", "final_answer")) == 3, outcomes
    assert outcomes.count(("review_required", "approval_required")) == 3, outcomes
    with SqliteStore(path) as store:
        assert store.approval_uses(APPROVAL_ID) == 3


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch as often as the interpreter lets them: races show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def race(n: int, work: Callable[[int], Any]) -> list[Any]:
    """``work(i)`` for i in range(n) on n threads released together; their results."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def _memory(tmp_path: Path, pg: Any) -> Callable[[], Any]:
    store = MemoryStore()
    return lambda: store


def _sqlite(tmp_path: Path, pg: Any) -> Callable[[], Any]:
    path = tmp_path / "uses.db"
    SqliteStore(path).close()
    return lambda: SqliteStore(path, timeout=30.0)


@pytest.mark.parametrize("make", [_memory, _sqlite], ids=["memory", "sqlite"])
def test_concurrent_uses_never_pass_max_uses(
    make: Callable[[Path, Any], Callable[[], Any]], tmp_path: Path, fast_switching: None
) -> None:
    stores = make(tmp_path, None)
    assert_race_holds(stores)


def test_concurrent_uses_never_pass_max_uses_on_postgresql(
    pg_server: Any, pg_schema: str, fast_switching: None
) -> None:
    from fsm_agent._durable.postgres import PostgresStore

    PostgresStore(pg_server.dsn, schema=pg_schema).close()
    assert_race_holds(lambda: PostgresStore(pg_server.dsn, schema=pg_schema, pool_size=1))


def assert_race_holds(stores: Callable[[], Any]) -> None:
    opened = [stores() for _ in range(8)]
    granted = race(8, lambda i: [opened[i].consume_approval("config:x", 5, f"r{i}", f"c{k}")
                                 for k in range(2)])  # fmt: skip
    assert sum(sum(g) for g in granted) == 5, granted
    assert opened[0].approval_uses("config:x") == 5
    # Asking again for a call that holds a use grants it and spends nothing.
    holders = [(i, k) for i, g in enumerate(granted) for k, ok in enumerate(g) if ok]
    i, k = holders[0]
    assert opened[3].consume_approval("config:x", 5, f"r{i}", f"c{k}") is True
    assert opened[0].approval_uses("config:x") == 5
    for store in opened:
        if store is not opened[0] and hasattr(store, "close"):
            store.close()
    if hasattr(opened[0], "close"):
        opened[0].close()


def test_max_uses_holds_on_postgresql_with_concurrent_workers(
    pg_server: Any, pg_schema: str, fast_switching: None
) -> None:
    from fsm_agent._durable.postgres import PostgresStore

    PostgresStore(pg_server.dsn, schema=pg_schema).close()
    bank = Bank()
    lock = threading.Lock()
    paid: list[int] = []

    def worker(i: int) -> list[tuple[str | None, str | None]]:
        with PostgresStore(pg_server.dsn, schema=pg_schema, pool_size=2) as store:
            rt = bank_runtime(bank, store, 4)
            got = [pay_once(rt, f"w{i}-{n}") for n in range(2)]
        with lock:
            paid.append(sum(o == ("done", "final_answer") for o in got))
        return got

    outcomes = [o for got in race(6, worker) for o in got]
    assert outcomes.count(("done", "final_answer")) == 4, outcomes
    assert outcomes.count(("review_required", "approval_required")) == 8, outcomes
    assert len(bank.paid) == 4 and sum(paid) == 4
    with PostgresStore(pg_server.dsn, schema=pg_schema) as store:
        assert store.approval_uses(APPROVAL_ID) == 4


# ── a resumed call ────────────────────────────────────────────────────────────────


def test_a_resumed_call_does_not_spend_a_second_use(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    mortal = Mortal(store)

    def die() -> None:
        mortal.kill()
        raise ProcessDied("killed while paying")

    bank = Bank(die=die)
    rt = bank_runtime(bank, store, 2, keyed=True)
    with pytest.raises(ProcessDied):
        rt.run("pay A", run_id="r1", model=ScriptedModel([pays()]))
    assert store.approval_uses(APPROVAL_ID) == 1  # spent before the call started
    mortal.restart()
    # The next process resumes r1 (the dead one's dispatch was never saved): the
    # deduplicating write is dispatched again and asks for its use again: granted, as the
    # use it already holds.
    resumed = rt.resume("r1", model=ScriptedModel([say("paid")]))
    assert (resumed.status, resumed.reason) == ("done", "final_answer")
    assert store.approval_uses(APPROVAL_ID) == 1
    uses = [e.get("approval_use") for e in resumed.events if e.get("trigger") == "dispatch"]
    assert uses == ["granted"]
    assert_valid_run(resumed)
    # So one use is left, for one more run, and then none (a tool without a key: with
    # it, the same payment would replay r1's result and need no use).
    plain = bank_runtime(Bank(), store, 2)
    assert pay_once(plain, "r2") == ("done", "final_answer")
    assert pay_once(plain, "r3") == ("review_required", "approval_required")
    assert store.approval_uses(APPROVAL_ID) == 2
    store.close()
