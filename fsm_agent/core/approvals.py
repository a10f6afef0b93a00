"""Approvals: issued by trusted configuration, bound to a tool and its exact arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsm_agent.core.canonical import digest
from fsm_agent.errors import ConfigError

__all__ = ["Approval"]


@dataclass(frozen=True)
class Approval:
    """Permission for one tool to run with exactly these arguments (SPEC rule 8).

    The binding is a hash of the tool name and the full canonical arguments, so a call
    that differs in any field, or adds one (``approved: true`` included), is not covered.
    """

    tool: str
    arguments: dict[str, Any]
    digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tool, str) or not self.tool:
            raise ConfigError(f"Approval.tool must be a tool name, got {self.tool!r}")
        if not isinstance(self.arguments, dict):
            raise ConfigError(f"Approval.arguments must be a dict, got {self.arguments!r}")
        object.__setattr__(self, "digest", digest(self.tool, self.arguments))
