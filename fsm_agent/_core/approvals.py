"""Approvals: issued by trusted configuration, bound to a tool and its exact arguments.

Two kinds of approval let a ``requires_approval`` write run (R8):

* a configured :class:`Approval` (``Runtime(approvals=[...])``) covers every call, in every
  run of that runtime, whose tool and canonical arguments match exactly — at most
  ``max_uses`` calls in all if that is set, counted by the store (so across runs,
  processes and a fleet sharing it);
* a reviewer's approval of a paused call (``Runtime.approve(run_id, call_id)``) covers
  that call id of that run once, nothing else — not a later call with the same payload.

Every write that consumed an approval records which one in its trace (``approval`` on the
``start_attempt`` transition): ``config:<digest>`` or ``review:<call id>``.

Admission only *identifies* the approval that covers a call (:meth:`ApprovalBook.find`,
pure). A use of a limited one is spent as an effect: the loop yields
:class:`~fsm_agent._core.requests.ConsumeApproval` once the call is about to start (its
batch passed validation, nothing else stops its dispatch), and the store answers it
atomically, keyed by ``(approval id, run id, call id)`` so a retry or a resume of the same
call never spends twice. The answer is recorded on the ``dispatch`` transition
(``approval_use``: ``granted`` | ``refused``); a refused use stops the run
``review_required/approval_required`` before the call runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fsm_agent._core.canonical import digest
from fsm_agent._errors import ConfigError

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
    """The configured approvals of one runtime: which covers a call, and how many uses it
    has in all. Immutable once built; the uses spent live in the store."""

    def __init__(self, approvals: Iterable[Approval] = ()) -> None:
        self._by_digest: dict[str, list[Approval]] = {}
        for a in approvals:
            self._by_digest.setdefault(a.digest, []).append(a)
        #: approval id -> its uses in all (approvals with the same binding share one id,
        #: so their uses add up); an id absent here is unlimited.
        self._limits: dict[str, int] = {}
        for group in self._by_digest.values():
            if all(a.max_uses is not None for a in group):
                self._limits[group[0].id] = sum(a.max_uses or 0 for a in group)

    def find(self, args_digest: str) -> str | None:
        """The id of the approval covering ``args_digest``, or ``None``; spends nothing."""
        group = self._by_digest.get(args_digest)
        return group[0].id if group else None

    def limit(self, approval_id: str) -> int | None:
        """How many calls ``approval_id`` covers in all (``None``: any number, or not a
        configured approval: a reviewer's covers its one call)."""
        return self._limits.get(approval_id)

    @property
    def limited(self) -> bool:
        """Some approval has ``max_uses``: its uses need a store that counts them."""
        return bool(self._limits)

    def header(self) -> list[dict[str, Any]]:
        """What a trace header records of the configured approvals (digests, not payloads)."""
        return [
            {"tool": a.tool, "digest": a.digest, "max_uses": a.max_uses}
            for group in self._by_digest.values()
            for a in group
        ]
