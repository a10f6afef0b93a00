"""Rules that cannot work are refused when the rule set is built: one ConfigError that
lists every mistake, each naming the rule and, for a condition, the line and column."""

from __future__ import annotations

import re
from typing import Any

import pytest

import fsm_agent
from fsm_agent import ConfigError
from fsm_agent._rules import Rule, RuleSet, ToolInfo, cel

# CEL conditions need the `cel` extra (CPython 3.11+); without it these tests cannot run.
pytest.importorskip("cel_expr_python")

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"amount_cents": {"type": "integer"}, "order_id": {"type": "string"}},
}
TOOLS = {
    "issue_refund": ToolInfo("write", SCHEMA),
    "send_email": ToolInfo("write", {"type": "object", "properties": {"to": {"type": "string"}}}),
    "fetch_url": ToolInfo("read", {"type": "object", "properties": {"url": {"type": "string"}}}),
    "search": ToolInfo("read", {"type": "object", "properties": {"q": {"type": "string"}}}),
    "anything": ToolInfo("read", {"type": "object", "additionalProperties": True}),
}


def mistakes(rules: list[Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        RuleSet(rules, TOOLS)
    lines = str(caught.value).splitlines()
    count = len(lines) - 1
    assert lines[0] == (
        f"{count} mistakes in the rules:" if count > 1 else "1 mistake in the rules:"
    )
    return [line.removeprefix("  - ") for line in lines[1:]]


def test_one_error_lists_every_mistake_of_every_rule() -> None:
    found = mistakes(
        [
            Rule("refunds", on="before_tool", tools=["refund_*"], then="review"),
            Rule("refunds", on="before_tool", tools=["search"], then="deny"),
            Rule("searches", on="before_tool", tools=["search"], then="limit"),
            Rule("json", on="answer", schema={"type": "objekt"}, then="retry"),
            Rule(
                "mail", on="before_tool", tools=["send_email"], when="no_such(args.to)", then="deny"
            ),
            Rule("types", on="before_tool", tools=["search"], when="tool > 1", then="deny"),
            Rule("syntax", on="before_tool", when="args.amount_cents >", then="deny"),
            Rule("var", on="before_tool", when="amount > 5", then="deny"),
        ]
    )
    assert len(found) == 8, found
    assert found[0].startswith("rule 'refunds' (rules[0]): tools glob 'refund_*' matches no")
    assert "(tools: anything, fetch_url, issue_refund, search, send_email)" in found[0]
    assert found[1] == "rule 'refunds' (rules[1]): the id is also rules[0]'s; ids must be unique"
    assert found[2].startswith("rule 'searches' (rules[2]): then='limit' needs a number")
    assert found[3].startswith(
        "rule 'json' (rules[3]): schema is not valid JSON Schema (Draft 2020-12) at type:"
    )
    assert found[4] == (
        "rule 'mail' (rules[4]): when 'no_such(args.to)', line 1, column 8: "
        "unknown function no_such(); CEL's standard functions and macros only"
    )
    assert found[5] == (
        "rule 'types' (rules[5]): when 'tool > 1', line 1, column 6: "
        "found no matching overload for '_>_' applied to '(string, int)'"
    )
    assert found[6].startswith(
        "rule 'syntax' (rules[6]): when 'args.amount_cents >', line 1, column 20: Syntax error"
    )
    assert found[7] == (
        "rule 'var' (rules[7]): when 'amount > 5', line 1, column 1: unknown variable "
        "'amount'; before_tool rules read tool, effect, args, counters, calls, context"
    )


def test_a_position_counts_lines_of_a_multi_line_condition() -> None:
    (found,) = mistakes(
        [Rule("r", on="before_tool", when="tool == 'x' &&\n  effect + 1 > 2", then="deny")]
    )
    assert "line 2, column 10: found no matching overload for '_+_'" in found


def test_a_variable_of_another_phase_is_named_as_such() -> None:
    (found,) = mistakes([Rule("r", on="answer", when="args.x > 1", then="stop")])
    assert "'args' is not available in answer rules (only in before_tool, after_tool)" in found
    (found,) = mistakes([Rule("r", on="before_tool", when="result.ok", then="deny")])
    assert "'result' is not available in before_tool rules (only in after_tool)" in found


def test_an_argument_no_matched_tool_takes_is_a_typo() -> None:
    (found,) = mistakes(
        [Rule("r", on="before_tool", tools=["issue_*"], when="args.amont_cents > 5", then="deny")]
    )
    assert found.endswith(
        "line 1, column 1: args.amont_cents is an argument of no tool this rule matches "
        "(they take amount_cents, order_id)"
    )
    # An open schema takes any name; a string literal is not a reference.
    RuleSet(
        [
            Rule("open", on="before_tool", tools=["anything"], when="args.whatever", then="deny"),
            Rule("lit", on="before_tool", tools=["search"], when="args.q == 'args.x'", then="deny"),
        ],
        TOOLS,
    )


def test_field_mistakes_say_the_fix() -> None:
    found = mistakes(
        [
            Rule("", on="before_tool", then="deny"),
            Rule("a", on="on_tool", then="deny"),  # type: ignore[arg-type]
            Rule("b", on="answer", then="review"),
            Rule("c", on="before_tool", then="retry"),
            Rule("d", on="before_model", tools=["search"], then="deny"),
            Rule("e", on="before_tool", tools="search", then="deny"),
            Rule("f", on="before_tool", tools=[], then="deny"),
            Rule("g", on="before_tool", then="limit", limit=-1),
            Rule("h", on="before_tool", then="deny", limit=3),
            Rule("i", on="before_tool", schema={"type": "object"}, then="deny"),
            Rule("j", on="answer", schema={"type": "object"}, then="allow"),
            Rule("k", on="before_tool", when=42, then="deny"),  # type: ignore[arg-type]
            Rule("l", on="before_tool", then="limit", limit=True),
            Rule("m", on="after_tool", then="nope"),  # type: ignore[arg-type]
            "not a rule",
        ]
    )
    expected = [
        "rule '' (rules[0]): id must be a non-empty string",
        "rule 'a' (rules[1]): on='on_tool' is not a phase; use one of before_tool, after_tool,",
        "rule 'b' (rules[2]): then='review' is not a verdict of answer rules; answer rules "
        "take allow, retry, stop",
        "rule 'c' (rules[3]): then='retry' is not a verdict of before_tool rules",
        "rule 'd' (rules[4]): tools applies to before_tool and after_tool rules only",
        "rule 'e' (rules[5]): tools must be a list of globs, got the string 'search': "
        "write tools=['search']",
        "rule 'f' (rules[6]): tools=[] matches no tool",
        "rule 'g' (rules[7]): limit must be a whole number ≥ 0, got -1",
        "rule 'h' (rules[8]): limit=3 is only read by then='limit' rules",
        "rule 'i' (rules[9]): schema applies to answer rules only",
        "rule 'j' (rules[10]): a schema rule decides when the answer fails it",
        "rule 'k' (rules[11]): when must be a CEL string or a callable, got int",
        "rule 'l' (rules[12]): limit must be a whole number ≥ 0, got True",
        "rule 'm' (rules[13]): then='nope' is not a verdict; after_tool rules take allow, deny",
        "rules[14]: not a Rule but str",
    ]
    assert len(found) == len(expected), found
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start), (line, start)


def test_a_condition_that_is_not_a_bool_is_refused() -> None:
    (found,) = mistakes([Rule("r", on="before_tool", when="size(tool)", then="deny")])
    assert found.endswith("the condition is of type int, not bool")


def test_an_expression_nested_past_the_engine_limit_is_a_config_error() -> None:
    (found,) = mistakes(
        [Rule("r", on="before_tool", when="(" * 300 + "true" + ")" * 300, then="deny")]
    )
    assert "nested too deep for CEL" in found


def test_without_the_cel_engine_a_cel_rule_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cel, "available", lambda: False)
    (found,) = mistakes([Rule("r", on="before_tool", when="tool == 'x'", then="deny")])
    assert "pip install 'fsm-agent[cel]' (Python 3.11+), or give when as a Python callable" in found
    # A callable condition, or none, needs no CEL engine.
    RuleSet([Rule("c", on="before_tool", when=lambda f: True, then="deny")], TOOLS)


def test_rule_is_a_frozen_value_exported_from_the_package() -> None:
    assert fsm_agent.Rule is Rule and "Rule" in fsm_agent.__all__
    rule = Rule("r", on="before_tool", tools=["search"], then="deny")
    assert rule.tools == ("search",)  # a list is kept as a tuple
    with pytest.raises(AttributeError):
        rule.id = "other"  # type: ignore[misc]
    schema: dict[str, Any] = {"type": "object", "required": ["status"]}
    answer = Rule("a", on="answer", schema=schema, then="retry")
    schema["required"].append("more")  # the rule keeps what it was given
    assert answer.schema == {"type": "object", "required": ["status"]}
    with pytest.raises(TypeError):
        Rule("positional", "before_tool")  # type: ignore[call-arg]


def test_an_unknown_phase_to_judge_is_refused() -> None:
    rules = RuleSet([], TOOLS)
    with pytest.raises(ValueError, match=re.escape("'on_tool' is not a phase")):
        rules.judge("on_tool", fsm_agent._rules.Facts())


def test_tools_that_are_not_tools_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        RuleSet([], {"search": "read", 3: TOOLS["search"]})  # type: ignore[dict-item]
    assert str(caught.value).splitlines() == [
        "the rule set's tools cannot be read:",
        "  - tools['search'] is a str, not a tool: give an fsm_agent.Tool or "
        "ToolInfo(effect, schema)",
        "  - a tool name must be a string, got 3",
    ]
    with pytest.raises(ConfigError, match=r"\{tool.name: tool for tool in registry\}"):
        RuleSet([], ["search"])  # type: ignore[arg-type]


def test_an_id_that_is_not_a_string_is_a_mistake_not_a_crash() -> None:
    (found,) = mistakes([Rule(["x"], on="before_tool", then="deny")])  # type: ignore[arg-type]
    assert found == "rule ['x'] (rules[0]): id must be a non-empty string, got ['x']"
    (found,) = mistakes([Rule("s", on="answer", schema=[1], then="retry")])  # type: ignore[arg-type]
    assert found == "rule 's' (rules[0]): schema must be a JSON Schema object, got [1]"


def test_importing_the_package_does_not_load_the_cel_engine() -> None:
    # `import fsm_agent` must work, and stay cheap, without the `cel` extra: the engine
    # is loaded by the first rule set that has a CEL condition.
    import subprocess
    import sys

    code = (
        "import sys, fsm_agent; from fsm_agent._rules import RuleSet, Rule\n"
        "assert 'cel_expr_python' not in sys.modules\n"
        "RuleSet([Rule('r', on='before_model', when=lambda f: True, then='deny')], {})\n"
        "assert 'cel_expr_python' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
