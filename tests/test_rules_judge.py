"""Judging: each verdict per phase, first match in list order, limits counted from the
executed calls, schema answers, failing closed, opaque callables, the canonical form."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from fsm_agent import ConfigError
from fsm_agent._rules import Facts, Judgement, OpaqueCondition, Rule, RuleSet, ToolInfo
from fsm_agent._rules.canonical import canonical_text, digest

# CEL conditions need the `cel` extra (CPython 3.11+); without it these tests cannot run.
pytest.importorskip("cel_expr_python")

OBJ = "object"
TOOLS = {
    "issue_refund": ToolInfo(
        "write",
        {"type": OBJ, "properties": {"amount_cents": {"type": "integer"}, "order_id": {}}},
    ),
    "send_email": ToolInfo("write", {"type": OBJ, "properties": {"to": {}, "body": {}}}),
    "fetch_url": ToolInfo("read", {"type": OBJ, "properties": {"url": {}}}),
    "search": ToolInfo("read", {"type": OBJ, "properties": {"q": {}}}),
}

EXAMPLE_RULES = [
    Rule(
        "big-refunds-need-review",
        on="before_tool",
        tools=["issue_refund"],
        when="args.amount_cents > 5000",
        then="review",
    ),
    Rule(
        "no-mail-after-web",
        on="before_tool",
        tools=["send_email"],
        when="calls.exists(c, c.tool == 'fetch_url')",
        then="deny",
        message="no email after reading web content",
    ),
    Rule("three-searches", on="before_tool", tools=["search"], then="limit", limit=3),
    Rule(
        "answer-is-json",
        on="answer",
        schema={"type": "object", "required": ["status"]},
        then="retry",
    ),
]


def executed(tool: str, ok: bool = True, result: Any = None, **args: Any) -> dict[str, Any]:
    return {"tool": tool, "args": args, "ok": ok, "result": result}


def test_the_documented_example_judges_as_written() -> None:
    rules = RuleSet(EXAMPLE_RULES, TOOLS)
    big = rules.judge(
        "before_tool", Facts(tool="issue_refund", args={"amount_cents": 7000}, call_id="c1")
    )
    assert (big.verdict, big.rule_id, big.call_id) == ("review", "big-refunds-need-review", "c1")
    small = rules.judge("before_tool", Facts(tool="issue_refund", args={"amount_cents": 4999}))
    assert (small.verdict, small.rule_id, small.tried) == (
        "pass",
        None,
        ("big-refunds-need-review",),
    )
    web = [executed("search", q="x"), executed("fetch_url", url="https://example.com")]
    mail = rules.judge("before_tool", Facts(tool="send_email", args={"to": "a"}, calls=web))
    assert (mail.verdict, mail.rule_id, mail.detail) == (
        "deny",
        "no-mail-after-web",
        "no email after reading web content",
    )
    clean = rules.judge("before_tool", Facts(tool="send_email", calls=web[:1]))
    assert clean.verdict == "pass"


def test_each_phase_gives_each_of_its_verdicts() -> None:
    rules = RuleSet(
        [
            Rule(
                "t-allow", on="before_tool", tools=["search"], when="args.q == 'ok'", then="allow"
            ),
            Rule("t-deny", on="before_tool", tools=["search"], when="args.q == 'no'", then="deny"),
            Rule(
                "t-review",
                on="before_tool",
                tools=["search"],
                when="args.q == 'ask'",
                then="review",
            ),
            Rule("t-limit", on="before_tool", tools=["search"], then="limit", limit=1),
            Rule("r-deny", on="after_tool", when="result.secret == true", then="deny"),
            Rule("r-allow", on="after_tool", then="allow"),
            Rule("m-deny", on="before_model", when="context.tier == 'banned'", then="deny"),
            Rule("m-limit", on="before_model", then="limit", limit=3),
            Rule("a-stop", on="answer", when="answer.contains('password')", then="stop"),
            Rule("a-retry", on="answer", when="size(answer) < 3", then="retry"),
            Rule("a-allow", on="answer", then="allow"),
        ],
        TOOLS,
    )

    def verdict(phase: str, **facts: Any) -> tuple[str, str | None]:
        judged = rules.judge(phase, Facts(**facts))
        return judged.verdict, judged.rule_id

    assert verdict("before_tool", tool="search", args={"q": "ok"}) == ("allow", "t-allow")
    assert verdict("before_tool", tool="search", args={"q": "no"}) == ("deny", "t-deny")
    assert verdict("before_tool", tool="search", args={"q": "ask"}) == ("review", "t-review")
    assert verdict("before_tool", tool="search", args={"q": "z"}) == ("pass", None)
    one = (executed("search", q="z"),)
    assert verdict("before_tool", tool="search", args={"q": "z"}, calls=one) == (
        "limit",
        "t-limit",
    )
    assert verdict("after_tool", tool="search", result={"secret": True}) == ("deny", "r-deny")
    assert verdict("after_tool", tool="search", result={"secret": False}) == ("allow", "r-allow")
    assert verdict("before_model", context={"tier": "banned"}) == ("deny", "m-deny")
    assert verdict("before_model", context={"tier": "gold"}, counters={"model_calls": 2}) == (
        "pass",
        None,
    )
    assert verdict("before_model", context={"tier": "gold"}, counters={"model_calls": 3}) == (
        "limit",
        "m-limit",
    )
    assert verdict("answer", answer="my password is x") == ("stop", "a-stop")
    assert verdict("answer", answer="no") == ("retry", "a-retry")
    assert verdict("answer", answer="fine") == ("allow", "a-allow")


def test_rules_are_tried_in_list_order_and_the_first_that_holds_decides() -> None:
    allow_first = [
        Rule("allow-small", on="before_tool", when="args.amount_cents < 100", then="allow"),
        Rule("deny-refunds", on="before_tool", tools=["issue_refund"], then="deny"),
    ]
    facts = Facts(tool="issue_refund", args={"amount_cents": 50})
    judged = RuleSet(allow_first, TOOLS).judge("before_tool", facts)
    assert (judged.verdict, judged.rule_id, judged.tried) == (
        "allow",
        "allow-small",
        ("allow-small",),
    )
    swapped = RuleSet(list(reversed(allow_first)), TOOLS).judge("before_tool", facts)
    assert (swapped.verdict, swapped.rule_id) == ("deny", "deny-refunds")
    # A rule for other tools is not tried at all; one for every tool is, and one that reads
    # an argument the call lacks fails closed (`has(args.amount_cents) && ...` would not).
    other = RuleSet(allow_first, TOOLS).judge("before_tool", Facts(tool="search", args={"q": ""}))
    assert (other.tried, other.verdict, other.rule_id) == (("allow-small",), "deny", "allow-small")
    assert "amount_cents" in str(other.error)
    guarded = Rule(
        "allow-small",
        on="before_tool",
        when="has(args.amount_cents) && args.amount_cents < 100",
        then="allow",
    )
    judged = RuleSet([guarded, allow_first[1]], TOOLS).judge(
        "before_tool", Facts(tool="search", args={"q": ""})
    )
    assert (judged.tried, judged.verdict) == (("allow-small",), "pass")


def test_a_limit_below_its_count_lets_the_next_rules_decide() -> None:
    rules = RuleSet(
        [
            Rule("two-refunds", on="before_tool", tools=["issue_refund"], then="limit", limit=2),
            Rule("review-refunds", on="before_tool", tools=["issue_refund"], then="review"),
        ],
        TOOLS,
    )
    judged = rules.judge("before_tool", Facts(tool="issue_refund", args={"amount_cents": 1}))
    assert (judged.verdict, judged.rule_id) == ("review", "review-refunds")


def test_a_limit_counts_executions_of_matching_calls_not_attempts_or_other_calls() -> None:
    rules = RuleSet(
        [
            Rule(
                "two-big-refunds",
                on="before_tool",
                tools=["issue_refund"],
                when="args.amount_cents >= 1000",
                then="limit",
                limit=2,
            )
        ],
        TOOLS,
    )
    calls = [
        executed("issue_refund", amount_cents=5000),
        executed("issue_refund", amount_cents=10),  # does not match the condition
        executed("search", q="refund"),  # another tool
        executed("issue_refund", ok=False, amount_cents=2000),  # ran and failed: executed
    ]
    facts = Facts(tool="issue_refund", args={"amount_cents": 3000}, calls=calls)
    assert rules.executions("two-big-refunds", facts) == 2
    judged = rules.judge("before_tool", facts)
    assert (judged.verdict, judged.detail) == (
        "limit",
        "at most 2 executions of matching calls per run (2 so far)",
    )
    # Pure in the executed calls: a resumed run (same calls, new objects) counts the same.
    copied = Facts(
        tool="issue_refund", args={"amount_cents": 3000}, calls=json.loads(json.dumps(calls))
    )
    assert rules.executions("two-big-refunds", copied) == 2
    assert (
        rules.judge(
            "before_tool", Facts(tool="issue_refund", args={"amount_cents": 3000}, calls=calls[:1])
        ).verdict
        == "pass"
    )
    with pytest.raises(KeyError):
        rules.executions("no-such-rule", facts)


def test_a_batch_counts_its_own_earlier_calls_toward_a_limit() -> None:
    rules = RuleSet(
        [
            Rule("three-searches", on="before_tool", tools=["search"], then="limit", limit=3),
            Rule(
                "no-secret",
                on="before_tool",
                tools=["search"],
                when="args.q == 'secret'",
                then="deny",
            ),
        ],
        TOOLS,
    )
    done = (executed("search", q="a"),)
    batch = [
        Facts(tool="search", args={"q": "b"}, calls=done, call_id="c1"),
        Facts(tool="search", args={"q": "secret"}, calls=done, call_id="c2"),  # denied: no run
        Facts(tool="search", args={"q": "c"}, calls=done, call_id="c3"),
        Facts(tool="search", args={"q": "d"}, calls=done, call_id="c4"),
    ]
    verdicts = [(j.call_id, j.verdict) for j in rules.judge_batch(batch)]
    assert verdicts == [("c1", "pass"), ("c2", "deny"), ("c3", "pass"), ("c4", "limit")]


def test_an_answer_schema_rule_parses_and_validates_and_says_what_failed() -> None:
    rules = RuleSet(
        [
            Rule(
                "answer-is-json",
                on="answer",
                schema={
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"enum": ["ok", "failed"]}, "n": {"type": "integer"}},
                },
                then="retry",
                message="answer with a JSON object",
            )
        ],
        TOOLS,
    )

    def detail(answer: str | None) -> str | None:
        return rules.judge("answer", Facts(answer=answer)).detail

    assert rules.judge("answer", Facts(answer='{"status": "ok", "n": 2}')).verdict == "pass"
    assert detail("Done!") == (
        "answer with a JSON object: the answer is not JSON "
        "(Expecting value: line 1 column 1 (char 0))"
    )
    assert (
        detail('{"status": NaN}')
        == "answer with a JSON object: the answer is not JSON (NaN is not JSON)"
    )
    assert detail('{"status": "maybe", "n": "two"}') == (
        "answer with a JSON object: the answer does not meet the schema: "
        "at $.n: 'two' is not of type 'integer'; "
        "at $.status: 'maybe' is not one of ['ok', 'failed']"
    )
    assert (
        detail("[" * 100_000)
        == "answer with a JSON object: the answer is nested too deep to parse as JSON"
    )
    assert detail(None) == "answer with a JSON object: there is no answer text to parse as JSON"
    assert rules.judge("answer", Facts(answer="{}")).verdict == "retry"


def test_an_evaluation_error_fails_closed_naming_the_rule() -> None:
    rules = RuleSet(
        [
            Rule(
                "needs-amount",
                on="before_tool",
                tools=["issue_refund"],
                when="args.amount_cents > 5",
                then="allow",
            ),
            Rule("answer-field", on="answer", when="context.limit > size(answer)", then="allow"),
        ],
        TOOLS,
    )
    missing = rules.judge("before_tool", Facts(tool="issue_refund", args={"order_id": "A"}))
    assert (missing.verdict, missing.rule_id) == ("deny", "needs-amount")
    assert missing.error is not None and "amount_cents" in missing.error
    assert missing.detail == f"rule 'needs-amount' could not be evaluated: {missing.error}"
    wrong_type = rules.judge("before_tool", Facts(tool="issue_refund", args={"amount_cents": "7"}))
    assert (wrong_type.verdict, wrong_type.rule_id) == ("deny", "needs-amount")
    answer = rules.judge("answer", Facts(answer="hi", context={}))
    assert (answer.verdict, answer.rule_id) == ("stop", "answer-field")
    assert answer.to_json()["error"] == answer.error


def test_a_python_condition_is_opaque_and_fails_closed_too() -> None:
    def over_budget(facts: Facts) -> bool:
        return bool(facts.args and facts.args.get("amount_cents", 0) > facts.context["budget"])

    def broken(facts: Facts) -> bool:
        raise RuntimeError("boom")

    rules = RuleSet(
        [
            Rule(
                "budget", on="before_tool", tools=["issue_refund"], when=over_budget, then="review"
            ),
            Rule("broken", on="before_tool", tools=["search"], when=broken, then="allow"),
            Rule("not-bool", on="answer", when=lambda facts: "yes", then="allow"),
        ],
        TOOLS,
    )
    assert rules.opaque_rules == ("budget", "broken", "not-bool")
    judged = rules.judge(
        "before_tool", Facts(tool="issue_refund", args={"amount_cents": 9}, context={"budget": 5})
    )
    assert (judged.verdict, judged.opaque) == ("review", ("budget",))
    assert judged.to_json()["opaque"] == ["budget"]
    failed = rules.judge("before_tool", Facts(tool="search", args={"q": "x"}))
    assert (failed.verdict, failed.error) == (
        "deny",
        "test_rules_judge.test_a_python_condition_is_opaque_and_fails_closed_too.<locals>.broken "
        "raised RuntimeError: boom",
    )
    stopped = rules.judge("answer", Facts(answer="x"))
    assert stopped.verdict == "stop" and "returned str, not a bool" in str(stopped.error)
    condition = OpaqueCondition.of(over_budget)
    assert condition.has_source and "def over_budget" in condition.source
    assert condition.qualname.endswith("<locals>.over_budget")


def test_an_opaque_callable_without_source_is_marked_and_hashed_by_name() -> None:
    builtin = OpaqueCondition.of(callable)
    assert not builtin.has_source and builtin.source == "<source unavailable>"
    assert builtin.qualname == "builtins.callable"
    assert builtin.digest == OpaqueCondition.of(callable).digest
    assert builtin.digest != OpaqueCondition.of(bool).digest


def test_the_canonical_form_round_trips_and_its_hash_is_stable() -> None:
    def tier_is_gold(facts: Facts) -> bool:
        return bool(facts.context.get("tier") == "gold")

    rules = RuleSet(
        [*EXAMPLE_RULES, Rule("gold", on="before_model", when=tier_is_gold, then="allow")], TOOLS
    )
    recorded = json.loads(json.dumps(rules.to_json()))  # as a header stores it
    assert recorded["format"] == 1 and [r["id"] for r in recorded["rules"]] == [
        "big-refunds-need-review",
        "no-mail-after-web",
        "three-searches",
        "answer-is-json",
        "gold",
    ]
    assert recorded["rules"][0] == {
        "id": "big-refunds-need-review",
        "on": "before_tool",
        "tools": ["issue_refund"],
        "when": {"cel": "args.amount_cents > 5000"},
        "then": "review",
        "message": None,
        "limit": None,
        "schema": None,
    }
    assert recorded["rules"][4]["when"]["python"].endswith("<locals>.tier_is_gold")
    rebuilt = RuleSet.from_json(recorded, TOOLS, callables=[tier_is_gold])
    assert rebuilt.hash == rules.hash == digest(recorded)
    assert rebuilt.canonical == rules.canonical == canonical_text(recorded)
    # Built again from the same rules: the same hash (nothing per-process in it).
    assert (
        RuleSet(
            [*EXAMPLE_RULES, Rule("gold", on="before_model", when=tier_is_gold, then="allow")],
            TOOLS,
        ).hash
        == rules.hash
    )


def test_the_hash_changes_with_order_and_with_any_field() -> None:
    base = RuleSet(EXAMPLE_RULES, TOOLS).hash
    assert RuleSet(list(reversed(EXAMPLE_RULES)), TOOLS).hash != base
    changed = [
        *EXAMPLE_RULES[:2],
        Rule("three-searches", on="before_tool", tools=["search"], then="limit", limit=4),
        EXAMPLE_RULES[3],
    ]
    assert RuleSet(changed, TOOLS).hash != base
    assert (
        RuleSet([], TOOLS).hash
        == "sha256:" + __import__("hashlib").sha256(b'{"format":1,"rules":[]}').hexdigest()
    )


def test_a_recorded_opaque_rule_needs_its_callable_to_resume() -> None:
    def mine(facts: Facts) -> bool:
        return True

    recorded = RuleSet([Rule("mine", on="before_model", when=mine, then="deny")], TOOLS).to_json()
    with pytest.raises(ConfigError) as caught:
        RuleSet.from_json(recorded, TOOLS, callables=[lambda facts: True])
    message = str(caught.value)
    assert "rule 'mine': its when is the Python callable" in message
    assert recorded["rules"][0]["when"]["digest"] in message
    with pytest.raises(ConfigError, match="recorded in format 7"):
        RuleSet.from_json({"format": 7, "rules": []}, TOOLS)
    with pytest.raises(ConfigError, match=r"recorded rules\[0\] cannot be read"):
        RuleSet.from_json({"format": 1, "rules": [{"id": "x"}]}, TOOLS)


def test_the_inputs_digest_covers_what_the_rules_read() -> None:
    rules = RuleSet(EXAMPLE_RULES, TOOLS)

    def judged(**facts: Any) -> Judgement:
        return rules.judge("before_tool", Facts(tool="issue_refund", **facts))

    one = judged(args={"amount_cents": 7000}, call_id="c1")
    assert one.inputs_digest == judged(args={"amount_cents": 7000}, call_id="c1").inputs_digest
    assert one.inputs_digest != judged(args={"amount_cents": 7001}, call_id="c1").inputs_digest
    assert one.inputs_digest != judged(args={"amount_cents": 7000}, call_id="c2").inputs_digest
    # The rule reads args only: context is not an input of this judgement.
    assert (
        one.inputs_digest
        == judged(args={"amount_cents": 7000}, call_id="c1", context={"x": 1}).inputs_digest
    )
    event = one.to_json()
    assert event == {
        "type": "rule",
        "rule": "big-refunds-need-review",
        "phase": "before_tool",
        "inputs_digest": one.inputs_digest,
        "verdict": "review",
        "call_id": "c1",
        "detail": "rule 'big-refunds-need-review': args.amount_cents > 5000",
    }


def test_calls_digest_the_same_whether_cached_or_not() -> None:
    rules = RuleSet(EXAMPLE_RULES, TOOLS)
    calls = [executed("fetch_url", url="u", result={"big": list(range(50))})]
    first = rules.judge("before_tool", Facts(tool="send_email", calls=calls)).inputs_digest
    again = rules.judge("before_tool", Facts(tool="send_email", calls=calls)).inputs_digest
    fresh = RuleSet(EXAMPLE_RULES, TOOLS).judge(
        "before_tool", Facts(tool="send_email", calls=json.loads(json.dumps(calls)))
    )
    assert first == again == fresh.inputs_digest


def test_one_batch_evaluation_keeps_first_match_and_fail_closed_per_rule() -> None:
    # The conditions of a tool's rules are evaluated as one CEL list; a rule that cannot
    # be evaluated must still fail closed only when no earlier rule decided.
    rules = RuleSet(
        [
            Rule(
                "small",
                on="before_tool",
                tools=["issue_refund"],
                when="args.amount_cents < 10",
                then="allow",
            ),
            Rule(
                "needs-order",
                on="before_tool",
                tools=["issue_refund"],
                when="args.order_id == 'A'",
                then="deny",
            ),
            Rule(
                "tier",
                on="before_tool",
                tools=["issue_refund"],
                when="context.tier == 'gold'",
                then="review",
            ),
        ],
        TOOLS,
    )

    def judged(args: dict[str, Any], context: dict[str, Any]) -> tuple[str, str | None, bool]:
        j = rules.judge("before_tool", Facts(tool="issue_refund", args=args, context=context))
        return j.verdict, j.rule_id, j.error is not None

    gold = {"tier": "gold"}
    assert judged({"amount_cents": 5}, gold) == ("allow", "small", False)
    # "needs-order" cannot be evaluated (no order_id) but "small" decided first.
    assert judged({"amount_cents": 5}, {}) == ("allow", "small", False)
    assert judged({"amount_cents": 50}, gold) == ("deny", "needs-order", True)
    assert judged({"amount_cents": 50, "order_id": "B"}, gold) == ("review", "tier", False)
    assert judged({"amount_cents": 50, "order_id": "B"}, {}) == ("deny", "tier", True)
    # A context CEL cannot take fails only the rule that reads it.
    assert judged({"amount_cents": 5}, {"tier": "\ud800"}) == ("allow", "small", False)
    assert judged({"amount_cents": 50, "order_id": "B"}, {"tier": "\ud800"}) == (
        "deny",
        "tier",
        True,
    )
    # The same verdicts as judging the rules one by one (the tool unregistered: no batch).
    alone = RuleSet([replace(r, tools=None) for r in rules.rules], TOOLS)
    for args, context in (({"amount_cents": 50}, gold), ({"amount_cents": 5}, {})):
        one = alone.judge("before_tool", Facts(tool="unregistered", args=args, context=context))
        both = rules.judge("before_tool", Facts(tool="issue_refund", args=args, context=context))
        assert (one.verdict, one.rule_id, one.tried) == (both.verdict, both.rule_id, both.tried)
        assert one.inputs_digest == both.inputs_digest  # the same inputs read, either way


def test_a_real_registry_gives_the_tools_facts() -> None:
    from fsm_agent import ToolRegistry

    registry = ToolRegistry()

    @registry.tool(
        schema={"type": "object", "properties": {"amount_cents": {"type": "integer"}}},
        effect="write",
    )
    def issue_refund(amount_cents: int) -> dict[str, Any]:
        return {"refunded": amount_cents}

    tools = {tool.name: tool for tool in registry}
    rules = RuleSet(
        [
            Rule(
                "writes-over-50",
                on="before_tool",
                tools=["issue_*"],
                when="effect == 'write' && args.amount_cents > 5000",
                then="review",
            )
        ],
        tools,
    )
    judged = rules.judge("before_tool", Facts(tool="issue_refund", args={"amount_cents": 6000}))
    assert (judged.verdict, judged.rule_id) == ("review", "writes-over-50")  # effect filled in
    with pytest.raises(ConfigError, match=r"args\.amount is an argument of no tool"):
        RuleSet([Rule("typo", on="before_tool", when="args.amount > 1", then="deny")], tools)


def test_the_canonical_text_is_fixed_across_versions() -> None:
    # Runs record this text and its hash in their header; a change here is a new format
    # (FORMAT), never a silent one: a run begun under these rules must resume under them.
    rules = RuleSet(
        [Rule("three-searches", on="before_tool", tools=["search"], then="limit", limit=3)],
        TOOLS,
    )
    assert rules.canonical == (
        '{"format":1,"rules":[{"id":"three-searches","limit":3,"message":null,'
        '"on":"before_tool","schema":null,"then":"limit","tools":["search"],"when":null}]}'
    )
    assert rules.hash == "sha256:44c30c76549bd1df6cc646fd408aa8935aa15d69e8645d9eca47e6c1351dc89d"


def test_a_growing_list_of_calls_judges_as_the_same_calls_given_whole() -> None:
    """``Facts.appended``: the run's executed calls are screened and digested as they are
    added; every judgement equals the one on a fresh copy (nothing vouched), also when
    the list is replaced, shrinks, or holds a call CEL cannot take."""
    rules = RuleSet(EXAMPLE_RULES, TOOLS)
    grown: list[dict[str, Any]] = []

    def both(calls: list[dict[str, Any]]) -> tuple[Judgement, Judgement]:
        facts = Facts(tool="send_email", args={"to": "a"}, calls=calls, call_id="m")
        return (
            rules.judge("before_tool", replace(facts, appended=True)),
            rules.judge("before_tool", replace(facts, calls=[dict(c) for c in calls])),
        )

    for step in range(6):
        grown.append(executed("fetch_url" if step == 4 else "search", q=str(step)))
        fast, whole = both(grown)
        assert fast == whole
        assert fast.verdict == ("deny" if step >= 4 else "pass")
    del grown[3:]  # not a run's list any more: judged afresh, not from what was seen
    grown[0] = executed("search", q="changed")
    fast, whole = both(grown)
    assert fast == whole and fast.verdict == "pass"
    grown.append(executed("search", result={"deep": 2**70}))
    fast, whole = both(grown)
    assert fast == whole and fast.verdict == "deny" and fast.error is not None
    assert "calls[3].result.deep" in fast.error


QUANTIFIED = [
    "calls.exists(c, c.tool == 'fetch_url')",
    "calls.exists(c, c.args.q == 'x')",  # an error on a call without q
    "calls.all(c, c.ok)",
    "calls.all(x, x.args.q != 'y')",
    "calls.exists_one(c, c.tool == 'search')",
    "calls.filter(c, c.tool == 'search' && c.ok).size() >= 2",
    "calls.filter(c, c.result.n > 1).size() == 1",  # errors on results without n
    "calls.exists(c, c.result.n)",  # not a bool (a number, or no n): an error
    "calls.exists(c, c.tool == ')' || c.tool == 'search')",
    # Bodies selecting fields get those fields only; the others get the whole call.
    "calls.exists(c, c.nope == 1)",  # no such field: the same error either way
    "calls.exists(c, has(c.result) && c.tool == 'fetch_url')",
    "calls.exists(c, c['tool'] == 'fetch_url')",
    "calls.exists(c, size(c) == 4 && c.tool == 'fetch_url')",
]


@pytest.mark.parametrize("source", QUANTIFIED)
def test_a_quantifier_over_calls_judges_as_the_condition_evaluated_whole(source: str) -> None:
    """A quantifier over ``calls`` (judged from a tally kept with the run's growing list,
    each call's body evaluated once) gives what CEL gives on the whole list: the same
    verdict, and the same error, word for word, where there is one."""
    from fsm_agent._rules import cel

    assert cel.quantifier(source, "before_tool") is not None
    rules = RuleSet(
        [
            Rule("cheap", on="before_tool", tools=["send_email"], when="args.to == 'z'",
                 then="deny"),
            Rule("it", on="before_tool", tools=["send_email"], when=source, then="deny"),
        ],
        TOOLS,
    )  # fmt: skip
    steps = [
        executed("search", q="z", result={"n": 1}),
        executed("search", ok=False, q="y"),
        executed("fetch_url", url="u", result={"n": 2}),
        executed("search", q="x", result={"n": 3}),
        executed("search", q="x"),
    ]
    grown: list[dict[str, Any]] = []
    seen = set()
    for step in [executed("search", q="w", result={"n": 0}), *steps]:
        grown.append(step)
        facts = Facts(tool="send_email", args={"to": "a"}, calls=grown, call_id="m")
        fast = rules.judge("before_tool", replace(facts, appended=True))
        whole = rules.judge("before_tool", replace(facts, calls=[dict(c) for c in grown]))
        assert fast == whole, (len(grown), fast, whole)
        seen.add((fast.verdict, fast.error is not None))
    assert seen  # (which verdicts a condition meets over these calls varies with it)


@pytest.mark.parametrize(
    "source",
    [
        "calls.exists(c, c.tool == 'a') && true",
        "calls.exists(c, tool == c.tool)",  # reads a phase variable
        "calls.exists(c, c.tool == 'a') // a comment",
        "calls.filter(c, c.ok).size() > 0 || false",
        "size(calls) > 1",
        "calls.exists(args, args.tool == 'a')",  # the call named like a phase variable
    ],
)
def test_only_a_whole_quantifier_with_a_body_of_its_call_is_judged_call_by_call(
    source: str,
) -> None:
    from fsm_agent._rules import cel

    assert cel.quantifier(source, "before_tool") is None


def test_quantifiers_judged_together_give_each_its_own_verdict() -> None:
    """Several quantifiers are evaluated on each call at once (one conversion of the
    call); where one of them errs on a call, each is evaluated alone on it."""
    grown: list[dict[str, Any]] = []
    for ordered in (QUANTIFIED, QUANTIFIED[::-1]):
        rules = RuleSet(
            [Rule(f"q{i}", on="before_tool", tools=["send_email"], when=source, then="deny")
             for i, source in enumerate(ordered)],
            TOOLS,
        )  # fmt: skip
        grown = []
        for step in [executed("search", q="w", result={"n": 0}), executed("fetch_url", url="u"),
                     executed("search", ok=False, q="x", result={"n": 2})]:  # fmt: skip
            grown.append(step)
            facts = Facts(tool="send_email", args={"to": "a"}, calls=grown, call_id="m")
            fast = rules.judge("before_tool", replace(facts, appended=True))
            whole = rules.judge("before_tool", replace(facts, calls=[dict(c) for c in grown]))
            assert fast == whole, (len(grown), fast, whole)


def test_the_inputs_digest_is_form_3_over_the_parts_the_rules_read() -> None:
    """Form 3, as docs/concepts/traces.md defines it: lines ``fsm-agent rule inputs 3``,
    the phase, the call id, then ``name=part`` by name; ``calls`` by its length (the
    trace's chain binds its entries), the same whether the list is kept with the run or
    not."""
    both = "args.to == 'q' || calls.exists(c, c.tool == 'fetch_url')"
    rules = RuleSet([Rule("r", on="before_tool", tools=["send_email"], when=both,
                          then="deny")], TOOLS)  # fmt: skip
    grown = [executed("search", q=str(n)) for n in range(3)]
    lines = ["fsm-agent rule inputs 3", "before_tool", '"m"', 'args={"to":"a\\n"}',
             "calls=count:3"]  # fmt: skip
    expected = "v3:sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()
    facts = Facts(tool="send_email", args={"to": "a\n"}, calls=grown, call_id="m")
    for _ in range(2):  # the second time from the kept log
        fast = rules.judge("before_tool", replace(facts, appended=True))
        whole = rules.judge("before_tool", replace(facts, calls=[dict(c) for c in grown]))
        assert fast.inputs_digest == whole.inputs_digest == expected
    assert rules.judge("before_tool", replace(facts, calls=tuple(grown))).inputs_digest == expected
    grown.append(executed("search", q="3"))
    longer = rules.judge("before_tool", replace(facts, appended=True)).inputs_digest
    assert longer == rules.judge("before_tool", replace(facts, calls=list(grown))).inputs_digest
    assert longer != expected
    # An id that is not ASCII takes the general canonical text (the same text).
    odd = replace(facts, call_id="m\u00e9", calls=[])
    text = "\n".join(["fsm-agent rule inputs 3", "before_tool", '"m\u00e9"',
                      'args={"to":"a\\n"}', "calls=count:0"])  # fmt: skip
    assert rules.judge("before_tool", odd).inputs_digest == (
        "v3:sha256:" + hashlib.sha256(text.encode()).hexdigest()
    )


def test_the_context_enters_the_digest_as_its_digest_trusted_or_not() -> None:
    rules = RuleSet([Rule("c", on="before_tool", when="context.tier == 'x'", then="deny")],
                    TOOLS)  # fmt: skip
    context = {"tier": "gold"}
    lines = ["fsm-agent rule inputs 3", "before_tool", "null", f"context={digest(context)}"]
    expected = "v3:sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()
    trusted = Facts(tool="send_email", context=context, trusted=frozenset({"context"}))
    for facts in (trusted, trusted, replace(trusted, trusted=frozenset())):
        assert rules.judge("before_tool", facts).inputs_digest == expected
    other = replace(trusted, context={"tier": "silver"})
    assert rules.judge("before_tool", other).inputs_digest != expected


def test_an_engine_call_within_cels_limits_is_taken_as_it_is_the_others_screened() -> None:
    """An appended list's entry (the engine's plain JSON) is not walked and copied where
    its canonical text shows it within CEL's limits; at each limit the verdict equals
    the one on a fresh copy (screened in full), errors word for word."""
    rules = RuleSet(EXAMPLE_RULES, TOOLS)
    plain = executed("search", q="x", result={"n": 2**63 - 1, "s": "1" * 30})
    calls = [plain]
    rules.judge("before_tool", Facts(tool="send_email", calls=calls, appended=True))
    (kept,) = rules._entries.log(calls).screened
    assert kept is not plain and kept == plain  # 19 digits: screened in full, the same
    small = executed("search", q="y", result={"n": -(10**17), "deep": [[[1]]]})
    calls.append(small)
    rules.judge("before_tool", Facts(tool="send_email", calls=calls, appended=True))
    assert rules._entries.log(calls).screened[1] is small

    def nested(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value

    for result in ({"n": 2**64}, {"n": -(2**63) - 1}, nested(99), nested(100), {"s": "\ud800"},
                   {"n": 2**63}, {"deep": nested(98)}):  # fmt: skip
        grown = [executed("fetch_url", url="u"), executed("search", q="z", result=result)]
        facts = Facts(tool="send_email", args={"to": "a"}, calls=grown, call_id="m")
        fast = rules.judge("before_tool", replace(facts, appended=True))
        whole = rules.judge("before_tool", replace(facts, calls=json.loads(json.dumps(grown))))
        assert fast == whole, (result, fast, whole)


def test_counters_read_by_field_name_are_given_and_digested_as_those_fields_only() -> None:
    from fsm_agent._rules import cel

    assert cel.selected_fields("counters.model_calls > 2 && counters .tool_rounds < 9",
                               "counters") == frozenset({"model_calls", "tool_rounds"})  # fmt: skip
    assert cel.selected_fields("'counters' == context.x", "counters") == frozenset()
    others = ("size(counters) > 3", "counters.size() > 3", "counters['model_calls'] > 1",
              "counters.exists(k, k == 'x')", "counters.?model_calls.orValue(0) > 1")  # fmt: skip
    for other in others:
        assert cel.selected_fields(other, "counters") is None, other

    def judged(when: str, **counters: Any) -> Judgement:
        rules = RuleSet([Rule("r", on="before_model", when=when, then="deny")], TOOLS)
        facts = Facts(counters={"model_calls": 3, "tool_rounds": 1, **counters}, call_id="m")
        return rules.judge("before_model", facts)

    by_name = "counters.model_calls > 2"
    assert judged(by_name).verdict == "deny"
    assert judged(by_name).inputs_digest == judged(by_name, tool_rounds=7).inputs_digest
    assert judged(by_name).inputs_digest != judged(by_name, model_calls=4).inputs_digest
    lines = ["fsm-agent rule inputs 3", "before_model", '"m"', 'counters={"model_calls":3}']
    expected = "v3:sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()
    assert judged(by_name).inputs_digest == expected
    whole = "size(counters) > 1 && counters.model_calls > 2"
    assert judged(whole).verdict == "deny"
    assert judged(whole).inputs_digest != judged(whole, tool_rounds=7).inputs_digest
    missing = judged("counters.nope > 1")  # no such counter: an error, fails closed
    assert missing.verdict == "deny" and missing.error is not None
    assert "nope" in missing.error


def test_plain_arguments_within_cels_limits_are_not_walked_the_others_screened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Facts.plain`` (the loop's parsed arguments): screened by their canonical text
    where it shows them within CEL's limits, walked in full otherwise; the verdicts
    and digests equal those of the same facts not vouched for, errors word for word."""
    from fsm_agent._rules import cel

    rules = RuleSet(EXAMPLE_RULES, TOOLS)
    walked: list[str] = []
    screen = cel.screen

    def counted(value: Any, where: str) -> Any:
        walked.append(where)
        return screen(value, where)

    monkeypatch.setattr(cel, "screen", counted)
    for args in ({"amount_cents": 7000}, {"amount_cents": 2**64}, {"amount_cents": 10**17},
                 {"amount_cents": 1, "note": "\ud800"}):  # fmt: skip
        facts = Facts(tool="issue_refund", args=args, call_id="c1")
        walked.clear()
        vouched = rules.judge("before_tool", replace(facts, plain=frozenset({"args"})))
        assert walked == ([] if args["amount_cents"] in (7000, 10**17) else ["args"]), args
        assert vouched == rules.judge("before_tool", facts), args


def test_the_fast_constructors_build_what_the_dataclasses_build_every_field() -> None:
    from dataclasses import fields

    given: dict[str, Any] = {
             "tool": "t", "effect": "read", "args": {"a": 1}, "result": [1], "answer": "x",
             "counters": {"model_calls": 1}, "calls": [], "context": {"k": "v"},
             "call_id": "c", "trusted": frozenset({"tool"}), "appended": True,
             "plain": frozenset({"args"})}  # fmt: skip
    assert {f.name for f in fields(Facts)} == set(given)  # a new field needs Facts.of too
    for kwargs in ({}, given):
        fast, slow = Facts.of(**kwargs), Facts(**kwargs)
        assert fast == slow and vars(fast) == vars(slow)
    judged: dict[str, Any] = {
              "phase": "answer", "verdict": "stop", "rule_id": "r", "inputs_digest": "d",
              "detail": "why", "call_id": "c", "error": "e", "tried": ("r",),
              "opaque": ("r",)}  # fmt: skip
    assert {f.name for f in fields(Judgement)} == set(judged)
    assert vars(Judgement.of(**judged)) == vars(Judgement(**judged))
    assert vars(Judgement.of("answer", "pass", None, "d")) == vars(
        Judgement("answer", "pass", None, "d")
    )
    with pytest.raises(AttributeError):
        Facts.of().tool = "x"  # type: ignore[misc]
