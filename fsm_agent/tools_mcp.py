"""Tools of a Model Context Protocol server, registered into a :class:`ToolRegistry`.

The registering caller stays the authority (SPEC rule 4): it confirms every tool's
effect (``read`` or ``write``). A server's ``readOnlyHint`` is the server describing
itself, so it only *seeds* :func:`suggested_effects`, which the caller reviews and
passes back. Each tool keeps the server's ``inputSchema``, closed against unknown
fields like every other tool, and our strict validation runs before the server sees
anything: MCP servers typically coerce ``"3"`` to ``3`` and drop unknown keys, which
would let a malformed call execute as a different one.

MCP calls are async, so drive these tools with ``await runtime.arun(...)``::

    async with stdio_client(sys.executable, "server.py") as client:
        tools = ToolRegistry()
        infos = await list_mcp_tools(client)
        effects = suggested_effects(infos)          # review this: it is the server's claim
        await register_mcp_tools(tools, client, effects=effects)
        result = await Runtime(model=..., tools=tools, allowed_tools=...).arun("...")

A result with ``isError`` from a ``write`` tool may have taken effect, so by default it
stops the run for review (``outcome_unknown``); name the tools whose errors are definite
rejections in ``rejected_on_error``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

try:
    import mcp
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("MCP tools need the mcp SDK: pip install 'fsm-agent[mcp]'") from exc

from fsm_agent.errors import ToolRejected
from fsm_agent.tools import Effect, Tool, ToolRegistry

__all__ = ["McpToolError", "McpToolInfo", "list_mcp_tools", "register_mcp_tools",
           "stdio_client", "suggested_effects"]

#: What OpenAI and Anthropic accept as a function / tool name.
_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: JSON-RPC errors that mean the server refused the request before running anything.
_REFUSED = (INVALID_PARAMS, METHOD_NOT_FOUND)
_MAX_PAGES = 100


class McpToolError(Exception):
    """The server reported the call as failed (``isError``); it may still have acted."""


@dataclass(frozen=True)
class McpToolInfo:
    """What a server says about one of its tools (hints are claims, not permissions)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None
    destructive_hint: bool | None
    idempotent_hint: bool | None


def stdio_client(command: str, *args: str, env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> mcp.Client:
    """An MCP client that starts ``command args...`` and talks to it over stdio
    (use it as ``async with``)."""
    params = mcp.StdioServerParameters(command=command, args=list(args),
                                       env=dict(env) if env is not None else None, cwd=cwd)
    return mcp.Client(params)


async def list_mcp_tools(client: mcp.Client) -> list[McpToolInfo]:
    """Every tool the server lists (all pages)."""
    infos: list[McpToolInfo] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        for t in page.tools:
            hints = t.annotations
            infos.append(McpToolInfo(
                name=t.name, description=t.description or "",
                input_schema=dict(t.input_schema) if isinstance(t.input_schema, Mapping)
                else t.input_schema.model_dump(by_alias=True, exclude_none=True),
                read_only_hint=getattr(hints, "read_only_hint", None),
                destructive_hint=getattr(hints, "destructive_hint", None),
                idempotent_hint=getattr(hints, "idempotent_hint", None)))
        cursor = page.next_cursor
        if cursor is None:
            break
    return infos


def suggested_effects(infos: Collection[McpToolInfo]) -> dict[str, Effect]:
    """A starting point for ``effects``: ``read`` where the server hints read-only, else
    ``write`` (the safe default: a write is never retried blindly)."""
    return {i.name: "read" if i.read_only_hint is True else "write" for i in infos}


def _value(result: Any) -> Any:
    """A tool result as data for the model: structured content if any, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    blocks = list(result.content)
    if blocks and all(getattr(b, "type", None) == "text" for b in blocks):
        return "\n".join(b.text for b in blocks)
    return [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]


def _error_text(result: Any) -> str:
    texts = [b.text for b in result.content if getattr(b, "type", None) == "text"]
    return "; ".join(texts)[:500] or "the server reported an error without text"


def _caller(client: mcp.Client, name: str, remote: str, rejects: bool) -> Callable[..., Any]:
    async def call(**arguments: Any) -> Any:
        try:
            result = await client.call_tool(remote, arguments)
        except MCPError as exc:
            if exc.code in _REFUSED:
                raise ToolRejected(f"MCP server refused {remote!r}: {exc.error.message}") from exc
            raise
        if result.is_error:
            text = f"MCP tool {remote!r} failed: {_error_text(result)}"
            raise ToolRejected(text) if rejects else McpToolError(text)
        return _value(result)

    call.__name__ = name
    return call


async def register_mcp_tools(
    registry: ToolRegistry,
    client: mcp.Client,
    *,
    effects: Mapping[str, Effect],
    only: Collection[str] | None = None,
    prefix: str = "",
    requires_approval: Collection[str] = (),
    idempotency_keys: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
    rejected_on_error: Collection[str] = (),
    timeout_s: float | None = None,
) -> list[Tool]:
    """Register the server's tools (or ``only`` those) as ``prefix + name``.

    ``effects`` must name every registered tool: the caller's confirmation, not the
    server's hint. ``requires_approval``, ``idempotency_keys`` and ``rejected_on_error``
    are keyed by the server's tool names. Raises ``ValueError`` for a tool without a
    confirmed effect, a name the server does not list, or a schema we cannot enforce.
    """
    infos = await list_mcp_tools(client)
    listed = {i.name: i for i in infos}
    wanted = list(listed) if only is None else list(only)
    keys = dict(idempotency_keys or {})
    named = set(effects) | set(requires_approval) | set(keys) | set(rejected_on_error) | set(
        wanted)
    unknown = sorted(named - set(listed))
    if unknown:
        raise ValueError(f"the MCP server does not list {', '.join(unknown)} "
                         f"(it lists: {', '.join(listed) or 'nothing'})")
    unconfirmed = [n for n in wanted if n not in effects]
    if unconfirmed:
        hints = ", ".join(f"{n} (server hints {_hint(listed[n])})" for n in unconfirmed)
        raise ValueError(f"confirm the effect of every MCP tool: no effect given for {hints}; "
                         f"suggested_effects(...) gives a starting point to review")
    bad = [prefix + n for n in wanted if not _FUNCTION_NAME.match(prefix + n)]
    if bad:
        raise ValueError(f"not valid tool names for model APIs ({_FUNCTION_NAME.pattern}): "
                         f"{', '.join(bad)}; leave them out with only=, or pick another prefix")
    tools = []
    for name in wanted:
        info = listed[name]
        tools.append(registry.register(
            _caller(client, prefix + name, name, name in rejected_on_error),
            name=prefix + name, schema=info.input_schema, effect=effects[name],
            description=info.description, requires_approval=name in requires_approval,
            idempotency_key=keys.get(name), timeout_s=timeout_s))
    return tools


def _hint(info: McpToolInfo) -> str:
    if info.read_only_hint is True:
        return "read-only"
    if info.read_only_hint is False:
        return "destructive" if info.destructive_hint is not False else "not read-only"
    return "nothing"
