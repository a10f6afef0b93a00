"""The τ²-bench retail policy as rules, judged on the 114 recorded ground-truth tasks.

Every call τ² executed successfully passes the rules; the one recorded call τ² itself
refused (an exchange of a pending order, task 64) the rules deny too. Then calls mutated
to break the policy are denied, each by the rule that says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tau2_policy import RULES, Judged, executed, outcome, policy, steps_with_facts, tasks

from fsm_agent._rules import Facts, RuleSet

# CEL conditions need the `cel` extra (CPython 3.11+); without it these tests cannot run.
pytest.importorskip("cel_expr_python")

TASKS = tasks()


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return policy()


def test_every_ground_truth_call_tau2_executed_passes(rules: RuleSet) -> None:
    judged = [j for task in TASKS for j in steps_with_facts(task)]
    assert len(judged) == 550
    denied = {
        (j.task_id, j.index): rules.judge("before_tool", j.facts).rule_id
        for j in judged
        if rules.judge("before_tool", j.facts).verdict != "pass"
    }
    # The only call denied is the one τ² refused as well ("non-delivered order cannot be
    # exchanged"): the rules and τ²'s backend agree on every recorded call.
    assert denied == {("64", 6): "delivered-only"}
    refused = next(j.step for j in judged if (j.task_id, j.index) == ("64", 6))
    assert refused["error"] and "delivered" in refused["output"]
    # The one other write τ² refused is for a fact the run never saw (the gift card's
    # balance against the price difference of items it did not look up): passed here,
    # refused by the backend, as a tool error.
    refused_only_by_tau2 = {
        (j.task_id, j.index)
        for j in judged
        if j.step["error"] and j.step["name"] in _WRITES and (j.task_id, j.index) not in denied
    }
    assert refused_only_by_tau2 == {("105", 0)}


_WRITES = {
    "cancel_pending_order",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
}


def _orders_seen(judged: Judged) -> Iterator[dict[str, Any]]:
    """The order records among a step's executed calls (latest last)."""
    for call in judged.facts.calls:
        result = call["result"]
        if call["ok"] and isinstance(result, dict) and "status" in result and "order_id" in result:
            yield result


def mutants(
    make: Callable[[Judged, dict[str, Any]], tuple[str, dict[str, Any]] | None],
) -> list[Facts]:
    """For each step of each task, and each order seen before it, the call ``make`` builds
    (or none), judged with the facts of that step."""
    out: list[Facts] = []
    for task in TASKS:
        for judged in steps_with_facts(task):
            latest: dict[str, dict[str, Any]] = {}
            for order in _orders_seen(judged):
                latest[order["order_id"]] = order
            for order in latest.values():
                built = make(judged, order)
                if built is not None:
                    tool, args = built
                    out.append(Facts(tool=tool, args=args, calls=judged.facts.calls))
    return out


def verdicts(rules: RuleSet, facts: list[Facts]) -> set[tuple[str, str | None]]:
    return {(j.verdict, j.rule_id) for j in (rules.judge("before_tool", f) for f in facts)}


def test_cancelling_or_modifying_an_order_that_is_not_pending_is_denied(rules: RuleSet) -> None:
    def cancel(judged: Judged, order: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        if order["status"] == "pending":
            return None
        return "cancel_pending_order", {"order_id": order["order_id"], "reason": "no longer needed"}

    def readdress(judged: Judged, order: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        if order["status"] == "pending":
            return None
        return "modify_pending_order_address", {"order_id": order["order_id"], **order["address"]}

    cancels, readdresses = mutants(cancel), mutants(readdress)
    assert len(cancels) > 100 and len(readdresses) == len(cancels)
    assert verdicts(rules, cancels + readdresses) == {("deny", "pending-only-cancel-or-modify")}


def test_returning_or_exchanging_an_order_that_is_not_delivered_is_denied(rules: RuleSet) -> None:
    def give_back(judged: Judged, order: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        if order["status"] == "delivered":
            return None
        paid = order["payment_history"][0]["payment_method_id"]
        items = [item["item_id"] for item in order["items"]][:1]
        return "return_delivered_order_items", {
            "order_id": order["order_id"],
            "item_ids": items,
            "payment_method_id": paid,
        }

    returns = mutants(give_back)
    exchanges = [
        Facts(
            tool="exchange_delivered_order_items",
            args={**f.variable("args"), "new_item_ids": f.variable("args")["item_ids"]},
            calls=f.calls,
        )
        for f in returns
    ]
    assert len(returns) > 50
    assert verdicts(rules, returns) == {("deny", "delivered-only")}
    for facts in exchanges:
        judged = rules.judge("before_tool", facts)
        # An order whose items were already changed is denied by the rule listed first.
        changed = any(
            c["ok"]
            and c["tool"] in _ITEM_CHANGES
            and c["args"]["order_id"] == facts.variable("args")["order_id"]
            for c in facts.calls
        )
        expected = "one-exchange-or-modify" if changed else "delivered-only"
        assert (judged.verdict, judged.rule_id) == ("deny", expected)


_ITEM_CHANGES = ("exchange_delivered_order_items", "modify_pending_order_items")


def test_a_refund_to_a_method_the_order_was_not_paid_with_is_denied(rules: RuleSet) -> None:
    denied = 0
    for task in TASKS:
        for judged in steps_with_facts(task):
            if judged.step["name"] != "return_delivered_order_items" or judged.step["error"]:
                continue
            args = judged.step["arguments"]
            # Another of the user's cards, or one of nobody's: neither paid for the order.
            for other in ("credit_card_0000000", "paypal_0000000"):
                if other == args["payment_method_id"]:
                    continue
                mutated = Facts(
                    tool=judged.step["name"],
                    args={**args, "payment_method_id": other},
                    calls=judged.facts.calls,
                )
                judgement = rules.judge("before_tool", mutated)
                seen = any(o["order_id"] == args["order_id"] for o in _orders_seen(judged))
                expected = ("deny", "refund-to-original-or-gift-card") if seen else ("pass", None)
                assert (judgement.verdict, judgement.rule_id) == expected, (judged.task_id, other)
                denied += seen
            # A gift card is always a legal refund target.
            gift = {**args, "payment_method_id": "gift_card_0000000"}
            ok = rules.judge(
                "before_tool", Facts(tool=judged.step["name"], args=gift, calls=judged.facts.calls)
            )
            assert ok.verdict == "pass"
    assert denied > 40


def test_a_second_exchange_or_modify_of_an_order_is_denied(rules: RuleSet) -> None:
    repeated = []
    for task in TASKS:
        calls: list[dict[str, Any]] = []
        for step in task["steps"]:
            calls.append(executed(step))
            if (
                step["name"] in ("exchange_delivered_order_items", "modify_pending_order_items")
                and not step["error"]
            ):
                for again in ("exchange_delivered_order_items", "modify_pending_order_items"):
                    repeated.append(Facts(tool=again, args=step["arguments"], calls=tuple(calls)))
    assert len(repeated) > 100
    assert verdicts(rules, repeated) == {("deny", "one-exchange-or-modify")}


def test_the_policy_is_one_hashed_value_that_round_trips(rules: RuleSet) -> None:
    from tau2_policy import TOOLS

    assert [r.id for r in rules.rules] == [r.id for r in RULES]
    rebuilt = RuleSet.from_json(json.loads(json.dumps(rules.to_json())), TOOLS)
    assert rebuilt.hash == rules.hash
    assert rules.opaque_rules == ()


def test_outputs_are_read_as_the_tools_returned_them() -> None:
    assert outcome({"output": '{"a": 1}'}) == {"a": 1}
    assert outcome({"output": "Error: Order not found"}) == "Error: Order not found"
    assert outcome({"output": "{not json"}) == "{not json"
