"""Tools: the registry (what a registrar declares about each tool) and MCP servers."""

from fsm_agent.tools.registry import Effect, Tool, ToolRegistry, close_objects

__all__ = ["Effect", "Tool", "ToolRegistry", "close_objects"]
