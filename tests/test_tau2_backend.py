"""The τ² retail backend (tests/tau2_backend.py) against τ²'s own execution.

τ²'s recorded tasks give, for each call, the output its backend returned, and for each
task the hash of its database before and after. Our backend starts from τ²'s database
(its hash is every task's initial hash); every ground-truth call, through a real
``Runtime`` with the τ² policy as rules, returns what τ² returned (records, strings and
refusals alike); and every task ends at τ²'s final hash. A call that breaks the policy is
denied by the rule's id and leaves the database as it was — including an address change
after an item modification, which τ²'s backend itself would have made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_valid_run, call, calls, say
from tau2_backend import Error, Retail, db_hash, snapshot
from tau2_policy import (
    MUTATIONS,
    RULES,
    Mutant,
    Mutate,
    address_after_items_modified,
    outcome,
    tasks,
)

from fsm_agent import Budget, Runtime, ScriptedModel, check_trace

pytest.importorskip("cel_expr_python")

TASKS = tasks()
INITIAL = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"


#: One backend, its tools and a runtime for every run (registering τ²'s 16 schemas and
#: compiling the rules would be most of the cost of a run): each run starts the backend
#: afresh from the loaded database, and gives the runtime the task's script.
BACKEND = Retail()
TOOLS = BACKEND.tools()
LONGEST = max(len(task["steps"]) for task in TASKS)
RUNTIME = Runtime(
    model=ScriptedModel([]),
    tools=TOOLS,
    allowed_tools=TOOLS.names(),
    rules=RULES,
    budget=Budget(max_tool_rounds=LONGEST + 2, max_model_calls=LONGEST + 3),
)


def drive(
    task: dict[str, Any],
    *,
    upto: int | None = None,
    mutant: Mutant | None = None,
    trace: Path | None = None,
) -> Any:
    """A run on :data:`BACKEND`, from τ²'s database, whose model issues the task's calls
    (its first ``upto``), then the mutant."""
    steps = task["steps"][:upto]
    script: list[Any] = [
        calls(call(f"{s['tool_call_id']}-{i}", s["name"], s["arguments"]))
        for i, s in enumerate(steps)
    ]
    if mutant is not None:
        script.append(calls(call("mutant", mutant[0], mutant[1])))
    return run(script, json.dumps(task["user_scenario"]["instructions"]), trace)


def drive_calls(made: list[tuple[str, dict[str, Any]]]) -> Any:
    """A run on :data:`BACKEND` whose model makes these calls, one a round."""
    script = [calls(call(f"call-{i}", name, args)) for i, (name, args) in enumerate(made)]
    return run(script, "Help me with my order.", None)


def run(script: list[Any], task: str, trace: Path | None) -> Any:
    BACKEND.reset()
    RUNTIME.model = ScriptedModel([*script, say("All done.")])
    result = RUNTIME.run(task, trace=trace)
    assert_valid_run(result)
    if trace is not None:
        report = check_trace(trace)
        assert report.ok, report.violations
    assert (result.status, result.reason) == ("done", "final_answer"), result.detail
    return result


def answers(result: Any) -> dict[str, Any]:
    return {m["tool_call_id"]: json.loads(m["content"]) for m in result.messages
            if m["role"] == "tool"}  # fmt: skip


def recorded(step: dict[str, Any]) -> dict[str, Any]:
    """The engine's answer to a call whose tool returned what τ² recorded."""
    if step["error"]:  # τ² writes a refusal as "Error: <why>"; ours raises Error(<why>)
        return {"ok": False, "error": "rejected", "detail": step["output"], "attempts": 1}
    return {"ok": True, "value": outcome(step)}


def test_the_database_is_the_one_every_task_starts_from() -> None:
    backend = Retail()
    assert {task["db_hash_initial"] for task in TASKS} == {INITIAL}
    assert backend.hash() == INITIAL
    assert db_hash(backend.tables) == INITIAL  # the same, computed from scratch
    assert {name: len(rows) for name, rows in backend.tables.items()} == {
        "orders": 1000, "products": 50, "users": 500}  # fmt: skip


def test_a_write_changes_the_hash_and_only_its_own_backend() -> None:
    """The incremental hash is the full one after writes, and the loaded database (shared
    by every backend) is never edited: copy-on-write holds."""
    backend = Retail()
    # A gift-card order: cancelling it credits the card (a user) and edits the order.
    order = backend.cancel_pending_order("#W6779827", "no longer needed")
    assert order["status"] == "cancelled"
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": 4079.45,
                                            "payment_method_id": "gift_card_7219486"}  # fmt: skip
    user = backend.get_user_details(order["user_id"])
    before = snapshot().tables["users"][order["user_id"]]["payment_methods"]
    card, was = user["payment_methods"]["gift_card_7219486"], before["gift_card_7219486"]
    assert card["balance"] == round(was["balance"] + 4079.45, 2)
    assert backend.hash() == db_hash(backend.tables) != INITIAL
    assert Retail().hash() == db_hash(snapshot().tables) == INITIAL
    assert snapshot().tables["orders"]["#W6779827"]["status"] == "pending"


#: Orders and what they hold, from τ²'s database: a pending one (paid by credit card; its
#: user has no other payment method), a delivered one, one whose user has a second card,
#: one whose user has a gift card of $22.00.
PENDING, DELIVERED, TWO_CARDS, SMALL_GIFT_CARD = "#W5918442", "#W6304490", "#W7303089", "#W2443586"
ADDRESS = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX",
           "country": "USA", "zip": "78701"}  # fmt: skip

#: τ²'s refusals (its retail tools' ``ValueError`` texts), one call for each.
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("get_order_details", {"order_id": "#W0000000"}, "Order not found"),
    ("get_user_details", {"user_id": "nobody_0000"}, "User not found"),
    ("get_product_details", {"product_id": "0000000000"}, "Product not found"),
    ("get_item_details", {"item_id": "0000000000"}, "Item not found"),
    ("find_user_id_by_email", {"email": "nobody@example.com"}, "User not found"),
    ("find_user_id_by_name_zip", {"first_name": "Sofia", "last_name": "Rossi", "zip": "00000"},
     "User not found"),
    ("calculate", {"expression": "__import__('os')"}, "Invalid characters in expression"),
    ("cancel_pending_order", {"order_id": DELIVERED, "reason": "no longer needed"},
     "Non-pending order cannot be cancelled"),
    ("cancel_pending_order", {"order_id": PENDING, "reason": "changed my mind"},
     "Invalid reason"),
    ("exchange_delivered_order_items", {"order_id": PENDING, "item_ids": [],
     "new_item_ids": [], "payment_method_id": "credit_card_5051208"},
     "Non-delivered order cannot be exchanged"),
    ("exchange_delivered_order_items", {"order_id": DELIVERED,
     "item_ids": ["6956751343", "6956751343"], "new_item_ids": ["6843647669", "6843647669"],
     "payment_method_id": "credit_card_4420174"}, "Number of 6956751343 not found."),
    ("exchange_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["6956751343"],
     "new_item_ids": [], "payment_method_id": "credit_card_4420174"},
     "The number of items to be exchanged should match."),
    ("exchange_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["6956751343"],
     "new_item_ids": ["0000000000"], "payment_method_id": "credit_card_4420174"},
     "Variant not found"),
    ("exchange_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["4983901480"],
     "new_item_ids": ["8722653925"], "payment_method_id": "credit_card_4420174"},
     "New item 8722653925 not found or available"),
    ("exchange_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["6956751343"],
     "new_item_ids": ["6843647669"], "payment_method_id": "credit_card_0000000"},
     "Payment method not found"),
    ("return_delivered_order_items", {"order_id": PENDING, "item_ids": ["1725100896"],
     "payment_method_id": "credit_card_5051208"}, "Non-delivered order cannot be returned"),
    ("return_delivered_order_items", {"order_id": TWO_CARDS, "item_ids": [],
     "payment_method_id": "paypal_2568958"},
     "Payment method should be the original payment method"),
    ("return_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["0000000000"],
     "payment_method_id": "credit_card_4420174"}, "Some item not found"),
    ("modify_pending_order_items", {"order_id": DELIVERED, "item_ids": [], "new_item_ids": [],
     "payment_method_id": "credit_card_4420174"}, "Non-pending order cannot be modified"),
    ("modify_pending_order_items", {"order_id": PENDING,
     "item_ids": ["5312063289", "5312063289"], "new_item_ids": ["6843647669", "6843647669"],
     "payment_method_id": "credit_card_5051208"}, "5312063289 not found"),
    ("modify_pending_order_items", {"order_id": PENDING, "item_ids": ["5312063289"],
     "new_item_ids": [], "payment_method_id": "credit_card_5051208"},
     "The number of items to be exchanged should match"),
    ("modify_pending_order_items", {"order_id": PENDING, "item_ids": ["5312063289"],
     "new_item_ids": ["5312063289"], "payment_method_id": "credit_card_5051208"},
     "The new item id should be different from the old item id"),
    ("modify_pending_order_items", {"order_id": PENDING, "item_ids": ["1725100896"],
     "new_item_ids": ["1002370030"], "payment_method_id": "credit_card_5051208"},
     "New item 1002370030 not found or available"),
    ("modify_pending_order_items", {"order_id": SMALL_GIFT_CARD, "item_ids": ["9690244451"],
     "new_item_ids": ["7706410293"], "payment_method_id": "gift_card_2742113"},
     "Insufficient gift card balance to pay for the new item"),
    ("modify_pending_order_payment", {"order_id": DELIVERED,
     "payment_method_id": "credit_card_4420174"}, "Non-pending order cannot be modified"),
    ("modify_pending_order_payment", {"order_id": PENDING,
     "payment_method_id": "credit_card_0000000"}, "Payment method not found"),
    ("modify_pending_order_payment", {"order_id": PENDING,
     "payment_method_id": "credit_card_5051208"},
     "The new payment method should be different from the current one"),
    ("modify_pending_order_payment", {"order_id": SMALL_GIFT_CARD,
     "payment_method_id": "gift_card_2742113"},
     "Insufficient gift card balance to pay for the order"),
    ("modify_pending_order_address", {"order_id": DELIVERED, **ADDRESS},
     "Non-pending order cannot be modified"),
    ("modify_user_address", {"user_id": "nobody_0000", **ADDRESS}, "User not found"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tool", "arguments", "why"), REFUSALS, ids=[f"{t}:{w}" for t, _, w in REFUSALS]
)
def test_a_refusal_is_taus_own_text_and_changes_nothing(
    tool: str, arguments: dict[str, Any], why: str
) -> None:
    backend = Retail()
    with pytest.raises(Error) as refused:
        getattr(backend, tool)(**arguments)
    assert str(refused.value) == why
    assert backend.hash() == INITIAL
    # Through the engine: the detail the model reads is τ²'s own output for it.
    (answer,) = answers(drive_calls([(tool, arguments)])).values()
    assert answer == {"ok": False, "error": "rejected", "detail": f"Error: {why}", "attempts": 1}
    assert BACKEND.hash() == INITIAL


def test_calculate_is_arithmetic_rounded_to_cents() -> None:
    backend = Retail()
    assert backend.calculate("(272.33 - 261.38) * 2 / 3") == "7.3"
    assert backend.calculate("2 + 2") == "4.0"  # τ²'s own test of it
    assert backend.calculate("-(1 + 2) ** 2 // 4") == "-3.0"
    with pytest.raises(Error, match="division by zero"):
        backend.calculate("1 / 0")


def test_every_task_replayed_on_the_backend_ends_in_taus_final_state(tmp_path: Path) -> None:
    denied: dict[tuple[str, int], str] = {}
    ran = equal = hashes = 0
    for n, task in enumerate(TASKS):
        trace = tmp_path / f"{task['task_id']}.jsonl" if n % 12 == 0 else None
        got = answers(drive(task, trace=trace))
        for i, step in enumerate(task["steps"]):
            answer = got[f"{step['tool_call_id']}-{i}"]
            if answer.get("error") == "denied_by_rule":
                denied[(str(task["task_id"]), i)] = answer["rule"]
                continue
            ran += 1
            assert answer == recorded(step), (task["task_id"], i, step["name"])
            equal += 1
        assert BACKEND.hash() == task["db_hash_final"], task["task_id"]
        hashes += 1
    # The one ground-truth call the rules deny is one τ²'s backend refused as well...
    assert denied == {("64", 6): "delivered-only"}
    step = TASKS[64]["steps"][6]
    assert step["output"] == "Error: Non-delivered order cannot be exchanged"
    # ...and so does ours, in the state the rest of the task leaves.
    drive(TASKS[64])
    with pytest.raises(Error) as refused:
        BACKEND.exchange_delivered_order_items(**step["arguments"])
    assert f"Error: {refused.value}" == step["output"]
    calls_in_tasks = sum(len(task["steps"]) for task in TASKS)
    assert (len(TASKS), calls_in_tasks, ran, equal, hashes) == (114, 550, 549, 549, 114)


@pytest.mark.parametrize(
    ("mutate", "rule"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_a_call_breaking_the_policy_is_denied_and_the_state_is_unchanged(
    mutate: Mutate, rule: str, tmp_path: Path
) -> None:
    mutated = [(task, m) for task in TASKS if (m := mutate(task)) is not None]
    assert len(mutated) >= 10
    rule_alone = mutate is address_after_items_modified
    for n, (task, mutant) in enumerate(mutated):
        trace = tmp_path / f"{n}.jsonl" if n < 3 else None
        answer = answers(drive(task, upto=mutant[2], mutant=mutant, trace=trace))["mutant"]
        assert (answer["error"], answer["rule"]) == ("denied_by_rule", rule), task["task_id"]
        # The state the calls before it leave (the replay test proves the engine's runs
        # reach it; here the tools are called directly, which is quicker).
        without = Retail()
        for step in task["steps"][: mutant[2]]:
            try:
                getattr(without, step["name"])(**step["arguments"])
            except Error:
                assert step["error"]
        assert BACKEND.hash() == without.hash(), task["task_id"]
        if mutant[2] == len(task["steps"]):
            assert BACKEND.hash() == task["db_hash_final"]
        # Had it run: τ²'s backend refuses every mutant but one kind, which it would have
        # executed (the rule alone keeps the state).
        if rule_alone:
            getattr(BACKEND, mutant[0])(**mutant[1])
            assert BACKEND.hash() != without.hash()
        else:
            with pytest.raises(Error):
                getattr(BACKEND, mutant[0])(**mutant[1])
            assert BACKEND.hash() == without.hash()
