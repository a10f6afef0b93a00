"""Crash safety for real: a child process runs the scenario against a SQLite file and is
killed with SIGKILL at every transition boundary in turn (before and after each
checkpoint commits), just before a write's intent is stored, and inside each write tool
before and after its side effect. The parent then resumes the run to its end (settling
an unknown outcome the way a reviewer would) and checks that no write happened twice,
that none was silently lost, that the history is provider-valid and that the stored
trace is a legal path of the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import durable_scenario as scenario
import pytest

from fsm_agent import RunResult, check_history
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._trace.chain import strip_links
from fsm_agent._trace.checker import check_events

CHILD = Path(__file__).with_name("durable_child.py")
#: Transitions of the scenario's run when nothing goes wrong, and the checkpoints
#: committed among them in transactions of their own (after the run's creation): the
#: unkeyed write's attempt (carrying the keyed write's result, which waited behind) and
#: the end (carrying the unkeyed write's result). (Both batches hold a write, whose
#: intent or attempt carries the batch's checkpoint; the keyed write's checkpoint goes in
#: with its intent, its result is in its idempotency record.)
TRANSITIONS = 15
SAVES = 2


def child(
    tmp: Path, crash: str, mode: str = "start", env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp / "runs.db"), str(tmp / "effects.db"), "r1", mode],
        env={**os.environ, "FSM_CRASH": crash, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_child(tmp: Path, crash: str, mode: str = "start") -> int:
    proc = child(tmp, crash, mode)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err
    return proc.returncode


def _waiting_for(result: RunResult, call_id: str) -> str:
    content = json.loads(result.messages[result.pending[call_id]]["content"])
    return str(content["error"])


def settle(tmp: Path) -> RunResult:
    """Resume in this process; reconcile an unknown outcome as a reviewer would."""
    with SqliteStore(tmp / "runs.db") as store:
        rt = scenario.runtime(store, tmp / "effects.db")
        result = rt.resume("r1")
        for _ in range(3):
            if result.status != "review_required":
                break
            assert result.reason == "outcome_unknown", result.detail
            (unknown,) = [c for c in result.pending if _waiting_for(result, c) == "outcome_unknown"]
            result = rt.reconcile("r1", unknown, {"observed": "by a reviewer"}, resume=True)
        return result


def check_end(tmp: Path, result: RunResult) -> None:
    assert (result.status, result.reason) == ("done", "final_answer"), result.detail
    assert check_history(result.messages) == []
    assert check_events(result.events) == []
    assert check_events(result.events) == []  # what `fsm-agent check` verifies
    with SqliteStore(tmp / "runs.db") as store:  # the store holds exactly that trace
        # Stored events are the trace's chained lines read back: the same events plus
        # their run id and chain link.
        assert strip_links(store.load_run("r1").events) == result.events
    done = Counter(scenario.effects(tmp / "effects.db"))
    assert all(n == 1 for n in done.values()), done  # no write ran twice
    reconciled = {e["call_id"] for e in result.events if e["type"] == "review"}
    for call_id, write in (("c2", ("create_ticket", "R-1")), ("c3", ("notify", "ticket filed"))):
        # every write either ran exactly once or a reviewer settled it: none is lost
        assert done[write] == 1 or call_id in reconciled, (call_id, done, reconciled)


def test_the_scenario_takes_the_expected_number_of_transitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FSM_CRASH", raising=False)
    with scenario.CrashingStore(tmp_path / "runs.db") as store:
        scenario.runtime(store, tmp_path / "effects.db").run("go", run_id="r1")
        assert store.saves == SAVES
    result = settle(tmp_path)
    assert sum(e["type"] == "transition" for e in result.events) == TRANSITIONS
    check_end(tmp_path, result)
    assert Counter(scenario.effects(tmp_path / "effects.db")) == {
        ("create_ticket", "R-1"): 1,
        ("notify", "ticket filed"): 1,
    }


@pytest.mark.parametrize(
    "crash",
    [f"transition:{n}" for n in range(1, TRANSITIONS + 1)]
    + [f"save:{n}" for n in range(1, SAVES + 1)],
)
def test_killed_at_a_transition_boundary_resumes_safely(tmp_path: Path, crash: str) -> None:
    assert run_child(tmp_path, crash) == -signal.SIGKILL
    check_end(tmp_path, settle(tmp_path))


def test_killed_before_a_write_began_runs_it_once_without_review(tmp_path: Path) -> None:
    # Killed just before the keyed write's intent was begun: nothing of the write was
    # stored, so it certainly never started; the resumed run simply runs it.
    assert run_child(tmp_path, "begin") == -signal.SIGKILL
    with SqliteStore(tmp_path / "runs.db") as store:
        result = scenario.runtime(store, tmp_path / "effects.db").resume("r1")
    assert not [e for e in result.events if e["type"] == "review"]
    check_end(tmp_path, result)


@pytest.mark.parametrize(
    "crash", ["create_ticket_before", "create_ticket_after", "notify_before", "notify_after"]
)
def test_killed_inside_a_write_never_runs_it_twice(tmp_path: Path, crash: str) -> None:
    assert run_child(tmp_path, crash) == -signal.SIGKILL
    with SqliteStore(tmp_path / "runs.db") as store:
        rt = scenario.runtime(store, tmp_path / "effects.db")
        first = rt.resume("r1")
    # the write may have happened (for all the store knows): a reviewer must say
    assert (first.status, first.reason) == ("review_required", "outcome_unknown")
    assert check_history(first.messages) == []
    check_end(tmp_path, settle(tmp_path))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("transition:5", "transition:2"),
        ("create_ticket_after", "save:1"),
        # (In the first batch, whose checkpoint rides with its keyed write's intent.)
        ("transition:3", "notify_after"),
    ],
)
def test_killed_again_while_resuming(tmp_path: Path, first: str, second: str) -> None:
    assert run_child(tmp_path, first) == -signal.SIGKILL
    assert run_child(tmp_path, second, mode="resume") == -signal.SIGKILL
    check_end(tmp_path, settle(tmp_path))


def test_two_processes_resuming_one_run_only_one_drives_it(tmp_path: Path) -> None:
    assert run_child(tmp_path, "transition:1") == -signal.SIGKILL
    procs = [child(tmp_path, "", "resume", {"FSM_MODEL_SLEEP": "3"}) for _ in range(2)]
    outcomes: list[Any] = [
        (p.wait(timeout=60), p.stdout.read(), p.stderr.read())  # type: ignore[union-attr]
        for p in procs
    ]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 3], outcomes
    (busy,) = [err for code, _, err in outcomes if code == 3]
    assert "is being driven by" in busy
    check_end(tmp_path, settle(tmp_path))
    assert Counter(scenario.effects(tmp_path / "effects.db")) == {
        ("create_ticket", "R-1"): 1,
        ("notify", "ticket filed"): 1,
    }
