"""A rule as the user writes it: a frozen value, checked field by field when built."""

from __future__ import annotations

import copy
import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, get_args

__all__ = [
    "PHASES",
    "VERDICTS",
    "VERDICTS_BY_PHASE",
    "OpaqueCondition",
    "Phase",
    "Rule",
    "Verdict",
]

Phase = Literal["before_tool", "after_tool", "before_model", "answer"]
Verdict = Literal["allow", "deny", "review", "limit", "retry", "stop"]
PHASES: tuple[str, ...] = get_args(Phase)
VERDICTS: tuple[str, ...] = get_args(Verdict)

#: Which ``then`` each phase takes: a call can be reviewed only before it runs,
#: and an answer can only be accepted, sent back (``retry``) or end the run (``stop``).
VERDICTS_BY_PHASE: Mapping[str, tuple[str, ...]] = {
    "before_tool": ("allow", "deny", "review", "limit"),
    "after_tool": ("allow", "deny"),
    "before_model": ("allow", "deny", "limit"),
    "answer": ("allow", "retry", "stop"),
}

#: The phases that are about one tool call (where ``tools`` globs apply).
TOOL_PHASES = ("before_tool", "after_tool")

#: Written in place of the source of a callable ``inspect`` cannot find (a builtin, a
#: lambda typed at a prompt): the hash then rests on the qualified name alone.
NO_SOURCE = "<source unavailable>"


@dataclass(frozen=True)
class OpaqueCondition:
    """A Python ``when``: run as given, identified by name and source, never re-checkable.

    ``digest`` is what the rule set's hash and a run's header record; a resume finds the
    callable again by it."""

    fn: Callable[[Any], Any] = field(compare=False, repr=False)
    qualname: str
    source: str
    digest: str

    @classmethod
    def of(cls, fn: Callable[[Any], Any]) -> OpaqueCondition:
        qualname = _qualname(fn)
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            source = NO_SOURCE
        text = f"{qualname}\0{source}".encode("utf-8", "surrogatepass")
        return cls(fn, qualname, source, "sha256:" + hashlib.sha256(text).hexdigest())

    @property
    def has_source(self) -> bool:
        return self.source != NO_SOURCE


def _qualname(fn: Callable[[Any], Any]) -> str:
    target: Any = fn
    if not hasattr(fn, "__qualname__"):  # a callable object: its class names it
        target = type(fn)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', type(target).__name__)}"


@dataclass(frozen=True)
class Rule:
    """One rule of an application (``docs/concepts/own-rules-design.md``).

    :param id: unique within the rule set; names the rule in verdicts, the trace and errors.
    :param on: ``before_tool``, ``after_tool``, ``before_model`` or ``answer``.
    :param tools: globs of tool names (``before_tool``/``after_tool`` only); none means
        every tool.
    :param when: a CEL expression, or a Python callable ``when(facts) -> bool`` (opaque);
        none means always.
    :param then: the verdict when the rule holds (which ones a phase takes:
        :data:`VERDICTS_BY_PHASE`).
    :param message: the detail a deny, review or stop reports.
    :param limit: for ``then="limit"``: how many matching executions (or, before the
        model, model calls) a run may have.
    :param schema: for ``on="answer"``: a JSON Schema the answer, parsed as JSON, must meet.

    Field types are checked here; everything that needs the other rules or the registered
    tools (duplicate ids, unmatched globs, CEL errors) is checked by
    :class:`~fsm_agent._rules.RuleSet`, which reports every mistake at once.
    """

    id: str
    _: KW_ONLY
    on: Phase
    tools: Sequence[str] | None = None
    when: str | Callable[[Any], Any] | None = None
    then: Verdict
    message: str | None = None
    limit: int | None = None
    schema: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        tools: Any = self.tools
        if isinstance(tools, Sequence) and not isinstance(tools, str):
            object.__setattr__(self, "tools", tuple(tools))
        if isinstance(self.schema, Mapping):
            # A copy: the schema the rule set checked is the one it keeps using.
            object.__setattr__(self, "schema", copy.deepcopy(dict(self.schema)))

    def field_problems(self) -> list[str]:
        """What is wrong with this rule on its own, each said as a fix."""
        problems: list[str] = []
        if not isinstance(self.id, str) or not self.id.strip():
            problems.append(f"id must be a non-empty string, got {self.id!r:.40}")
        if self.on not in PHASES:
            problems.append(f"on={self.on!r:.40} is not a phase; use one of {', '.join(PHASES)}")
            return problems
        legal = VERDICTS_BY_PHASE[self.on]
        if self.then not in legal:
            hint = f"{self.then!r:.40} is not a verdict"
            if self.then in VERDICTS:
                hint = f"{self.then!r} is not a verdict of {self.on} rules"
            problems.append(f"then={hint}; {self.on} rules take {', '.join(legal)}")
        problems += self._tools_problems()
        if self.when is not None and not isinstance(self.when, str) and not callable(self.when):
            problems.append(
                f"when must be a CEL string or a callable, got {type(self.when).__name__}"
            )
        if self.message is not None and not isinstance(self.message, str):
            problems.append(f"message must be a string, got {type(self.message).__name__}")
        problems += self._limit_problems()
        if self.schema is not None:
            if self.on != "answer":
                problems.append("schema applies to answer rules only (on='answer')")
            elif not isinstance(self.schema, Mapping):
                problems.append(f"schema must be a JSON Schema object, got {self.schema!r:.40}")
            elif self.then == "allow":
                problems.append(
                    "a schema rule decides when the answer fails it: then='retry' or 'stop'"
                )
        return problems

    def _tools_problems(self) -> list[str]:
        if self.tools is None:
            return []
        if isinstance(self.tools, str):
            return [
                f"tools must be a list of globs, got the string {self.tools!r:.40}: "
                f"write tools=[{self.tools!r:.40}]"
            ]
        if self.on not in TOOL_PHASES:
            return [f"tools applies to before_tool and after_tool rules only, not {self.on}"]
        if not self.tools:
            return ["tools=[] matches no tool; leave tools out to match every tool"]
        bad = [g for g in self.tools if not isinstance(g, str) or not g]
        return [f"tools must be non-empty strings, got {bad[0]!r:.40}"] if bad else []

    def _limit_problems(self) -> list[str]:
        if self.then == "limit":
            if self.limit is None:
                return ["then='limit' needs a number: limit=N (the executions a run may have)"]
            if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
                return [f"limit must be a whole number ≥ 0, got {self.limit!r:.40}"]
        elif self.limit is not None:
            return [
                f"limit={self.limit!r:.40} is only read by then='limit' rules "
                f"(this one is then={self.then!r})"
            ]
        return []

    def condition_text(self) -> str:
        """The condition as a label (a diagram edge, a verdict's default detail)."""
        if self.when is None:
            return "always"
        if isinstance(self.when, str):
            return self.when
        return f"{_qualname(self.when)}(facts)"
