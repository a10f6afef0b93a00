"""The machine is a value: a runtime fires the machine it is given, records its hash, and
resumes a stored run under the machine that run was checkpointed by (issue 18, item 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, call, calls, edges, make_runtime, say
from machine_app import ONE_ROUND, STRICT

from fsm_agent._cli import main
from fsm_agent._core.engine import RUN_MACHINE, compile_machine, engine_of
from fsm_agent._core.table import DEFAULT_MACHINE, MACHINE_HASH, TRANSITIONS, Machine, Transition
from fsm_agent._errors import ConfigError, MachineMismatch, TraceError
from fsm_agent.testing._assertions import assert_history_valid

WRITE = {"request_id": "R-1", "title": "A17 is late"}
SCRIPT = [calls(call("c1", "write", **WRITE), call("c2", "lookup", order_id="A")), say("Filed.")]


def test_the_default_machine_hash_is_pinned() -> None:
    # Every stored run and trace names this hash: a change here strands them unless the
    # old table stays known (Runtime(machines=[...])). Change it knowingly, never by accident.
    assert DEFAULT_MACHINE.hash == MACHINE_HASH == "sha256:2d0993b3a44e38dd"
    assert DEFAULT_MACHINE.transitions is TRANSITIONS
    assert Machine.of(t for t in TRANSITIONS) == DEFAULT_MACHINE  # the definition, not identity


def test_an_extended_machine_puts_its_row_before_the_fallback() -> None:
    group = STRICT.edges_from("observing", "observe")
    assert [t.key for t in group[-2:]] == [ONE_ROUND.key, "observe/observing->deciding"]
    assert group[-2].rank == (len(group) - 1, len(group))
    assert [t.index for t in STRICT.transitions] == list(range(len(TRANSITIONS) + 1))
    assert STRICT.hash != MACHINE_HASH and STRICT.hash.startswith("sha256:")
    # One shared `transitions` machine per machine value, built once.
    assert engine_of(STRICT) is engine_of(STRICT) and engine_of(DEFAULT_MACHINE) is RUN_MACHINE


def test_a_runtime_fires_its_machine_and_records_its_hash(backend: Backend) -> None:
    script = [calls(call("c1", "lookup", order_id="A")), say("never asked")]
    plain = make_runtime(list(script), backend).run("look")
    strict = make_runtime(list(script), backend, machine=STRICT).run("look")
    assert plain.status == "done"
    assert (strict.status, strict.reason) == ("budget_exhausted", "tool_rounds")
    assert edges(strict)[-1] == ("observe", "observing", "budget_exhausted")
    assert strict.events[0]["machine_hash"] == STRICT.hash
    assert plain.events[0]["machine_hash"] == MACHINE_HASH
    assert_history_valid(strict)


def test_a_paused_run_resumes_under_its_old_machine_after_the_table_changed(
    store: Any, backend: Backend
) -> None:
    old = make_runtime(list(SCRIPT), backend, store=store, approval=True, machine=STRICT)
    paused = old.run("file it", run_id="r1")
    assert (paused.status, paused.reason) == ("review_required", "approval_required")
    # The application changed its table back to the built-in one, and still knows STRICT.
    new = make_runtime(list(SCRIPT[1:]), backend, store=store, approval=True, machines=[STRICT])
    assert new.machine == DEFAULT_MACHINE
    result = new.approve("r1", "c1", resume=True)
    # The old table's edge ended it: under the new one the model would have answered.
    assert (result.status, result.reason) == ("budget_exhausted", "tool_rounds")
    assert edges(result)[-1] == ("observe", "observing", "budget_exhausted")
    assert [w["request_id"] for w in backend.writes] == ["R-1"]
    assert store.load_run("r1").snapshot["machine_hash"] == STRICT.hash
    assert_history_valid(result)
    # A new run of the same runtime fires the new table.
    fresh = make_runtime([calls(call("c9", "lookup", order_id="B")), say("ok")], backend,
                         store=store, machines=[STRICT]).run("look", run_id="r2")  # fmt: skip
    assert fresh.status == "done" and fresh.events[0]["machine_hash"] == MACHINE_HASH


def test_a_run_under_a_machine_the_runtime_does_not_know_is_refused_naming_both(
    store: Any, backend: Backend
) -> None:
    make_runtime(list(SCRIPT), backend, store=store, approval=True, machine=STRICT).run(
        "file it", run_id="r1"
    )
    before = store.load_run("r1")
    rt = make_runtime(list(SCRIPT[1:]), backend, store=store, approval=True)
    with pytest.raises(MachineMismatch) as caught:
        rt.resume("r1")
    message = str(caught.value)
    assert f"checkpointed by machine {STRICT.hash}" in message
    assert f"knows machine {MACHINE_HASH}" in message
    assert "Runtime(machine=..., machines=[" in message  # how to fix it
    with pytest.raises(MachineMismatch, match=STRICT.hash):
        rt.approve("r1", "c1")  # a review reads the run under its machine too
    after = store.load_run("r1")
    assert (after.snapshot, after.events) == (before.snapshot, before.events)
    assert backend.writes == []


def test_compile_machine_names_every_problem() -> None:
    bad = [
        Transition("observe", "observing", "done", ("no_such_guard",), "final_answer", "finish"),
        Transition("observe", "observing", "done", ("has_answer",), "nope", "finish"),  # type: ignore[arg-type]
        Transition("poke", "observing", "deciding", ("has_answer",)),  # type: ignore[arg-type]
        Transition("observe", "observing", "done", ("has_answer",), "final_answer", "explode"),  # type: ignore[arg-type]
    ]
    with pytest.raises(ConfigError) as caught:
        compile_machine(bad, extends=DEFAULT_MACHINE, name="broken")
    message = str(caught.value)
    assert message.startswith("invalid machine 'broken':")
    assert "unknown guard 'no_such_guard'" in message
    assert "unknown reason 'nope'" in message
    assert "unknown trigger 'poke'" in message
    assert "unknown action 'explode'" in message
    with pytest.raises(ConfigError, match="must be Transition objects"):
        compile_machine([("observe", "observing", "done")])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="a second row with key 'observe/observing->"):
        compile_machine([ONE_ROUND], extends=STRICT)
    with pytest.raises(ConfigError, match="the last edge must be an unguarded fallback"):
        compile_machine([t for t in TRANSITIONS if t.key != "observe/observing->deciding"])


def test_a_runtime_refuses_what_is_not_a_sound_machine(backend: Backend) -> None:
    with pytest.raises(ConfigError, match="must be Machine values"):
        make_runtime([], backend, machine="strict")
    unchecked = Machine.of([*TRANSITIONS, Transition("retry", "done", "deciding")])
    with pytest.raises(ConfigError, match="only 'resume' may leave a terminal state"):
        make_runtime([], backend, machines=[unchecked])


def test_fsm_agent_diagram_draws_an_applications_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "strict.dot"
    assert main(["diagram", "--machine", "machine_app:STRICT", "--detail", "full", "-o",
                 str(out)]) == 0  # fmt: skip
    drawn = out.read_text()
    assert STRICT.hash in drawn and "one-round" in drawn
    assert "observe [has_tool_calls] → tool_rounds" in drawn  # the application's edge
    assert main(["diagram", "--detail", "full", "-o", str(tmp_path / "plain.dot")]) == 0
    plain = (tmp_path / "plain.dot").read_text()
    assert "observe [has_tool_calls]" not in plain and MACHINE_HASH in plain
    # A function returning one works too; Mermaid draws it as well.
    spec = "machine_app:strict_machine"
    assert main(["diagram", "--machine", spec, "--detail", "full", "--format", "mermaid"]) == 0
    mermaid = capsys.readouterr().out
    assert f"one-round {STRICT.hash}" in mermaid
    assert any(line.startswith("    observing --> budget_exhausted") and "has_tool_calls" in line
               for line in mermaid.splitlines())  # fmt: skip
    for spec, error in (
        ("machine_app", "must be MODULE:NAME"),
        ("machine_app:MISSING", "cannot load --machine machine_app:MISSING"),
        ("machine_app:NOT_A_MACHINE", "is int, not a Machine"),
    ):
        assert main(["diagram", "--machine", spec, "--format", "dot"]) == 2
        assert error in capsys.readouterr().err


def test_transition_coverage_counts_the_edges_of_its_machine(backend: Backend) -> None:
    from fsm_agent.testing._coverage import TransitionCoverage, to_dot

    strict, plain = TransitionCoverage(STRICT), TransitionCoverage()
    script = [calls(call("c1", "lookup", order_id="A")), say("never asked")]
    for coverage in (strict, plain):
        coverage.install()
    try:
        make_runtime(list(script), backend, machine=STRICT).run("look")
    finally:
        for coverage in (strict, plain):
            coverage.uninstall()
    assert sum(plain.hits) == 0  # a run of another machine is not this table's
    rule = next(t for t in STRICT.transitions if t.key == ONE_ROUND.key)
    assert strict.hits[rule.index] == 1 and len(strict.hits) == len(STRICT.transitions)
    row = next(line for line in strict.report_lines() if line.startswith(f"{rule.index} "))
    assert "observing -> budget_exhausted" in row and "has_tool_calls" in row
    assert row.endswith(" 1")
    assert STRICT.hash in to_dot(strict)


def test_a_trace_of_an_applications_machine_replays_over_it(
    tmp_path: Path, backend: Backend
) -> None:
    from fsm_agent._render.replay import Replay

    trace = tmp_path / "strict.jsonl"
    script = [calls(call("c1", "lookup", order_id="A")), say("never asked")]
    make_runtime(script, backend, machine=STRICT).run("look", trace=trace)
    steps = Replay(trace, machine=STRICT).steps
    (ended,) = [s for s in steps if s.transition is not None and s.state == "budget_exhausted"]
    assert ended.transition is not None and ended.transition.key == ONE_ROUND.key
    assert ended.edge_id == "edge-observing-observe-budget_exhausted"
    # The built-in table is not the one it was recorded with: refused, naming both.
    with pytest.raises(TraceError, match=f"machine hash '{STRICT.hash}' is not this machine's"):
        Replay(trace)
    frame = tmp_path / "frame.dot"
    assert main(["replay", str(trace), "--machine", "machine_app:STRICT", "--detail", "full",
                 "-o", str(frame)]) == 0  # fmt: skip
    drawn = frame.read_text()
    assert STRICT.hash in drawn
    (arrow,) = [
        line for line in drawn.splitlines() if "edge-observing-observe-budget_exhausted" in line
    ]
    assert "#d93025" in arrow  # drawn as the edge taken last
