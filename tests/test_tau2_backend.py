"""The τ² retail backend (tests/tau2_backend.py) against τ²'s own execution.

τ²'s recorded tasks give, for each call, the output its backend returned, and for each
task the hash of its database before and after. Our backend starts from τ²'s database
(its hash is every task's initial hash); every ground-truth call, through a real
``Runtime`` with the τ² policy as rules, returns what τ² returned (records, strings and
refusals alike); and every task ends at τ²'s final hash. A call that breaks the policy is
denied by the rule's id and leaves the database as it was.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import assert_valid_run, call, calls, say
from tau2_backend import Error, Retail, db_hash, snapshot
from tau2_policy import MUTATIONS, RULES, Mutant, Mutate, outcome, tasks

from fsm_agent import Budget, Runtime, ScriptedModel

pytest.importorskip("cel_expr_python")

TASKS = tasks()
INITIAL = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"


def drive(
    task: dict[str, Any], backend: Retail, *, upto: int | None = None, mutant: Mutant | None = None
) -> Any:
    """A run whose model issues the task's calls (its first ``upto``), then the mutant."""
    steps = task["steps"][:upto]
    script: list[Any] = [
        calls(call(f"{s['tool_call_id']}-{i}", s["name"], s["arguments"]))
        for i, s in enumerate(steps)
    ]
    if mutant is not None:
        script.append(calls(call("mutant", mutant[0], mutant[1])))
    script.append(say("All done."))
    tools = backend.tools()
    runtime = Runtime(
        model=ScriptedModel(script),
        tools=tools,
        allowed_tools=tools.names(),
        rules=RULES,
        budget=Budget(max_tool_rounds=len(steps) + 2, max_model_calls=40, max_total_calls=60),
    )
    result = runtime.run(json.dumps(task["user_scenario"]["instructions"]))
    assert_valid_run(result)
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


def test_a_refused_call_is_taus_refusal_and_changes_nothing() -> None:
    backend = Retail()
    with pytest.raises(Error, match="^Non-pending order cannot be cancelled$"):
        backend.cancel_pending_order("#W2378156", "no longer needed")  # delivered
    with pytest.raises(Error, match="^Invalid reason$"):
        backend.cancel_pending_order("#W6779827", "changed my mind")
    with pytest.raises(Error, match="^Invalid characters in expression$"):
        backend.calculate("__import__('os')")
    assert backend.calculate("(272.33 - 261.38) * 2 / 3") == "7.3"
    assert backend.hash() == INITIAL


def test_every_task_replayed_on_the_backend_ends_in_taus_final_state() -> None:
    denied: dict[tuple[str, int], str] = {}
    ran = equal = hashes = 0
    for task in TASKS:
        backend = Retail()
        got = answers(drive(task, backend))
        for i, step in enumerate(task["steps"]):
            answer = got[f"{step['tool_call_id']}-{i}"]
            if answer.get("error") == "denied_by_rule":
                denied[(str(task["task_id"]), i)] = answer["rule"]
                continue
            ran += 1
            assert answer == recorded(step), (task["task_id"], i, step["name"])
            equal += 1
        assert backend.hash() == task["db_hash_final"], task["task_id"]
        hashes += 1
    # The one ground-truth call the rules deny is one τ²'s backend refused as well...
    assert denied == {("64", 6): "delivered-only"}
    step = TASKS[64]["steps"][6]
    assert step["output"] == "Error: Non-delivered order cannot be exchanged"
    # ...and so does ours, in the state the rest of the task leaves.
    backend = Retail()
    drive(TASKS[64], backend)
    with pytest.raises(Error, match="^Non-delivered order cannot be exchanged$"):
        backend.exchange_delivered_order_items(**step["arguments"])
    calls_in_tasks = sum(len(task["steps"]) for task in TASKS)
    assert (len(TASKS), calls_in_tasks, ran, equal, hashes) == (114, 550, 549, 549, 114)


@pytest.mark.parametrize(
    ("mutate", "rule"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_a_call_breaking_the_policy_is_denied_and_the_state_is_unchanged(
    mutate: Mutate, rule: str
) -> None:
    mutated = [(task, m) for task in TASKS if (m := mutate(task)) is not None]
    assert len(mutated) >= 10
    for task, mutant in mutated:
        without = Retail()
        drive(task, without, upto=mutant[2])
        backend = Retail()
        answer = answers(drive(task, backend, upto=mutant[2], mutant=mutant))["mutant"]
        assert (answer["error"], answer["rule"]) == ("denied_by_rule", rule), task["task_id"]
        assert backend.hash() == without.hash(), task["task_id"]
        if mutant[2] == len(task["steps"]):
            assert backend.hash() == task["db_hash_final"]
        # τ²'s backend would have refused it too: the policy and τ² agree on each.
        with pytest.raises(Error):
            getattr(backend, mutant[0])(**mutant[1])
        assert backend.hash() == without.hash()
