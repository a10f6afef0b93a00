"""Overhead per tool round: fsm-agent against a hand-written loop, in one process run.

One scripted scenario of 100 tool rounds (one read call per round, then an answer) runs
through (a) a minimal hand-written loop doing the same work the engine must do per round
(strict JSON parsing, compiled jsonschema validation, whole-batch id checks, pairing the
result by id) and (b) ``Runtime.run`` with its in-memory trace. Both use the same model
script and the same tool. Printed: µs per tool round for each, their ratio, and the cold
``import fsm_agent`` time (fresh interpreters); then, where valgrind is installed, the
same comparisons in instructions (callgrind), which a busy shared machine cannot move:
engine / hand-written per round (target ≤ 2.5×, issue 18), and ``import fsm_agent`` /
importing its dependencies alone.

Measured (callgrind, this scenario): 476k instructions per round (2.95×) before engine v3,
537k (3.34×) after it; then 425k (2.65×) once the hot path stopped rebuilding a JSON
encoder per call (``jsonsafe.dumps_safe``), walked each group of edges with code compiled
from the table (``select.compile_choice``) and dropped per-event helper calls. The
hand-written loop is ~161k per round, most of it argument parsing and jsonschema
validation, which the engine does too. Then (issue 18, one run of each): 427k (2.65×)
before, 402k (2.49×) after the transition path was trimmed (the compiled walk looked up
at once, each edge's checkpoint point read off its columns once, no generator per batch
guard, no bracket count of short JSON); and 385k once the arguments decoder is built
once (``canonical.parse_arguments``), which saves ~15k per call in both loops, since the
hand-written one parses with the same function: 146k, so the ratio reads 2.64× while
the engine's own share (engine − hand-written) went from 266k to 239k per round. Then
(issue 18 again, same session): 388k (2.68×) before, 356k (2.45×) after, the engine's
own share 243k -> 210k: the loop takes the compiled walk and builds the transition
event itself (two calls less per edge), the round's two frozen requests set their slots
directly, tools are looked up with the registry dict's own ``get``, and the
repeated-calls pass over the history runs only when an id came back. Then 354k (2.44×)
once ``parse_arguments`` calls the decoder's parts rather than ``decode`` (both loops
use it, so the ratio stays).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from jsonschema import Draft202012Validator
from orders import SCHEMA, lookup
from timing import instructions

from fsm_agent import Budget, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.canonical import parse_arguments

ROUNDS = 100
REPEATS = 30


def script() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call-{i}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"order_id": f"A{i}"})},
                }
            ],
        }
        for i in range(ROUNDS)
    ]
    steps.append({"role": "assistant", "content": "All orders are in transit."})
    return steps


VALIDATOR = Draft202012Validator(SCHEMA)
TOOLS = ToolRegistry()  # built once, as an application does; the runtime is per run
TOOLS.register(lookup, schema=SCHEMA, effect="read")


def hand_written(steps: list[dict[str, Any]]) -> str:
    """The same work with no machine, no trace, no budgets beyond a round count."""
    validator = VALIDATOR
    tools = {"lookup": lookup}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where are my orders?"}]
    for decision in steps:
        tool_calls = decision.get("tool_calls") or []
        if not tool_calls:
            return "done" if decision.get("content") else "protocol_error"
        ids = [c.get("id") for c in tool_calls]
        if not all(ids) or len(set(ids)) != len(ids):
            return "protocol_error"
        messages.append(decision)
        for c in tool_calls:
            name = c["function"]["name"]
            args = parse_arguments(c["function"]["arguments"])
            if name not in tools or any(True for _ in validator.iter_errors(args)):
                content = json.dumps({"ok": False, "error": "invalid_arguments"})
            else:
                content = json.dumps({"ok": True, "value": tools[name](**args)})
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": content})
    return "budget_exhausted"


def engine(steps: list[dict[str, Any]], interceptors: Sequence[Any] = ()) -> str:
    """One run of the scenario through the engine (``interceptors``: ``otel.py``'s)."""
    runtime = Runtime(
        model=ScriptedModel(steps),
        tools=TOOLS,
        allowed_tools={"lookup"},
        budget=Budget(
            max_tool_rounds=ROUNDS,
            max_model_calls=ROUNDS + 1,
            max_total_calls=ROUNDS,
            max_calls_per_round=1,
        ),
        interceptors=list(interceptors),
    )
    result = runtime.run("Where are my orders?")
    return result.status


def per_round(fn: Any) -> float:
    """Median µs per tool round over REPEATS full runs (set-up included)."""
    samples = []
    for _ in range(REPEATS):
        steps = script()
        start = time.perf_counter()
        status = fn(steps)
        samples.append((time.perf_counter() - start) / ROUNDS * 1e6)
        assert status == "done", status
    return statistics.median(samples)


def import_ms() -> float:
    code = "import time; t = time.perf_counter(); import fsm_agent; print(time.perf_counter() - t)"
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        * 1000
        for _ in range(5)
    ]
    return min(runs)


# ── instruction counts: the same comparison, immune to a busy machine ────────────────


def _workload(fn: str, runs: int) -> str:
    return (
        "import overhead as o\n"
        "o.engine(o.script()); o.hand_written(o.script())\n"
        f"for _ in range({runs}):\n"
        "    s = o.script()\n"
        f"    {fn}\n"
    )


def instruction_ratios(runs: int = 5) -> tuple[float, float, float] | None:
    """(engine / hand-written per round, import fsm_agent / import of its dependencies,
    engine instructions per round): instruction counts, each against a baseline counted
    the same way."""
    start = instructions(_workload("pass", runs))
    hand = instructions(_workload("o.hand_written(s)", runs))
    ours = instructions(_workload("o.engine(s)", runs))
    python = instructions("pass")
    deps = instructions("import transitions, jsonschema, dataclasses, json, hashlib")
    package = instructions("import fsm_agent")
    if None in (start, hand, ours, python, deps, package):
        return None
    assert start and hand and ours and python and deps and package
    if not start < hand < ours:
        # Each count runs a fresh interpreter over the files as they are then: an edit
        # made while the bench runs mixes two versions of the code.
        raise SystemExit(
            f"instruction counts out of order (pass {start}, hand-written {hand}, engine "
            f"{ours}): did the code change while the bench ran? Run it again."
        )
    per_round = (ours - start) / (runs * ROUNDS)
    return (ours - start) / (hand - start), (package - python) / (deps - python), per_round


def main() -> None:
    engine(script())  # warm caches and lazy imports once
    hand_written(script())
    baseline = per_round(hand_written)
    ours = per_round(engine)
    imp = import_ms()
    print(f"overhead: {ROUNDS} tool rounds x {REPEATS} runs, median per round")
    print(f"  hand-written loop (baseline) {baseline:8.1f} µs/round")
    print(f"  fsm-agent, in-memory trace   {ours:8.1f} µs/round   ratio {ours / baseline:.2f}x")
    print(f"  import fsm_agent (cold, best of 5) {imp:6.1f} ms")
    if "--no-instructions" in sys.argv:
        print("  (instruction counts skipped: --no-instructions)")
        return
    counted = instruction_ratios()
    if counted is None:
        print("  (instruction counts need valgrind: apt-get install valgrind)")
        return
    per, imports, instructions = counted
    print(f"  instructions (callgrind, deterministic): engine / hand-written loop = "
          f"{per:.2f}x per round (target <= 2.5x; {instructions / 1000:.0f}k per round); "
          f"import fsm_agent / import of its dependencies = {imports:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
