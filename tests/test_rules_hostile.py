"""Hostile inputs never raise out of a judgement: lone surrogates, integers CEL cannot
hold, NaN and infinities, nesting past any stack. What CEL cannot take fails closed; what
it can take is judged; the digest exists either way."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fsm_agent._rules import Facts, Rule, RuleSet, ToolInfo
from fsm_agent._rules.canonical import canonical_text, digest

# CEL conditions need the `cel` extra (CPython 3.11+); without it these tests cannot run.
pytest.importorskip("cel_expr_python")

TOOLS = {"act": ToolInfo("write", {"type": "object", "additionalProperties": True})}
RULES = RuleSet(
    [
        Rule("big", on="before_tool", tools=["act"], when="args.n > 5", then="review"),
        Rule("seen", on="before_tool", when="calls.exists(c, c.args == args)", then="deny"),
        Rule("ctx", on="before_tool", when="context.tier == 'x'", then="allow"),
        Rule("res", on="after_tool", when="result == args", then="deny"),
        Rule("model", on="before_model", when="size(calls) > 1000", then="deny"),
        Rule("json", on="answer", schema={"type": "object"}, then="retry"),
        Rule("text", on="answer", when="answer.contains('x')", then="stop"),
    ],
    TOOLS,
)

#: Characters with the lone surrogates in (st.text() leaves them out by default).
CHARS = st.characters(codec=None, exclude_categories=())
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.integers(min_value=10**400, max_value=10**400 + 1)
    | st.floats()  # NaN, infinities, -0.0
    | st.text(CHARS, max_size=6)
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(CHARS, max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


def deep(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def judge_everywhere(value: Any) -> list[str]:
    """Every phase judged with ``value`` in every input; the verdicts."""
    calls = [{"tool": "act", "args": {"n": value}, "ok": True, "result": value}]
    out = []
    for phase, facts in (
        ("before_tool", Facts(tool="act", args={"n": value}, calls=calls, context={"tier": value})),
        ("after_tool", Facts(tool="act", args={"n": value}, result=value, calls=calls)),
        ("before_model", Facts(calls=calls, counters={"model_calls": value})),
        ("answer", Facts(answer=value if isinstance(value, str) else "x", calls=calls)),
    ):
        judged = RULES.judge(phase, facts)
        assert judged.inputs_digest.startswith("v3:sha256:")
        if judged.error is not None:
            assert judged.verdict == ("stop" if phase == "answer" else "deny")
            assert judged.rule_id is not None
        out.append(judged.verdict)
    return out


@given(JSONISH)
@example("\ud800")  # a lone surrogate
@example(2**64)  # one past CEL's uint
@example(math.nan)
@example(deep(101))  # one level past the screen
@example({"\udfff": 1})  # a lone surrogate in a key
def test_a_hostile_input_never_raises_out_of_a_judgement(value: Any) -> None:
    judge_everywhere(value)


def test_inputs_too_big_for_hypothesis_to_print_never_raise_either() -> None:
    # Past Python's own int-to-text limit, and past both the C++ engine's stack and
    # Python's recursion limit: every phase fails closed, the digests still exist.
    for value in (10**5000, deep(50_000)):
        assert judge_everywhere(value) == ["deny", "deny", "deny", "retry"]


def test_what_cel_cannot_take_fails_closed_with_where_it_is() -> None:
    for value, why in (
        ("\ud800", "args.n: a string with a lone surrogate"),
        (2**64, "args.n: an integer outside CEL's 64-bit range"),
        (deep(50_000), "nested deeper than 100 levels"),
        ({1: 2}, "args.n: a key that is not a string"),
        (b"bytes", "args.n: a bytes, not a JSON value"),
    ):
        judged = RULES.judge("before_tool", Facts(tool="act", args={"n": value}))
        assert (judged.verdict, judged.rule_id) == ("deny", "big")
        assert why in str(judged.error), (why, judged.error)


def test_what_cel_can_take_is_judged() -> None:
    def verdict(n: Any) -> str:
        return RULES.judge(
            "before_tool", Facts(tool="act", args={"n": n}, context={"tier": "y"})
        ).verdict

    assert verdict(math.inf) == "review"
    assert verdict(math.nan) == "pass"  # NaN > 5 is false, as IEEE says
    assert verdict(2**63) == "review"  # a CEL uint
    assert verdict(5) == "pass"


def test_the_canonical_text_of_any_value_exists_and_is_injective_on_hard_cases() -> None:
    hard = ["\ud800", "\\ud800", 10**5000, 10**5000 + 1, math.nan, math.inf, -math.inf, 0.1]
    texts = [canonical_text(v) for v in hard]
    assert len(set(texts)) == len(hard)
    assert canonical_text({"b": 1, "a": [1.5, None]}) == '{"a":[1.5,null],"b":1}'
    assert canonical_text(deep(50_000)).startswith("!")
    assert digest(deep(50_000)) != digest(deep(50_001))


@given(tool=JSONISH, calls=JSONISH, counters=JSONISH, context=JSONISH, args=JSONISH)
@example(tool=["unhashable"], calls=None, counters=None, context=None, args=None)
@example(tool=7, calls=[1, "x", None], counters=[], context="ctx", args=[1])
def test_facts_of_the_wrong_shape_never_raise_either(
    tool: Any, calls: Any, counters: Any, context: Any, args: Any
) -> None:
    facts = Facts(tool=tool, args=args, calls=calls, counters=counters, context=context)
    for phase in ("before_tool", "after_tool", "before_model", "answer"):
        judged = RULES.judge(phase, facts)
        assert judged.inputs_digest.startswith("v3:sha256:")
    RULES.judge_batch([facts, facts])
