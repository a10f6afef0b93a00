"""A small MCP server for the tests (stdio): one read tool and one write tool.

Every call it receives is appended to the file named by ``CALL_LOG``, so a test can
prove what reached the server, and what never did.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

app = MCPServer("shop")
ORDERS: list[dict[str, object]] = []


def log(tool: str, arguments: dict[str, object]) -> None:
    path = os.environ.get("CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_stock(sku: str, quantity: int) -> dict[str, object]:
    """Whether `quantity` units of `sku` are in stock."""
    log("get_stock", {"sku": sku, "quantity": quantity})
    return {"sku": sku, "in_stock": quantity <= 5}


@app.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def place_order(sku: str, quantity: int) -> str:
    """Order `quantity` units of `sku`."""
    log("place_order", {"sku": sku, "quantity": quantity})
    if quantity > 100:
        raise ToolError("the warehouse timed out after accepting the order")
    ORDERS.append({"sku": sku, "quantity": quantity})
    return f"order {len(ORDERS)} placed: {quantity} x {sku}"


if __name__ == "__main__":
    app.run("stdio")
