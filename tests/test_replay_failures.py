"""The text stepper shows why a retry happened: the outcome and error of every failed
attempt, at the failing step and at every later step of the call (issue 23, item 12)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from conftest import Backend, TransientToolError, call, calls, make_runtime, say

from fsm_agent import RetryPolicy
from fsm_agent.cli import main
from fsm_agent.render.replay import Replay, describe_step
from fsm_agent.render.stepper import print_steps


def retried(tmp_path: Path) -> Path:
    backend = Backend()
    backend.fail_reads = [TransientToolError("CRM returned 503"), TimeoutError("slow CRM")]
    result = make_runtime(
        [calls(call("c1", "lookup", order_id="A17")), say("In transit.")],
        backend,
        retry=RetryPolicy(max_attempts=3, backoff_s=0),
    ).run("Where is A17?")
    assert result.status == "done"
    path = tmp_path / "retries.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in result.events), encoding="utf-8")
    return path


def test_the_failing_step_names_its_outcome_and_error(tmp_path: Path) -> None:
    replay = Replay(retried(tmp_path))
    n = next(
        i
        for i, e in enumerate(replay.events)
        if e.get("trigger") == "tool_returned" and e.get("outcome") != "ok"
    )
    lines = describe_step(replay, n)
    assert "attempt 1 transient: TransientToolError: CRM returned 503" in lines[0]
    assert "  outcome: transient: TransientToolError: CRM returned 503" in lines


def test_later_steps_of_the_call_list_every_failed_attempt(tmp_path: Path) -> None:
    replay = Replay(retried(tmp_path))
    n = next(i for i, e in enumerate(replay.events) if e["type"] == "observation")
    text = "\n".join(describe_step(replay, n))
    assert "failed attempts of c1:" in text
    assert "#1 transient: TransientToolError: CRM returned 503" in text
    assert "#2 timeout" in text and "slow CRM" in text
    assert [f["attempt"] for f in replay.failed_attempts(n)] == [1, 2]
    assert replay.failed_attempts(0) == []  # the header concerns no call


def test_the_printed_steps_carry_them(tmp_path: Path, capsys: object) -> None:
    path = retried(tmp_path)
    out = io.StringIO()
    print_steps(Replay(path), out)
    assert out.getvalue().count("TransientToolError: CRM returned 503") >= 3
    assert main(["replay", str(path)]) == 0  # not a TTY: the same text on stdout
