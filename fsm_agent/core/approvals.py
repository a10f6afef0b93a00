"""Approvals: issued by trusted configuration, bound to a tool and its exact arguments.

Two kinds of approval let a ``requires_approval`` write run (R8):

* a configured :class:`Approval` (``Runtime(approvals=[...])``) covers every call, in every
  run of that runtime, whose tool and canonical arguments match exactly — at most
  ``max_uses`` calls in all if that is set (counted by this runtime, in this process);
* a reviewer's approval of a paused call (``Runtime.approve(run_id, call_id)``) covers
  that call id of that run once, nothing else — not a later call with the same payload.

Every write that consumed an approval records which one in its trace (``approval`` on the
``start_attempt`` transition): ``config:<digest>`` or ``review:<call id>``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fsm_agent.core.canonical import digest
from fsm_agent.errors import ConfigError

__all__ = ["Approval", "ApprovalBook"]


@dataclass(frozen=True)
class Approval:
    """Permission for one tool to run with exactly these arguments.

    The binding is a hash of the tool name and the full canonical arguments, so a call
    that differs in any field, or adds one (``approved: true`` included), is not covered.
    ``max_uses`` bounds how many calls it covers (``None``: any number).
    """

    tool: str
    arguments: dict[str, Any]
    max_uses: int | None = None
    digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tool, str) or not self.tool:
            raise ConfigError(f"Approval.tool must be a tool name, got {self.tool!r}")
        if not isinstance(self.arguments, dict):
            raise ConfigError(f"Approval.arguments must be a dict, got {self.arguments!r}")
        if self.max_uses is not None and (
            isinstance(self.max_uses, bool)
            or not isinstance(self.max_uses, int)
            or self.max_uses < 1
        ):
            raise ConfigError(
                f"Approval.max_uses must be a whole number >= 1 or None, got {self.max_uses!r}"
            )
        try:
            bound = digest(self.tool, self.arguments)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Approval.arguments must be JSON data: {exc}") from None
        object.__setattr__(self, "digest", bound)

    @property
    def id(self) -> str:
        return f"config:{self.digest[:16]}"


class ApprovalBook:
    """The configured approvals of one runtime, with their remaining uses (thread-safe)."""

    def __init__(self, approvals: Iterable[Approval] = ()) -> None:
        self._by_digest: dict[str, list[Approval]] = {}
        self._left: dict[str, int] = {}
        self._lock = threading.Lock()
        for a in approvals:
            self._by_digest.setdefault(a.digest, []).append(a)
            if a.max_uses is not None:
                self._left[a.id] = self._left.get(a.id, 0) + a.max_uses
        self.unlimited = frozenset(
            d for d, group in self._by_digest.items() if any(a.max_uses is None for a in group)
        )

    def take(self, args_digest: str) -> str | None:
        """The id of an approval covering ``args_digest``, consuming one use of a limited
        one; ``None`` if none covers it (or all are used up)."""
        group = self._by_digest.get(args_digest)
        if not group:
            return None
        if args_digest in self.unlimited:
            return group[0].id
        approval_id = group[0].id
        with self._lock:
            left = self._left.get(approval_id, 0)
            if left <= 0:
                return None
            self._left[approval_id] = left - 1
        return approval_id

    def header(self) -> list[dict[str, Any]]:
        """What a trace header records of the configured approvals (digests, not payloads)."""
        return [
            {"tool": a.tool, "digest": a.digest, "max_uses": a.max_uses}
            for group in self._by_digest.values()
            for a in group
        ]
