"""What a run returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm_agent._core.state import RunState

__all__ = ["RunResult", "result_of"]


@dataclass
class RunResult:
    """The end of a run: where it stopped and everything it did.

    ``status`` is the terminal state (``done``, ``budget_exhausted``, ``protocol_error``,
    ``review_required``) and ``reason`` why; ``messages`` is the provider-valid history
    (every tool call answered exactly once); ``events`` is the trace. ``warnings`` holds
    what the runtime warned about while driving it this time (each also a
    ``RuntimeWarning``): a model that repeated calls of an earlier round.
    ``usage_unknown`` is true when a reply reported no token usage (a stream without its
    usage event, a model that returns none): the token counters then count only what was
    reported, a lower bound, never the run's spend.
    """

    run_id: str
    status: str
    reason: str
    answer: str | None
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    counters: dict[str, Any]
    detail: str = ""
    pending: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    usage_unknown: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @property
    def path(self) -> list[str]:
        """The states the run went through, starting with the initial one."""
        states = [e["source"] for e in self.events if e["type"] == "transition"][:1]
        states += [e["dest"] for e in self.events if e["type"] == "transition"]
        return states


def result_of(s: RunState) -> RunResult:
    """What a run that stopped (or is paused) returns to its caller."""
    return RunResult(
        run_id=s.run_id,
        status=s.status or s.state,
        reason=s.reason or "",
        answer=s.answer,
        messages=s.messages,
        events=s.events,
        counters=s.counters.as_dict(),
        detail=s.detail,
        pending={call_id: at for call_id, (at, _) in s.placeholders.items()},
        usage_unknown=s.tokens_unknown,
    )
