"""The order tools the benchmarks share: one argument schema, a read and two writes.

Each benchmark builds its own registry from these (which are keyed, which need an
approval), so the scenarios differ only where the benchmark says they do.
"""

from __future__ import annotations

from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "additionalProperties": False,
    "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 80}},
}


def lookup(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "status": "in_transit"}


def record(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "recorded": True}


def refund(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "refunded": True}
