"""A model that replays a fixed script: deterministic runs for tests and demos."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ScriptedModel"]

Step = dict[str, Any] | Callable[[list[dict[str, Any]]], Any] | BaseException


class ScriptedModel:
    """Returns its decisions in order.

    Each step is a decision dict, a callable of the history returning one (so a script
    can react to results), or an exception instance to raise. Running past the end
    raises ``IndexError``, which the runtime reports as ``protocol_error/model_error``.
    """

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.seen: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> Any:
        if self.calls >= len(self.steps):
            raise IndexError(f"ScriptedModel has only {len(self.steps)} steps")
        step = self.steps[self.calls]
        self.calls += 1
        self.seen.append(messages)
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(messages)
        return step
