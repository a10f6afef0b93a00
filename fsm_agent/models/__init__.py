"""Models: anything callable as ``(messages, tool_specs) -> assistant message dict``."""

from fsm_agent.models.scripted import ScriptedModel

__all__ = ["ScriptedModel"]
