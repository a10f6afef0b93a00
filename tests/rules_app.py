"""An application with ten rules of its own, for ``fsm-agent diagram --app`` and the
coverage report (tests, docs)."""

from __future__ import annotations

from typing import Any

from fsm_agent import Rule, Runtime, ScriptedModel, ToolRegistry

RULES = [
    Rule("big-refunds-need-review", on="before_tool", tools=["issue_refund"],
         when="args.amount_cents > 5000", then="review"),
    Rule("no-mail-after-web", on="before_tool", tools=["send_email"],
         when="calls.exists(c, c.tool == 'fetch_url')", then="deny",
         message="no email after reading web content"),
    Rule("three-searches", on="before_tool", tools=["search"], then="limit", limit=3),
    Rule("gold-only-refunds", on="before_tool", tools=["issue_refund"],
         when="context.tier != 'gold' && args.amount_cents > 1000", then="deny"),
    Rule("refunds-per-run", on="before_tool", tools=["issue_refund"], then="limit", limit=2),
    Rule("mail-domain", on="before_tool", tools=["send_email"],
         when="!args.to.endsWith('@example.com')", then="review"),
    Rule("no-secrets-out", on="after_tool", tools=["fetch_url"], when="has(result.secret)",
         then="deny"),
    Rule("twelve-model-calls", on="before_model", then="limit", limit=12),
    Rule("answer-is-json", on="answer", schema={"type": "object", "required": ["status"]},
         then="retry"),
    Rule("no-refund-promises", on="answer", when="answer.contains('guaranteed refund')",
         then="stop"),
]  # fmt: skip


def tools() -> ToolRegistry:
    registry = ToolRegistry()
    obj: dict[str, Any] = {"type": "object"}

    @registry.tool(schema={**obj, "properties": {"amount_cents": {"type": "integer"}}},
                   effect="write")  # fmt: skip
    def issue_refund(amount_cents: int) -> dict[str, Any]:
        return {"refunded": amount_cents}

    @registry.tool(schema={**obj, "properties": {"to": {"type": "string"}}}, effect="write")
    def send_email(to: str) -> dict[str, Any]:
        return {"sent": to}

    @registry.tool(schema={**obj, "properties": {"url": {"type": "string"}}}, effect="read")
    def fetch_url(url: str) -> dict[str, Any]:
        return {"text": "..."}

    @registry.tool(schema={**obj, "properties": {"q": {"type": "string"}}}, effect="read")
    def search(q: str) -> dict[str, Any]:
        return {"hits": []}

    return registry


def app() -> Runtime:
    registry = tools()
    return Runtime(model=ScriptedModel([]), tools=registry, allowed_tools=registry.names(),
                   rules=RULES)  # fmt: skip
