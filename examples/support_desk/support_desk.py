"""A three-tool support desk: the application the testing guide tests.

``lookup_order`` is a read of a flaky order service (retried on transient failures);
``issue_refund`` is a write that needs a reviewer's approval and carries an idempotency
key (the order id: one refund per order); ``send_email`` is a write to a mail service that
can time out. :func:`make_runtime` is the application's runtime factory, the one thing a
test (or ``--fsm-app support_desk:make_runtime``) needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsm_agent import Budget, MemoryStore, Runtime, ToolRegistry


@dataclass
class Backend:
    """The world the tools change: what a test inspects after a run."""

    orders: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "A17": {"status": "delivered", "total": 42.0},
            "B02": {"status": "lost", "total": 18.5},
        }
    )
    refunds: list[dict[str, Any]] = field(default_factory=list)
    emails: list[dict[str, Any]] = field(default_factory=list)


ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "pattern": "^[A-Z][0-9]{2}$"}},
    "required": ["order_id"],
}
REFUND = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z][0-9]{2}$"},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 500},
    },
    "required": ["order_id", "amount"],
}
EMAIL = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "minLength": 3, "maxLength": 80},
        "body": {"type": "string", "minLength": 1, "maxLength": 2000},
    },
    "required": ["to", "body"],
}


def register_tools(registry: ToolRegistry, backend: Backend) -> None:
    """The desk's three tools over ``backend``."""

    def lookup_order(order_id: str) -> dict[str, Any]:
        order = backend.orders.get(order_id)
        return {"order_id": order_id, **order} if order else {"order_id": order_id, "found": False}

    def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        backend.refunds.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount, "order_id": order_id}

    def send_email(to: str, body: str) -> dict[str, Any]:
        backend.emails.append({"to": to, "body": body})
        return {"sent": True}

    registry.register(lookup_order, schema=ORDER, effect="read", description="Read an order.")
    registry.register(
        issue_refund,
        schema=REFUND,
        effect="write",
        description="Refund an order (one refund per order).",
        requires_approval=True,
        idempotency_key=lambda args: args["order_id"],
    )
    registry.register(
        send_email, schema=EMAIL, effect="write", description="Email a customer.", timeout_s=10
    )


def make_runtime(
    *, model: Any, backend: Backend | None = None, store: MemoryStore | None = None
) -> Runtime:
    """The application's runtime: its tools over ``backend``, its store, its budget."""
    registry = ToolRegistry()
    register_tools(registry, backend if backend is not None else Backend())
    return Runtime(
        model=model,
        tools=registry,
        allowed_tools=registry.names(),
        budget=Budget(max_tool_rounds=6, max_total_calls=12),
        store=store if store is not None else MemoryStore(),
    )
