"""Exceptions that callers raise or catch."""

from __future__ import annotations

__all__ = ["ToolRejected", "TraceError", "TransientToolError"]


class TransientToolError(Exception):
    """Raised by a tool (or its trusted adapter) for a failure that may pass if retried.

    Only read tools, and write tools whose registrar declares downstream deduplication,
    are retried on it. For any other write it means the outcome is unknown.
    """


class ToolRejected(Exception):
    """Raised by a tool for a definite rejection: nothing happened, nothing to review."""


class TraceError(ValueError):
    """A trace file that cannot be read: names the file and the 1-based line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message
