"""τ²-bench's retail backend, ours: its tools as Python functions over its database.

Test support code. :class:`Retail` holds one copy of τ²'s retail database
(``data/tau2_retail/db.json.gz``, see the README there) and answers the corpus's tools,
reads and writes, as τ²'s own backend does: the same records, the same effects on the
database (down to float rounding), the same refusals. A refusal raises :class:`Error`, a
``ToolRejected``, so the engine answers ``{"ok": false, "error": "rejected", "detail":
"Error: <why>"}`` — the detail is τ²'s own text for it. :meth:`Retail.tools` registers
them as fsm-agent tools, with the corpus's schemas and read/write labels.

:meth:`Retail.hash` is τ²'s ``db_hash``: SHA-256 of the database (as τ²'s data model
dumps it, every optional field present) written as JSON with sorted keys and Python's
default separators. The database is loaded once; each :class:`Retail` shares its records
and copies one only when a write first touches it, and the hash reuses the text of every
record no write touched, so a fresh backend and its hash cost next to nothing per task.
"""

from __future__ import annotations

import ast
import copy
import functools
import gzip
import hashlib
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tau2_policy import CORPUS, TOOL_SPECS

from fsm_agent import ToolRegistry, ToolRejected

DB_PATH = CORPUS / "db.json.gz"

Record = dict[str, Any]
Tables = dict[str, dict[str, Record]]

#: The order fields τ²'s data model defaults to null; the database file leaves them out,
#: the model's dump (what τ² hashes and returns) has them.
ORDER_DEFAULTS = (
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "exchange_price_difference",
    "return_items",
    "return_payment_method_id",
)

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class Error(ToolRejected):
    """τ²'s backend refused the call (τ² raises ``ValueError``). Named so that the
    engine's detail, ``"<class>: <message>"``, reads exactly as τ²'s output for it,
    ``Error: <why>``."""


def canonical_text(value: Any) -> str:
    """The text τ² hashes: JSON with sorted keys and Python's default separators."""
    return json.dumps(value, sort_keys=True)


def db_hash(tables: Tables) -> str:
    """τ²'s hash of a database, computed from scratch (see :meth:`Retail.hash`)."""
    return hashlib.sha256(canonical_text(tables).encode()).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """The database as loaded, and each record's canonical text (for the hash)."""

    tables: Tables
    texts: dict[str, dict[str, str]]


@functools.cache
def snapshot() -> Snapshot:
    """τ²'s retail database, loaded once; nothing may mutate it (:class:`Retail` copies)."""
    with gzip.open(DB_PATH, "rt", encoding="utf-8") as f:
        tables: Tables = json.load(f)
    if sorted(tables) != ["orders", "products", "users"]:
        raise ValueError(f"{DB_PATH}: expected the tables orders, products, users")
    for order in tables["orders"].values():
        for field in ORDER_DEFAULTS:
            order.setdefault(field, None)
    texts = {name: {key: canonical_text(row) for key, row in rows.items()}
             for name, rows in tables.items()}  # fmt: skip
    return Snapshot(tables, texts)


class Retail:
    """One τ² retail backend, starting from the database as τ² ships it.

    Its tool methods return the database's own records (shared with the snapshot until
    a write owns them): read, never edit, what they return; :meth:`tools` copies."""

    def __init__(self, base: Snapshot | None = None) -> None:
        self._base = base if base is not None else snapshot()
        self.tables: Tables = {}
        self._owned: set[tuple[str, str]] = set()
        self.reset()

    def reset(self) -> None:
        """Back to the database as loaded (its registered tools stay valid)."""
        # Shallow copies: a record is shared with the snapshot until a write owns it.
        self.tables = {name: dict(rows) for name, rows in self._base.tables.items()}
        self._owned = set()

    # --- the state -------------------------------------------------------------------

    def hash(self) -> str:
        """τ²'s ``db_hash`` of this backend's database: the same bytes as
        :func:`db_hash` hashes, with the text of untouched records taken as loaded."""
        parts = []
        for name in sorted(self.tables):
            rows, texts = self.tables[name], self._base.texts[name]
            body = ", ".join(
                f"{json.dumps(key)}: "
                f"{canonical_text(rows[key]) if (name, key) in self._owned else texts[key]}"
                for key in sorted(rows)
            )
            parts.append(f"{json.dumps(name)}: {{{body}}}")
        return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()

    def _own(self, table: str, key: str) -> Record:
        """The record, this backend's own copy of it (made on the first write)."""
        if (table, key) not in self._owned:
            self.tables[table][key] = copy.deepcopy(self.tables[table][key])
            self._owned.add((table, key))
        return self.tables[table][key]

    # --- lookups, with τ²'s refusals ---------------------------------------------------

    def _order(self, order_id: str) -> Record:
        if order_id not in self.tables["orders"]:
            raise Error("Order not found")
        return self.tables["orders"][order_id]

    def _user(self, user_id: str) -> Record:
        if user_id not in self.tables["users"]:
            raise Error("User not found")
        return self.tables["users"][user_id]

    def _product(self, product_id: str) -> Record:
        if product_id not in self.tables["products"]:
            raise Error("Product not found")
        return self.tables["products"][product_id]

    def _variant(self, product_id: str, item_id: str) -> Record:
        variants = self._product(product_id)["variants"]
        if item_id not in variants:
            raise Error("Variant not found")
        return dict(variants[item_id])

    def _payment_method(self, user_id: str, payment_method_id: str) -> Record:
        methods = self._user(user_id)["payment_methods"]
        if payment_method_id not in methods:
            raise Error("Payment method not found")
        return dict(methods[payment_method_id])

    def _add_to_gift_card(self, user_id: str, payment_method_id: str, amount: float) -> None:
        """Credit (or, negative, debit) a gift card; τ² rounds its balance to cents."""
        card = self._own("users", user_id)["payment_methods"][payment_method_id]
        card["balance"] = round(card["balance"] + amount, 2)

    # --- reads -------------------------------------------------------------------------

    def calculate(self, expression: str) -> str:
        if not all(char in "0123456789+-*/(). " for char in expression):
            raise Error("Invalid characters in expression")
        return str(round(float(_arithmetic(expression)), 2))

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        for user_id, user in self.tables["users"].items():
            name = user["name"]
            if (
                name["first_name"].lower() == first_name.lower()
                and name["last_name"].lower() == last_name.lower()
                and user["address"]["zip"] == zip
            ):
                return user_id
        raise Error("User not found")

    def find_user_id_by_email(self, email: str) -> str:
        for user_id, user in self.tables["users"].items():
            if user["email"].lower() == email.lower():
                return user_id
        raise Error("User not found")

    def get_order_details(self, order_id: str) -> Record:
        return self._order(order_id)

    def get_product_details(self, product_id: str) -> Record:
        return self._product(product_id)

    def get_item_details(self, item_id: str) -> Record:
        for product in self.tables["products"].values():
            variants: dict[str, Record] = product["variants"]
            if item_id in variants:
                return variants[item_id]
        raise Error("Item not found")

    def get_user_details(self, user_id: str) -> Record:
        return self._user(user_id)

    def list_all_product_types(self) -> str:
        names = {p["name"]: p["product_id"] for p in self.tables["products"].values()}
        return json.dumps(names, sort_keys=True)

    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    # --- writes: τ²'s checks and effects, in τ²'s order (what a refusal leaves) -------

    def cancel_pending_order(self, order_id: str, reason: str) -> Record:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise Error("Non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise Error("Invalid reason")
        order = self._own("orders", order_id)
        refunds = []
        for payment in order["payment_history"]:
            method = self._payment_method(order["user_id"], payment["payment_method_id"])
            refunds.append({"transaction_type": "refund", "amount": payment["amount"],
                            "payment_method_id": payment["payment_method_id"]})  # fmt: skip
            if method["source"] == "gift_card":  # a gift card is refunded at once
                self._add_to_gift_card(order["user_id"], method["id"], payment["amount"])
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> Record:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise Error("Non-delivered order cannot be exchanged")
        _check_items_in(order, item_ids, "Number of {} not found.")
        if len(item_ids) != len(new_item_ids):
            raise Error("The number of items to be exchanged should match.")
        difference: float = 0
        for new in self._new_variants(order, item_ids, new_item_ids, same_id_allowed=True):
            difference += new.price - new.old_price
        difference = round(difference, 2)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < difference:
            raise Error("Insufficient gift card balance to pay for the price difference")
        order = self._own("orders", order_id)
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = difference
        return order

    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> Record:
        # τ²'s loose test here: "pending (item modified)" counts as pending.
        if "pending" not in self._order(order_id)["status"]:
            raise Error("Non-pending order cannot be modified")
        order = self._own("orders", order_id)
        order["address"] = _address(address1, address2, city, state, country, zip)
        return order

    def modify_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> Record:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise Error("Non-pending order cannot be modified")
        _check_items_in(order, item_ids, "{} not found")
        if len(item_ids) != len(new_item_ids):
            raise Error("The number of items to be exchanged should match")
        news = self._new_variants(order, item_ids, new_item_ids, same_id_allowed=False)
        difference: float = 0  # unrounded, as τ² records it
        for new in news:
            difference += new.price - new.old_price
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < difference:
            raise Error("Insufficient gift card balance to pay for the new item")
        order = self._own("orders", order_id)
        order["payment_history"].append({
            "transaction_type": "payment" if difference > 0 else "refund",
            "amount": float(abs(difference)),  # τ²'s model makes an amount a float
            "payment_method_id": payment_method_id,
        })  # fmt: skip
        if method["source"] == "gift_card":
            self._add_to_gift_card(order["user_id"], payment_method_id, -difference)
        # τ² gives every modified item the price and options of the *last* new item (its
        # loop variable outlives the loop); its final hashes record that, so we do too.
        last = news[-1] if news else None
        for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
            item = next(i for i in order["items"] if i["item_id"] == item_id)
            item["item_id"] = new_id
            if last is not None:
                item["price"] = last.price
                item["options"] = dict(last.options)
        order["status"] = "pending (item modified)"
        return order

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Record:
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise Error("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise Error("There should be exactly one payment for a pending order")
        old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
        if old_id == payment_method_id:
            raise Error("The new payment method should be different from the current one")
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise Error("Insufficient gift card balance to pay for the order")
        order = self._own("orders", order_id)
        order["payment_history"].extend([
            {"transaction_type": "payment", "amount": amount,
             "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
        ])  # fmt: skip
        if method["source"] == "gift_card":
            self._add_to_gift_card(order["user_id"], payment_method_id, -amount)
        old = self._payment_method(order["user_id"], old_id)
        if old["source"] == "gift_card":
            self._add_to_gift_card(order["user_id"], old_id, amount)
        return order

    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> Record:
        self._user(user_id)
        user = self._own("users", user_id)
        user["address"] = _address(address1, address2, city, state, country, zip)
        return user

    def return_delivered_order_items(
        self, order_id: str, item_ids: list[str], payment_method_id: str
    ) -> Record:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise Error("Non-delivered order cannot be returned")
        method = self._payment_method(order["user_id"], payment_method_id)
        original = order["payment_history"][0]["payment_method_id"]
        if method["source"] != "gift_card" and payment_method_id != original:
            raise Error("Payment method should be the original payment method")
        _check_items_in(order, item_ids, "Some item not found")
        order = self._own("orders", order_id)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    def _new_variants(
        self, order: Record, item_ids: list[str], new_item_ids: list[str], *, same_id_allowed: bool
    ) -> list[_New]:
        """The variant each item becomes, checked as τ² checks it, pair by pair."""
        news = []
        for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
            if not same_id_allowed and item_id == new_id:
                raise Error("The new item id should be different from the old item id")
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise Error(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_id)
            if not variant["available"]:
                raise Error(f"New item {new_id} not found or available")
            news.append(_New(item["price"], variant["price"], variant["options"]))
        return news

    # --- as fsm-agent tools ------------------------------------------------------------

    def tools(self) -> ToolRegistry:
        """The corpus's tools over this backend, with its schemas and read/write labels.
        A tool answers with a copy of the record, never the database's own dict: the
        engine keeps results (``calls`` for the rules) that a later write must not edit."""
        registry = ToolRegistry()
        for spec in TOOL_SPECS:
            fn = spec["schema"]["function"]
            registry.register(
                _copying(getattr(self, fn["name"])),
                name=fn["name"],
                schema=fn["parameters"],
                description=fn["description"],
                effect="write" if spec["mutates_state"] else "read",
            )
        return registry


@dataclass(frozen=True)
class _New:
    old_price: float
    price: float
    options: dict[str, str]


def _check_items_in(order: Record, item_ids: list[str], refusal: str) -> None:
    """Each item as many times in the order as in the call (a list may repeat one)."""
    in_order = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > in_order.count(item_id):
            raise Error(refusal.format(item_id))


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> Record:
    return {"address1": address1, "address2": address2, "city": city, "state": state,
            "country": country, "zip": zip}  # fmt: skip


def _copying(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def answer(**arguments: Any) -> Any:
        return copy.deepcopy(fn(**arguments))

    return answer


_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _arithmetic(expression: str) -> Any:
    """The value of an arithmetic expression (numbers, + - * / // **, parentheses), as
    Python computes it; τ² evaluates the same characters with Python's ``eval``."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise Error(f"invalid syntax in expression {expression!r}") from None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise Error(f"not an arithmetic expression: {expression!r}")

    try:
        return value(tree.body)
    except ZeroDivisionError as exc:
        raise Error(str(exc)) from None
