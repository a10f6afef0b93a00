"""``RuleSet._quick`` (the engine's facts judged without ``_Inputs``) against the general path.

The quick path screens and digests the variables in one pass; wherever it is not sure it
hands the judgement back. Held here to one judgement with the general path (every field:
verdict, rule, digest, detail, tried) on the bench's twenty rules, the τ²-bench retail
policy and generated rule sets, over generated facts shaped as ``core/judging.py`` builds
them and hostile ones: lone surrogates, integers past 64 bits, non-finite floats, deep
nesting, counters that are not a dict, a missing effect, calls as a tuple.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tau2_policy import policy, steps_with_facts, tasks

from fsm_agent._core.judging import _PLAIN, _TRUSTED
from fsm_agent._rules import Facts, Rule, RuleSet, ToolInfo, cel

pytestmark = pytest.mark.skipif(not cel.available(), reason="needs the CEL engine")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rules as bench  # noqa: E402
from orders import SCHEMA as ORDER_SCHEMA  # noqa: E402

SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}, "n": {}}}
TOOLS = {"lookup": ToolInfo("read", SCHEMA), "pay": ToolInfo("write", SCHEMA)}

CONDITIONS = [
    "args.order_id == 'A1'",
    "has(args.order_id) && args.order_id.startsWith('A')",
    "size(args) > 1",
    "calls.exists(c, c.tool == 'pay')",
    "calls.filter(c, c.ok && c.args.order_id == 'A1').size() > 1",
    "calls.all(c, c.tool == 'lookup')",
    "context.tier == 'gold'",
    "'flag' in context && context['flag'] == true",
    "counters.model_calls > 2",
    "counters.tool_rounds >= 1 && effect == 'write'",
    "tool == 'pay'",
    "effect == 'read' && size(calls) > 2",
    "args.n > 5",
    "counters.model_calls / 0 == 1",  # an error: the general path says which rule
]


def _scalar(rng: random.Random) -> Any:
    if rng.random() < 0.03:  # one CEL cannot take, or one only its walk can tell
        return rng.choice([2**63, 10**19, math.nan, math.inf, "\ud800", "1" * 25, -(2**64)])
    return rng.choice([None, True, False, 0, 3, 7, -1, 2**63 - 1, 1.5, "A1", "A2", "B", "",
                       "é😀"])  # fmt: skip


def _result(rng: random.Random) -> Any:
    """A tool's result: mostly a record of scalars with a list of items in it."""
    if rng.random() < 0.1:
        return _scalar(rng)
    record = {"order_id": _scalar(rng), "status": _scalar(rng)}
    if rng.random() < 0.3:
        record["items"] = [{"price": _scalar(rng)} for _ in range(rng.randint(0, 3))]
    return record


def _deep(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def _args(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.07:
        return {"order_id": _deep(120)}
    if roll < 0.09:
        return {"order_id": "\ud800"}
    args = {"order_id": rng.choice(["A1", "A2", "B7", "A" * 30])}
    if rng.random() < 0.4:
        args["n"] = _scalar(rng)
    return args


def _entry(rng: random.Random) -> dict[str, Any]:
    ok = rng.random() < 0.8
    return {"tool": rng.choice(["lookup", "pay"]), "args": _args(rng) or {}, "ok": ok,
            "result": _result(rng) if ok else None}  # fmt: skip


def _facts(rng: random.Random, calls: list[Any]) -> Facts:
    tool = rng.choice(["lookup", "pay", "lookup"])
    counters: Any = {"model_calls": rng.randint(0, 5), "tool_rounds": rng.randint(0, 3),
                     "tool_attempts": {"lookup": 1}}  # fmt: skip
    if rng.random() < 0.05:
        counters = [1, 2]
    context: dict[str, Any] = rng.choice([{}, {"tier": "gold"}, {"tier": "gold", "flag": True},
                                          {"flag": 2**70}])  # fmt: skip
    effect = TOOLS[tool].effect if rng.random() < 0.95 else None
    return Facts.of(tool=tool, effect=effect, args=_args(rng), counters=counters, calls=calls,
                    context=context, call_id=f"c{rng.randint(0, 9)}", trusted=_TRUSTED,
                    appended=True, plain=_PLAIN)  # fmt: skip


def _general(rules: list[Rule], tools: dict[str, ToolInfo]) -> RuleSet:
    """The same rules, judged by the general path only."""
    general = RuleSet(rules, tools)
    general._quick = lambda *_: None  # type: ignore[method-assign]
    return general


def _same_judgements(rules: list[Rule], tools: dict[str, ToolInfo], seed: int,
                     rounds: int = 60) -> int:  # fmt: skip
    """Judge a growing run's calls with both paths; returns how many the quick path took."""
    rng = random.Random(seed)
    quick, general = RuleSet(rules, tools), _general(rules, tools)
    taken = 0
    original = quick._quick

    def counted(*a: Any) -> Any:
        nonlocal taken
        got = original(*a)
        taken += got is not None
        return got

    quick._quick = counted  # type: ignore[method-assign, assignment]
    calls: list[Any] = []
    for _ in range(rounds):
        facts = _facts(rng, calls)
        assert quick.judge("before_tool", facts) == general.judge("before_tool", facts), facts
        if rng.random() < 0.7:
            calls.append(_entry(rng))
    return taken


def test_the_bench_rules_judge_as_the_general_path() -> None:
    tools = {"lookup": ToolInfo("read", ORDER_SCHEMA)}
    for seed in range(8):
        for rules in (bench.RULES, bench.FLAT, bench.NO_CALLS):
            _same_judgements(rules, tools, seed)


def _rule(rng: random.Random, i: int) -> Rule:
    return Rule(f"r{i}", on="before_tool", tools=[rng.choice(["*", "lookup", "pa*"])],
                when=rng.choice(CONDITIONS), then=rng.choice(["deny", "review", "allow"]),
                message=rng.choice([None, "no"]))  # fmt: skip


def test_generated_rule_sets_judge_as_the_general_path() -> None:
    """Random rule sets of the conditions above (errors, quantifiers, names) and verdicts;
    the quick path takes most judgements, and every one agrees."""
    taken = 0
    for seed in range(40):
        rng = random.Random(seed)
        rules = [_rule(rng, i) for i in range(rng.randint(1, 8))]
        taken += _same_judgements(rules, TOOLS, seed)
    assert taken > 300  # (not a test of a path that never runs)


def test_a_growing_log_with_an_entry_cel_cannot_take_judges_as_the_general_path() -> None:
    """An entry with an integer past 64 bits stops the log's screened form: rules reading
    ``calls`` fail closed in both paths, from that entry on."""
    rules = [Rule("pays", on="before_tool", tools=["*"], when="calls.exists(c, c.tool == 'pay')",
                  then="deny")]  # fmt: skip
    quick, general = RuleSet(rules, TOOLS), _general(rules, TOOLS)
    calls: list[Any] = [{"tool": "lookup", "args": {}, "ok": True, "result": {"n": 1}}]
    rng = random.Random(1)
    for huge in (None, 2**64):
        if huge is not None:
            calls.append({"tool": "lookup", "args": {}, "ok": True, "result": {"n": huge}})
        facts = _facts(rng, calls)
        judged = quick.judge("before_tool", facts)
        assert judged == general.judge("before_tool", facts)
        assert judged.verdict == ("deny" if huge else "pass")


def test_the_tau2_policy_judges_as_the_general_path() -> None:
    quick = policy()
    general = policy()
    general._quick = lambda *_: None  # type: ignore[method-assign]
    judged = 0
    for task in tasks()[:40]:
        for step in steps_with_facts(task):
            assert quick.judge("before_tool", step.facts) == general.judge(
                "before_tool", step.facts)  # fmt: skip
            judged += 1
    assert judged > 100


# ── an executed call screened by the engine's texts (``RuleSet.executed``) ───────────

_HOSTILE = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
    | st.sampled_from(["1234567890123456789", "\ud800", "é😀", "9" * 30]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3),
    max_leaves=12,
)  # fmt: skip


def _nested(depth: int) -> Any:
    out: Any = 1
    for _ in range(depth):
        out = [out]
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.dictionaries(st.text(max_size=3), _HOSTILE, max_size=3), value=_HOSTILE,
       depth=st.sampled_from([0, 0, 0, 99, 100, 101]), tool=st.sampled_from(
           ["lookup", "pay", "\ud800x", "l" * 30]), ok=st.booleans())  # fmt: skip
def test_an_entry_screened_by_its_texts_is_screened_as_by_encoding_it(
    args: dict[str, Any], value: Any, depth: int, tool: str, ok: bool
) -> None:
    """The entry the engine builds, from the texts it builds it from (the model's
    arguments parsed under R3, the result recorded and read back), taken into a log
    by those texts and by its canonical text: the same screened entry, or the same
    refusal (integers past 64 bits, nesting past 100, a lone surrogate in a name)."""
    from fsm_agent._core.canonical import ArgumentsError, parse_arguments
    from fsm_agent._core.jsonsafe import copy_json, dumps_safe
    from fsm_agent._rules.ruleset import _Log

    if depth:
        value = {"v": _nested(depth)}
    try:
        raw = json.dumps(args, ensure_ascii=False)
        parsed = parse_arguments(raw)
    except (ArgumentsError, ValueError, UnicodeEncodeError):
        return  # the loop refuses these arguments: no call with them runs
    text = dumps_safe({"ok": True, "value": value})[0] if ok else "null"
    result = copy_json(text).get("value") if ok else None
    entry = {"tool": tool, "args": parsed, "ok": ok, "result": result}
    by_text, by_encoding = _Log([entry]), _Log([entry])
    by_text.calls.clear()  # (as the engine hands it over: appended, then executed())
    rules = RuleSet([], TOOLS)
    rules._entries.last = by_text
    by_text.calls.append(entry)
    rules.executed(by_text.calls, f"{text}\n{raw}")
    by_encoding.take(entry, None)
    assert by_text.seen == by_encoding.seen == 1
    assert (by_text.refused is None) == (by_encoding.refused is None), (entry, by_text.refused)
    assert by_text.screened == by_encoding.screened or _nan_in(entry)


def _nan_in(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_nan_in(v) for v in value.values())
    if isinstance(value, list):
        return any(_nan_in(v) for v in value)
    return False
