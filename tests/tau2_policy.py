"""The τ²-bench retail policy as rules, over the real tool schemas (reusable by tests).

The policy's own words (τ²-bench ``retail/policy.md``) these rules encode:

* "An order can only be cancelled if its status is 'pending'", and likewise modified
  (address, payment, items) — rules ``pending-only-*``;
* "An order can only be returned or exchanged if its status is 'delivered'" —
  ``delivered-only``;
* a return's "refund must either go to the original payment method, or an existing gift
  card" — ``refund-to-original-or-gift-card``;
* "exchange or modify order items can only be done once" per order —
  ``one-exchange-or-modify``, first in the list: a second exchange is also of an order no
  longer delivered, and the rule that says why is the one that should decide.

The rules read what the agent saw: the latest order record among the run's executed calls
(``get_order_details``, and the write tools, which return the updated order), and the
payment method ids (τ² names each by its kind: ``gift_card_…``). A rule denies on what
the run has seen: the recorded ground truth often writes to an order it did not read in
that trajectory, so an order with no record in the run is not denied for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsm_agent._rules import Facts, Rule, RuleSet, ToolInfo

CORPUS = Path(__file__).parent / "data" / "tau2_retail"
TOOL_SPECS: list[dict[str, Any]] = json.loads(
    (CORPUS / "tau2_retail_tools.json").read_text(encoding="utf-8")
)
TOOLS = {
    spec["schema"]["function"]["name"]: ToolInfo(
        effect="write" if spec["mutates_state"] else "read",
        schema=spec["schema"]["function"]["parameters"],
    )
    for spec in TOOL_SPECS
}

#: The statuses of this order in the records the run has seen, oldest first. Records of
#: other shapes (a user, a product, an error string) are skipped by the type test, which
#: CEL's `&&` evaluates first: a false left side absorbs the right side's error.
_STATUSES = (
    "calls.filter(c, c.ok && type(c.result) == map && 'order_id' in c.result"
    " && 'status' in c.result && c.result.order_id == args.order_id)"
    ".map(c, c.result.status)"
)


def _latest_status_is_not(status: str) -> str:
    return f"size({_STATUSES}) > 0 && {_STATUSES}[size({_STATUSES}) - 1] != '{status}'"


#: Whether the run has seen the order's record (its payment history).
_ORDER_SEEN = (
    "calls.exists(c, c.ok && type(c.result) == map && 'payment_history' in c.result"
    " && c.result.order_id == args.order_id)"
)

#: The order's original payment: one of its payment_history payments.
_PAID_WITH = (
    "calls.exists(c, c.ok && type(c.result) == map && 'payment_history' in c.result"
    " && c.result.order_id == args.order_id && c.result.payment_history.exists(p,"
    " p.transaction_type == 'payment' && p.payment_method_id == args.payment_method_id))"
)

#: A gift card (τ² names every payment method by its kind).
_GIFT_CARD = "args.payment_method_id.startsWith('gift_card_')"

RULES = [
    Rule(
        "one-exchange-or-modify",
        on="before_tool",
        tools=["exchange_delivered_order_items", "modify_pending_order_items"],
        when=(
            "calls.exists(c, c.ok && c.tool in"
            " ['exchange_delivered_order_items', 'modify_pending_order_items']"
            " && c.args.order_id == args.order_id)"
        ),
        then="deny",
        message="an order's items can be exchanged or modified once",
    ),
    Rule(
        "pending-only-cancel-or-modify",
        on="before_tool",
        tools=["cancel_pending_order", "modify_pending_order_*"],
        when=_latest_status_is_not("pending"),
        then="deny",
        message="only pending orders can be cancelled or modified",
    ),
    Rule(
        "delivered-only",
        on="before_tool",
        tools=["return_delivered_order_items", "exchange_delivered_order_items"],
        when=_latest_status_is_not("delivered"),
        then="deny",
        message="only delivered orders can be returned or exchanged",
    ),
    Rule(
        "refund-to-original-or-gift-card",
        on="before_tool",
        tools=["return_delivered_order_items"],
        when=f"!({_GIFT_CARD}) && {_ORDER_SEEN} && !({_PAID_WITH})",
        then="deny",
        message="a refund goes to the order's original payment method or a gift card",
    ),
]


def policy() -> RuleSet:
    return RuleSet(RULES, TOOLS)


def tasks() -> list[dict[str, Any]]:
    text = (CORPUS / "tau2_retail_gt_trajectories.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def outcome(step: dict[str, Any]) -> Any:
    """A step's output as the tool returned it: τ²'s tools return JSON text for records."""
    output = step["output"]
    if isinstance(output, str) and output[:1] in "{[":
        try:
            return json.loads(output)
        except ValueError:
            return output
    return output


def executed(step: dict[str, Any]) -> dict[str, Any]:
    """A step as an entry of ``calls``."""
    return {
        "tool": step["name"],
        "args": step["arguments"],
        "ok": not step["error"],
        "result": outcome(step),
    }


@dataclass(frozen=True)
class Judged:
    task_id: str
    index: int
    step: dict[str, Any]
    facts: Facts


def steps_with_facts(task: dict[str, Any]) -> Iterator[Judged]:
    """Every step of a task with the facts a ``before_tool`` judgement would see."""
    calls: list[dict[str, Any]] = []
    for index, step in enumerate(task["steps"]):
        facts = Facts(
            tool=step["name"],
            args=step["arguments"],
            calls=tuple(calls),
            call_id=f"{step['tool_call_id']}-{index}",
        )
        yield Judged(str(task["task_id"]), index, step, facts)
        calls.append(executed(step))


# --- calls that break the policy, made from real trajectories ---------------------------

#: A call breaking the policy, and how many of the task's steps come before it.
Mutant = tuple[str, dict[str, Any], int]
Mutate = Callable[[dict[str, Any]], "Mutant | None"]


def orders_seen(task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The latest record of each order the trajectory read."""
    seen: dict[str, dict[str, Any]] = {}
    for step in task["steps"]:
        record = outcome(step)
        if not step["error"] and isinstance(record, dict) and "payment_history" in record:
            seen[record["order_id"]] = record
    return seen


def cancel_delivered(task: dict[str, Any]) -> Mutant | None:
    """After the whole trajectory: cancel an order it saw delivered."""
    order = next((o for o in orders_seen(task).values() if o["status"] == "delivered"), None)
    if order is None:
        return None
    args = {"order_id": order["order_id"], "reason": "no longer needed"}
    return "cancel_pending_order", args, len(task["steps"])


def refund_elsewhere(task: dict[str, Any]) -> Mutant | None:
    """In place of the trajectory's return: the refund to a card that did not pay."""
    returns = [i for i, s in enumerate(task["steps"])
               if s["name"] == "return_delivered_order_items" and not s["error"]]  # fmt: skip
    at = returns[0] if returns else None
    if at is None:
        return None
    step = task["steps"][at]
    if step["arguments"]["order_id"] not in orders_seen({"steps": task["steps"][:at]}):
        return None
    return step["name"], {**step["arguments"], "payment_method_id": "credit_card_0000000"}, at


def second_exchange(task: dict[str, Any]) -> Mutant | None:
    """After the whole trajectory: its exchange (or modify) of items, again."""
    names = ("exchange_delivered_order_items", "modify_pending_order_items")
    step = next((s for s in task["steps"] if s["name"] in names and not s["error"]), None)
    return None if step is None else (step["name"], step["arguments"], len(task["steps"]))


def address_after_items_modified(task: dict[str, Any]) -> Mutant | None:
    """After the whole trajectory: a new shipping address for an order whose items it
    modified. The policy: after modifying items "the agent will not be able to modify or
    cancel the order anymore"; τ²'s backend would take it ("pending (item modified)"
    passes its loose test of pending), so here the rule alone stops a change."""
    modified = [s for s in task["steps"] if s["name"] == "modify_pending_order_items"]
    step = next((s for s in modified if not s["error"]), None)
    if step is None:
        return None
    address = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX",
               "country": "USA", "zip": "78701"}  # fmt: skip
    args = {"order_id": step["arguments"]["order_id"], **address}
    return "modify_pending_order_address", args, len(task["steps"])


#: Each mutation (its test id, how it is made) and the rule that must deny it.
MUTATIONS: list[tuple[str, Mutate, str]] = [
    ("cancel-a-delivered-order", cancel_delivered, "pending-only-cancel-or-modify"),
    ("refund-to-another-card", refund_elsewhere, "refund-to-original-or-gift-card"),
    ("a-second-exchange", second_exchange, "one-exchange-or-modify"),
    ("address-after-items-modified", address_after_items_modified,
     "pending-only-cancel-or-modify"),
]  # fmt: skip
