"""The cost of judging a call with 20 CEL rules on ``before_tool``, next to a round's.

Measured alone (``RuleSet.judge``, as the loop calls it once per call) and wired (a
``Runtime(rules=...)`` running the ``overhead.py`` scenario): 20 rules that all match the
tool and none of which holds, so every one is evaluated (the worst case of "first match
decides"); four of them iterate ``calls``. Printed: compiling the 20 rules once; µs per
judged call with 0, 10 and 100 executed calls in the run; the same on the τ²-bench retail
policy's 550 recorded calls (big order records in ``calls``); µs per tool round of the
engine with no rules, the 16 rules not reading ``calls`` and all 20; then, with
valgrind, the same in instructions, with also 20 rules none of which reads ``calls``
(the figures the issue bounds: a round with 20 rules ≤ 1.5× a round with none; see
``docs/concepts/own-rules-design.md`` for where they stand). Every timing is the
least disturbed of several runs (the minimum).
"""

from __future__ import annotations

import sys
from pathlib import Path

import overhead
from orders import SCHEMA, lookup
from timing import best, instructions

from fsm_agent import Budget, Runtime, ScriptedModel
from fsm_agent._rules import Facts, Rule, RuleSet, ToolInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tau2_policy import policy, steps_with_facts, tasks

ROUNDS = overhead.ROUNDS
REPEATS = 7
JUDGEMENTS = 2000

#: Twenty conditions of the kinds the documented examples use, none holding for the calls.
CONDITIONS = [
    "args.order_id == 'blocked-{i}'",
    "args.order_id.startsWith('X{i}')",
    "size(args.order_id) > 80 + {i}",
    "calls.exists(c, c.tool == 'send_email_{i}')",
    "context.tier == 'banned-{i}'",
    "counters.model_calls > 1000 + {i}",
    "effect == 'write' && args.order_id == 'W{i}'",
    "tool == 'other_{i}'",
    "calls.filter(c, c.tool == 'lookup' && c.args.order_id == 'Z{i}').size() > 0",
    "'flag_{i}' in context && context['flag_{i}'] == true",
]
RULES = [
    Rule(
        f"rule-{i}",
        on="before_tool",
        tools=["lookup"],
        when=CONDITIONS[i % len(CONDITIONS)].format(i=i),
        then="deny",
    )
    for i in range(20)
]
TOOLS = {"lookup": ToolInfo("read", SCHEMA)}


def compile_ms() -> float:
    return best(lambda: RuleSet(RULES, TOOLS), 20) * 1e3


def judged_calls(history: int, count: int = JUDGEMENTS) -> list[Facts]:
    """``count`` calls to judge, each in a run that executed ``history`` calls."""
    calls = tuple(
        {"tool": "lookup", "args": {"order_id": f"A{i}"}, "ok": True, "result": lookup(f"A{i}")}
        for i in range(history)
    )
    return [
        Facts(
            tool="lookup",
            args={"order_id": f"B{n}"},
            calls=calls,
            counters={"model_calls": n % 100},
            context={"tier": "gold"},
            call_id=f"call-{n}",
        )
        for n in range(count)
    ]


def judge_all(rules: RuleSet, facts: list[Facts]) -> None:
    for f in facts:
        rules.judge("before_tool", f)


def judge_us(history: int) -> float:
    rules = RuleSet(RULES, TOOLS)
    facts = judged_calls(history)
    assert rules.judge("before_tool", facts[0]).tried == tuple(r.id for r in RULES)
    return best(lambda: judge_all(rules, facts), REPEATS) / JUDGEMENTS * 1e6


def tau2_us() -> float:
    rules = policy()
    judged = [j.facts for task in tasks() for j in steps_with_facts(task)]

    def run() -> None:
        for f in judged:
            rules.judge("before_tool", f)

    return best(run, REPEATS) / len(judged) * 1e6


def engine_run() -> None:
    """One run of the ``overhead.py`` scenario: ROUNDS tool rounds of one read call."""
    assert overhead.engine(STEPS) == "done"


STEPS = overhead.script()


def round_us() -> float:
    return best(engine_run, REPEATS) / ROUNDS * 1e6


# ── wired: the same scenario through a Runtime with the rules (the loop judges) ──────


def wired_runtime(rules: list[Rule]) -> Runtime:
    """The ``overhead.py`` scenario's runtime, built once (the rules compiled once), with
    ``rules``; each run gets a fresh model."""
    return Runtime(model=ScriptedModel([]), tools=overhead.TOOLS, allowed_tools={"lookup"},
                   budget=Budget(max_tool_rounds=ROUNDS, max_model_calls=ROUNDS + 1,
                                 max_total_calls=ROUNDS, max_calls_per_round=1),
                   rules=rules)  # fmt: skip


def wired_round_us(rules: list[Rule]) -> float:
    runtime = wired_runtime(rules)

    def run() -> None:
        assert runtime.run("Where are my orders?", model=ScriptedModel(STEPS),
                           context={"tier": "gold"}).status == "done"  # fmt: skip

    return best(run, REPEATS) / ROUNDS * 1e6


#: The twenty rules without the two conditions that read ``calls`` (which grows to 100
#: executed calls in the scenario: their cost is per executed call, see the design note).
NO_CALLS = [r for r in RULES if "calls." not in str(r.when)]
#: Twenty rules of the eight kinds of condition that do not read ``calls``: what twenty
#: rules cost where the run keeps no log of its calls (next to ``RULES``, the cost of
#: keeping one: each executed call's entry, digest, chain step and tally).
FLAT = [
    Rule(f"rule-{i}", on="before_tool", tools=["lookup"], when=when.format(i=i), then="deny")
    for i, when in zip(range(20), [c for c in CONDITIONS if "calls." not in c] * 3, strict=False)
]


# ── instruction counts: the same ratio, immune to a busy machine ─────────────────────


def instruction_ratios(counted: int = 100, runs: int = 2) -> dict[int, float] | None:
    """Per history length: (a round + one judgement of 20 rules) / a round, counted in
    instructions, each workload against the same set-up run with no work."""

    def workload(history: int, work: str) -> str:
        return (
            "import rules as b\n"
            f"rs = b.RuleSet(b.RULES, b.TOOLS); facts = b.judged_calls({history}, {counted})\n"
            "b.judge_all(rs, facts); b.engine_run()\n"  # warm every lazy path once
            f"for _ in range({runs}):\n    {work}\n"
        )

    start = instructions(workload(0, "pass"))
    engine = instructions(workload(0, "b.engine_run()"))
    if start is None or engine is None:
        return None
    per_round = (engine - start) / (runs * ROUNDS)
    ratios: dict[int, float] = {}
    for history in (0, 10):
        base = instructions(workload(history, "pass"))
        judged = instructions(workload(history, "b.judge_all(rs, facts)"))
        if base is None or judged is None:
            return None
        per_judgement = (judged - base) / (runs * counted)
        ratios[history] = (per_round + per_judgement) / per_round
    return ratios


def wired_instructions(runs: int = 10) -> dict[str, float] | None:
    """Instructions per round of the wired scenario (``Runtime(rules=...)``, 100 rounds):
    no rules, the rules that do not read ``calls``, all 20; each against the same set-up
    run with no work (the figures the issue bounds: 20 rules ≤ 1.5× none). Ten runs of
    100 rounds: a set-up differs between processes by some 0.5 M instructions (random
    run ids, addresses), ±2.5k a round over two runs, ±0.5k over ten."""

    def workload(which: str, count: int) -> str:
        return (
            "import rules as b\n"
            f"rt = b.wired_runtime({which})\n"
            "go = lambda: rt.run('Where are my orders?', model=b.ScriptedModel(b.STEPS), "
            "context={'tier': 'gold'})\n"
            "go()\n"  # warm every lazy path once
            f"for _ in range({count}):\n    assert go().status == 'done'\n"
        )

    out: dict[str, float] = {}
    for name, which in (("none", "[]"), ("lean", "b.NO_CALLS"), ("flat", "b.FLAT"),
                        ("all", "b.RULES")):  # fmt: skip
        start, counted = instructions(workload(which, 0)), instructions(workload(which, runs))
        if start is None or counted is None:
            return None
        out[name] = (counted - start) / (runs * ROUNDS)
    return out


def main() -> None:
    print(f"compile 20 CEL rules (once per runtime): {compile_ms():.2f} ms")
    judged = {n: judge_us(n) for n in (0, 10, 100)}
    for n, us in judged.items():
        print(f"judge one call, 20 rules, {n:3d} executed calls: {us:7.1f} µs")
    print(f"judge one call, τ² retail policy (4 rules, 550 recorded calls): {tau2_us():7.1f} µs")
    base = round_us()
    print(f"engine tool round, no rules (overhead.py scenario): {base:7.1f} µs")
    for n, us in judged.items():
        print(f"  with 20 rules, {n:3d} executed calls: ≈ {(base + us) / base:.2f}× a round")
    plain, wired = wired_round_us([]), wired_round_us(RULES)
    lean, flat = wired_round_us(NO_CALLS), wired_round_us(FLAT)
    print(f"wired (Runtime(rules=...)), per round of a 100-round run: no rules {plain:7.1f} µs; "
          f"20 rules {wired:7.1f} µs ({wired / plain:.2f}×); the {len(NO_CALLS)} that do not "
          f"read calls {lean:7.1f} µs ({lean / plain:.2f}×); 20 none of which reads calls "
          f"{flat:7.1f} µs ({flat / plain:.2f}×)")  # fmt: skip
    if "--no-instructions" in sys.argv:
        return
    ratios = instruction_ratios()
    if ratios is None:
        print("  (instruction counts need valgrind: apt-get install valgrind)")
        return
    for n, ratio in ratios.items():
        print(f"  instructions (callgrind): a round with 20 rules, {n:2d} executed calls = "
              f"{ratio:.2f}× a round with none")  # fmt: skip
    counted = wired_instructions()
    if counted is not None:
        none, lean, every = counted["none"], counted["lean"], counted["all"]
        flat = counted["flat"]
        print(f"  instructions (callgrind), wired, per round of a 100-round run: no rules "
              f"{none / 1e3:.0f}k; the {len(NO_CALLS)} rules not reading calls "
              f"{lean / 1e3:.0f}k ({lean / none:.2f}×); 20 rules none of which reads calls "
              f"{flat / 1e3:.0f}k ({flat / none:.2f}×); all 20, four iterating calls "
              f"{every / 1e3:.0f}k ({every / none:.2f}×)")  # fmt: skip


if __name__ == "__main__":
    main()
