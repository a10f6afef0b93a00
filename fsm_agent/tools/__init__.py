"""Tools: the registry (what a registrar declares about each tool) and MCP servers.

The MCP names are imported on first use: they load ``asyncio`` and, when a server is
started, the ``mcp`` extra.
"""

from typing import TYPE_CHECKING, Any

from fsm_agent.tools._registry import Effect, Tool, ToolRegistry, close_objects

if TYPE_CHECKING:  # for type checkers; at run time imported on first use
    from fsm_agent.tools._mcp import (
        McpBridge,
        McpStdioClient,
        McpToolInfo,
        list_mcp_tools,
        register_mcp_tools,
        stdio_client,
        suggested_effects,
    )

__all__ = [
    "Effect",
    "McpBridge",
    "McpStdioClient",
    "McpToolInfo",
    "Tool",
    "ToolRegistry",
    "close_objects",
    "list_mcp_tools",
    "register_mcp_tools",
    "stdio_client",
    "suggested_effects",
]

_MCP = {
    "McpBridge",
    "McpStdioClient",
    "McpToolInfo",
    "list_mcp_tools",
    "register_mcp_tools",
    "stdio_client",
    "suggested_effects",
}


def __getattr__(name: str) -> Any:
    if name in _MCP:
        from fsm_agent.tools import _mcp

        return getattr(_mcp, name)
    raise AttributeError(f"module 'fsm_agent.tools' has no attribute {name!r}")
