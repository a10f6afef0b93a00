"""The mutation suite over real traces (``tests/mutation_suite.py``): with a key every
single-event mutation is caught; without one, every one but payload edits (and re-linked
splices that amount to one). The table it prints (``pytest -s``) is the one README.md and
docs/concepts/traces.md show: the test fails when their counts are not today's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mutation_suite
from conftest import Backend, call, calls, make_runtime, say
from durable_scenario import runtime as durable_runtime

from fsm_agent._cli.demo import SCENARIOS
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent.testing._suite import SUITE


def real_traces(tmp_path: Path) -> list[list[dict[str, Any]]]:
    traces: list[list[dict[str, Any]]] = []
    for scenario in SCENARIOS.values():  # the demo
        traces += [r.events for r in scenario.run().results]
    for edge_scenario in SUITE:  # one scenario per edge, resumes and cancels included
        traces.append(edge_scenario.run().result.events)
    with SqliteStore(tmp_path / "runs.db") as store:  # the durable tests' run
        traces.append(durable_runtime(store, tmp_path / "effects.db").run("go", run_id="d1").events)
        store_events = store.load_run("d1").events
        traces.append(store_events)
    store2 = MemoryStore()  # a paused write, approved by a reviewer, resumed
    rt = make_runtime(
        [calls(call("w1", "write", request_id="R-1", title="t")), say("done")],
        Backend(),
        store=store2,
        approval=True,
    )
    rt.run("go", run_id="r1")
    traces.append(rt.approve("r1", "w1", resume=True).events)
    return traces


def test_every_mutation_is_caught_with_a_key_and_all_but_payload_edits_without(
    tmp_path: Path,
) -> None:
    table = mutation_suite.run(real_traces(tmp_path))
    printed = mutation_suite.format_table(table)
    print("\n" + printed)
    for kind, counts in table.items():
        generated = counts.get("generated", 0)
        assert generated > 0, kind
        assert counts.get("with key", 0) == generated, (kind, counts)
        if kind not in ("edit a payload", "splice, re-linked"):
            assert counts.get("without key", 0) == generated, (kind, counts)
    # A re-linked splice at a point where both runs stood in the same state continues
    # with what the other run's tool, store or caller did there: a consistent run of its
    # own, which only a key tells apart (like a payload edit). Every other one is caught.
    relinked = table["splice, re-linked"]
    assert relinked["without key"] >= relinked["generated"] * 0.9, relinked
    root = Path(__file__).resolve().parents[1]
    for page in ("README.md", "docs/concepts/traces.md"):
        shown = (root / page).read_text(encoding="utf-8")
        assert printed in shown, f"{page}: replace the mutation table with\n{printed}"
