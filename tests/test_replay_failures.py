"""The text stepper shows why a retry happened: the outcome and error of every failed
attempt, at the failing step and at every later step of the call (issue 23, item 12)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from conftest import Backend, TransientToolError, call, calls, make_runtime, say

from fsm_agent import RetryPolicy
from fsm_agent._cli import main
from fsm_agent._errors import StepError
from fsm_agent._render.replay import MAX_TRACE_BYTES, Replay, describe_step
from fsm_agent._render.stepper import print_steps


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


def test_a_trace_too_large_to_hold_is_refused_before_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 1 GB attack, scaled down: a limit (default 32 MiB) refuses the file by its size,
    with the way out, instead of holding it (about 15x its size) and writing a page no
    browser opens."""
    path = retried(tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    big = tmp_path / "big.jsonl"
    big.write_text(lines[0] + "".join(lines[1:-1]) * 40 + lines[-1], encoding="utf-8")
    size = big.stat().st_size
    page = tmp_path / "view.html"
    limit = str(size - 1)
    assert main(["replay", str(big), "--html", str(page), "--max-trace-bytes", limit]) == 2
    err = capsys.readouterr().err
    assert f"({size} bytes)" in err and "fsm-agent check" in err and "--max-trace-bytes" in err
    assert err.count("\n") == 1 and not page.exists()
    assert main(["replay", str(big), "--max-trace-bytes", limit]) == 2  # the stepper too
    assert main(["replay", str(big), str(path), "--aggregate", "-o", str(tmp_path / "h.dot"),
                 "--max-trace-bytes", limit]) == 2  # fmt: skip
    capsys.readouterr()
    assert main(["replay", str(big), "--html", str(page), "--max-trace-bytes", str(size)]) == 0
    assert page.exists()
    with pytest.raises(StepError, match=r"stops at 0\.0 MiB \(1000 bytes\)"):
        Replay(big, max_bytes=1000)
    assert MAX_TRACE_BYTES == 32 * 1024 * 1024


@pytest.mark.parametrize("bad", ["0", "-5", "1e6", "lots"])
def test_a_bad_limit_is_a_usage_error(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(retried(tmp_path)), "--max-trace-bytes", bad])
    assert exc.value.code == 2 and "a whole number of bytes" in capsys.readouterr().err


def test_failed_attempts_are_those_of_the_current_batch_and_bounded(tmp_path: Path) -> None:
    """Call ids are unique only within a batch: a run reusing ``c1`` in every round (or a
    hostile trace) must not make each step list every earlier failure (it made the viewer
    quadratic: a 10 MB trace took 10 minutes and wrote a 2 GB page)."""
    path = retried(tmp_path)
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    fail = next(e for e in events if e.get("outcome") == "transient")
    decision = next(e for e in events if e["type"] == "decision")
    rounds = [decision, fail] * 50 + [fail] * 30  # the last batch: 31 failures claimed
    replay = Replay(path, events=[events[0], *rounds])
    assert len(replay.failed_attempts(len(replay) - 31)) == 1  # only this batch's
    assert len(replay.failed_attempts(len(replay) - 1)) == 20  # capped
