"""What a rule sees (:class:`Facts`) and what judging it gives (:class:`Judgement`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["PASS", "Facts", "Judgement"]

#: The verdict of a judgement no rule decided.
PASS = "pass"

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_new = object.__new__


@dataclass(frozen=True)
class Facts:
    """The run's facts at one point where rules are judged (JSON values from the run).

    ``calls`` are this run's executed calls, oldest first, each a mapping with ``tool``,
    ``args``, ``ok`` and ``result``. ``context`` holds the caller's trusted facts
    (``run(..., context={...})``). A Python ``when`` reads these as attributes; a CEL
    condition reads the ones its phase declares (``fsm_agent._rules.cel.PHASE_VARIABLES``).
    """

    tool: str | None = None
    effect: str | None = None
    args: Mapping[str, Any] | None = None
    result: Any = None
    answer: str | None = None
    counters: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    calls: Sequence[Mapping[str, Any]] = ()
    context: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    call_id: str | None = None
    #: Variables the caller vouches are CEL-ready already (screened, or built by the
    #: engine from plain JSON within CEL's limits): handed over without the screen.
    trusted: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    #: The caller vouches that ``calls`` is a list that only grows between judgements and
    #: whose entries never change and are plain JSON values (dicts with string keys,
    #: lists, str, int, float, bool, None: no tuples or subclasses), as the engine builds
    #: its executed calls: its entries are then screened and digested once each, as they
    #: are added, not walked at every judgement.
    appended: bool = field(default=False, repr=False, compare=False)
    #: Variables the caller vouches are plain JSON values as the engine builds them (as
    #: ``appended``'s entries are): screened by their canonical text, which the digest
    #: needs anyway, not walked and copied, where it shows them within CEL's limits.
    plain: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def of(
        cls,
        tool: str | None = None,
        effect: str | None = None,
        args: Mapping[str, Any] | None = None,
        result: Any = None,
        answer: str | None = None,
        counters: Mapping[str, Any] = _EMPTY,
        calls: Sequence[Mapping[str, Any]] = (),
        context: Mapping[str, Any] = _EMPTY,
        call_id: str | None = None,
        trusted: frozenset[str] = frozenset(),
        appended: bool = False,
        plain: frozenset[str] = frozenset(),
    ) -> Facts:
        """``Facts(...)``, built for the loop's hot path: a frozen dataclass's
        ``__init__`` sets each field through ``object.__setattr__``, which costs three
        times filling the instance's dict at once (the loop builds one per judgement)."""
        facts = _new(cls)
        facts.__dict__.update(tool=tool, effect=effect, args=args, result=result,
                              answer=answer, counters=counters, calls=calls, context=context,
                              call_id=call_id, trusted=trusted, appended=appended,
                              plain=plain)  # fmt: skip
        return facts

    def variable(self, name: str) -> Any:
        """The value of one rule variable (``args`` of a call with none is ``{}``)."""
        value = getattr(self, name)
        if value is None and name == "args":
            return {}
        if name == "calls" and isinstance(value, list | tuple):
            return list(value)
        return value


@dataclass(frozen=True)
class Judgement:
    """What the rules of one phase said about one call (or model turn, or answer).

    ``rule_id`` is the rule that decided (``None`` with verdict ``pass``: none held);
    ``inputs_digest`` is the digest of the inputs the tried rules read (what a ``rule``
    event records); ``error`` says why the deciding rule could not be evaluated (it then
    failed closed: ``deny``, or ``stop`` for answers); ``opaque`` names the Python
    conditions that were run, which ``check`` cannot re-evaluate.
    """

    phase: str
    verdict: str
    rule_id: str | None
    inputs_digest: str
    detail: str | None = None
    call_id: str | None = None
    error: str | None = None
    tried: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        phase: str,
        verdict: str,
        rule_id: str | None,
        inputs_digest: str,
        detail: str | None = None,
        call_id: str | None = None,
        error: str | None = None,
        tried: tuple[str, ...] = (),
        opaque: tuple[str, ...] = (),
    ) -> Judgement:
        """``Judgement(...)``, built as :meth:`Facts.of` is (once per judgement)."""
        judgement = _new(cls)
        judgement.__dict__.update(phase=phase, verdict=verdict, rule_id=rule_id,
                                  inputs_digest=inputs_digest, detail=detail,
                                  call_id=call_id, error=error, tried=tried,
                                  opaque=opaque)  # fmt: skip
        return judgement

    def to_json(self) -> dict[str, Any]:
        """The payload of the ``rule`` trace event, empty fields left out."""
        return self.event(None, None)

    def event(self, seq: int | None, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        """The ``rule`` trace event: :meth:`to_json`, then ``extra``'s fields (what the
        loop adds: an arguments digest, a withheld result) and ``seq`` (none: left out)."""
        out: dict[str, Any] = {
            "type": "rule",
            "rule": self.rule_id,
            "phase": self.phase,
            "inputs_digest": self.inputs_digest,
            "verdict": self.verdict,
        }
        if self.call_id is not None:
            out["call_id"] = self.call_id
        if self.detail is not None:
            out["detail"] = self.detail
        if self.error is not None:
            out["error"] = self.error
        if self.opaque:
            out["opaque"] = list(self.opaque)
        if extra:
            out.update(extra)
        if seq is not None:
            out["seq"] = seq
        return out
