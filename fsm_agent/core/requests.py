"""What the run loop asks its driver to do, and what a tool call came back with.

``Run.steps()`` yields one of the requests; ``Runtime.run()`` answers it synchronously,
``Runtime.arun()`` asynchronously.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fsm_agent.core.decision import PreparedCall

__all__ = ["ModelRequest", "Request", "SleepRequest", "ToolOutcome", "ToolRequest"]


@dataclass
class ToolOutcome:
    """What happened when a tool ran: ``ok`` | ``rejected`` | ``transient`` | ``timeout``
    | ``error``."""

    kind: str
    value: Any = None
    error: str = ""


@dataclass
class ModelRequest:
    messages: list[dict[str, Any]]
    tool_specs: list[dict[str, Any]]


@dataclass
class ToolRequest:
    call: PreparedCall
    timeout_s: float | None


@dataclass
class SleepRequest:
    seconds: float


Request = ModelRequest | ToolRequest | SleepRequest
