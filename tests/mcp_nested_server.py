"""An MCP server (the mcp SDK's own server) whose tool arguments are nested models and a
discriminated union, so the SDK generates the ``$defs``/``$ref``/``oneOf``/``anyOf``
schemas real Python MCP servers publish. Calls are appended to ``CALL_LOG``."""

from __future__ import annotations

import json
import os
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field

app = MCPServer("nested")


class Address(BaseModel):
    street: str
    city: str
    postcode: str | None = None


class Card(BaseModel):
    kind: Literal["card"]
    last4: str = Field(pattern=r"^[0-9]{4}$")


class Invoice(BaseModel):
    kind: Literal["invoice"]
    email: str = Field(json_schema_extra={"format": "email"})


@app.tool()
def ship(
    address: Address,
    payment: Annotated[Card | Invoice, Field(discriminator="kind")],
    gift: Address | None = None,
) -> str:
    """Ship an order to an address."""
    path = os.environ.get("CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            entry = {"address": address.model_dump(), "payment": payment.model_dump()}
            f.write(json.dumps(entry) + "\n")
    return f"shipping to {address.city}"


if __name__ == "__main__":
    app.run("stdio")
