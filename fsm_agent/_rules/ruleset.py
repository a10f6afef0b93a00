"""A list of rules, checked together against the registered tools, and judged in order.

Rules are tried in list order; the first whose ``when`` holds decides; none holding is
``pass``. Two kinds of rule decide only past a threshold:

* a ``limit`` rule holds for a matching call, but decides (``limit``) only once the run
  has already executed ``limit`` matching calls; below that, the next rules are tried
  (a budget, not a blanket allow);
* a rule with a ``schema`` holds only when the answer fails the schema.

A condition that cannot be evaluated fails closed: the rule decides ``deny`` (``stop``
for answers) with the error in the judgement.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any, Protocol, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from fsm_agent._errors import ConfigError
from fsm_agent._rules import cel
from fsm_agent._rules.canonical import (
    canonical_text,
    digest,
    digest_of_text,
    inputs_digest,
)
from fsm_agent._rules.facts import PASS, Facts, Judgement
from fsm_agent._rules.rule import PHASES, TOOL_PHASES, OpaqueCondition, Rule

__all__ = ["FORMAT", "RuleSet", "ToolFacts", "ToolInfo"]

#: The version of :meth:`RuleSet.to_json`'s form; a reader refuses another.
FORMAT = 1

#: How many schema failures a retry's detail lists (the model is told exactly what failed;
#: past a few it is noise).
_SCHEMA_ERRORS_SHOWN = 5


class ToolFacts(Protocol):
    """What the rules need of a registered tool (``fsm_agent.Tool`` has both)."""

    @property
    def effect(self) -> str: ...

    @property
    def schema(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class ToolInfo:
    """A tool's facts as plain data, for a rule set built without a registry."""

    effect: str = "read"
    schema: Mapping[str, Any] | None = None


Condition = cel.CelProgram | OpaqueCondition | None


@dataclass(frozen=True, eq=False)  # hashed by identity: keys of the reads cache
class _Compiled:
    rule: Rule
    index: int
    condition: Condition
    validator: Draft202012Validator | None

    @property
    def is_opaque(self) -> bool:
        return isinstance(self.condition, OpaqueCondition)

    def matches_tool(self, tool: str | None) -> bool:
        globs = self.rule.tools
        return globs is None or (isinstance(tool, str) and any(fnmatchcase(tool, g) for g in globs))


class RuleSet:
    """Rules compiled once: every mistake found at construction, in one :class:`ConfigError`.

    :param rules: the rules, in the order they are tried.
    :param tools: the registered tools by name (their ``effect`` and ``schema``); a glob
        must match one of them, and a rule's ``args.NAME`` must be an argument of a tool
        it matches.
    """

    def __init__(self, rules: Iterable[Rule], tools: Mapping[str, ToolFacts | ToolInfo]) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        problems = _tools_problems(tools)
        if problems:  # nothing about the rules can be checked against tools like these
            raise ConfigError(
                "the rule set's tools cannot be read:\n" + "\n".join(f"  - {p}" for p in problems)
            )
        self._tools = dict(tools)
        # Each tool's argument names, once (not once per rule that matches it).
        self._arguments = {name: _declared_arguments(t.schema) for name, t in self._tools.items()}
        compiled: list[_Compiled] = []
        seen: dict[str, int] = {}
        for index, rule in enumerate(self.rules):
            if not isinstance(rule, Rule):
                problems.append(f"rules[{index}]: not a Rule but {type(rule).__name__}")
                continue
            name = f"rule {rule.id!r} (rules[{index}])"
            mistakes = rule.field_problems()
            if isinstance(rule.id, str) and rule.id in seen:
                mistakes.append(f"the id is also rules[{seen[rule.id]}]'s; ids must be unique")
            if isinstance(rule.id, str):
                seen.setdefault(rule.id, index)
            if not any(m.startswith("on=") for m in mistakes):
                mistakes += self._glob_problems(rule)
                condition, more = self._condition(rule)
                mistakes += more
                validator, more = self._validator(rule)
                mistakes += more
                if not mistakes:
                    compiled.append(_Compiled(rule, index, condition, validator))
            problems += [f"{name}: {m}" for m in mistakes]
        if problems:
            count = "1 mistake" if len(problems) == 1 else f"{len(problems)} mistakes"
            raise ConfigError(f"{count} in the rules:\n" + "\n".join(f"  - {p}" for p in problems))
        self._compiled = tuple(compiled)
        self._by_phase: dict[str, tuple[_Compiled, ...]] = {
            phase: tuple(c for c in compiled if c.rule.on == phase) for phase in PHASES
        }
        #: The phases some rule is judged at (the loop's test before any judgement).
        self.phases = frozenset(phase for phase, rules in self._by_phase.items() if rules)
        self._for_tool = self._candidates_per_tool()
        #: Per tool phase, each registered tool: whether any rule can match it (what
        #: :meth:`judges` says, looked up: the loop asks for every call).
        self.judged: dict[str, dict[str, bool]] = {
            phase: {t: bool(f.rules) for (p, t), f in self._for_tool.items() if p == phase and t}
            for phase in TOOL_PHASES
        }
        self._entries = _EntryCache()
        #: Whether any rule reads the run's executed calls: a CEL condition naming
        #: ``calls``, a Python one (it may read anything), a limit (it counts them).
        self.reads_calls = any(
            c.is_opaque
            or c.rule.then == "limit"
            or (isinstance(c.condition, cel.CelProgram) and "calls" in c.condition.names)
            for c in compiled
        )
        header = {"format": FORMAT, "rules": [_rule_json(c) for c in self._compiled]}
        self._canonical = canonical_text(header)
        self._header = json.dumps(header, ensure_ascii=False)  # (to_json's copies, in order)
        self.hash = digest_of_text(self._canonical)

    # -- construction -------------------------------------------------------------------

    def _candidates_per_tool(self) -> dict[tuple[str, str | None], _Candidates]:
        """The rules of a phase that can match a tool, worked out once per tool name (for
        every registered tool, their conditions compiled into one batch). Tools that
        match the same rules share one batch (compiled once, not per tool)."""
        out: dict[tuple[str, str | None], _Candidates] = {}
        shared: dict[tuple[_Compiled, ...], _Candidates] = {}
        for phase, of_phase in self._by_phase.items():
            for tool in self._tools if phase in TOOL_PHASES else (None,):
                matching = tuple(c for c in of_phase if tool is None or c.matches_tool(tool))
                if matching not in shared:
                    shared[matching] = _Candidates.of(phase, matching)
                out[(phase, tool)] = shared[matching]
        return out

    def _glob_problems(self, rule: Rule) -> list[str]:
        if rule.on not in TOOL_PHASES or not isinstance(rule.tools, tuple):
            return []
        names = sorted(self._tools)
        unmatched = [
            g
            for g in rule.tools
            if isinstance(g, str) and g and not any(fnmatchcase(n, g) for n in names)
        ]
        known = ", ".join(names) if names else "none are registered"
        return [f"tools glob {g!r} matches no registered tool (tools: {known})" for g in unmatched]

    def _condition(self, rule: Rule) -> tuple[Condition, list[str]]:
        when = rule.when
        if when is None:
            return None, []
        if not isinstance(when, str):
            return (OpaqueCondition.of(when), []) if callable(when) else (None, [])
        if not cel.available():
            return None, [
                "a CEL condition needs the CEL engine: pip install 'fsm-agent[cel]' "
                "(Python 3.11+), or give when as a Python callable"
            ]
        program = cel.compile_condition(when, rule.on)
        if isinstance(program, list):
            return None, [f"when {when!r:.80}, {p.where()}: {p.message}" for p in program]
        return program, self._argument_problems(rule, when)

    def _argument_problems(self, rule: Rule, source: str) -> list[str]:
        """``args.NAME`` where no tool the rule matches has an argument NAME: a typo CEL's
        checker cannot see (``args`` is a map of any key)."""
        if rule.on not in TOOL_PHASES:
            return []
        matched = [
            self._arguments[n]
            for n in self._tools
            if rule.tools is None or any(fnmatchcase(n, g) for g in rule.tools)
        ]
        declared: set[str] = set()
        for names in matched:
            if names is None:
                return []  # a tool that takes any argument: nothing to hold a name against
            declared |= names
        if not matched:
            return []
        return [
            f"when {source!r:.80}, line {line}, column {column}: args.{name} is an argument "
            f"of no tool this rule matches (they take {', '.join(sorted(declared)) or 'none'})"
            for name, line, column in cel.argument_fields(source)
            if name not in declared
        ]

    @staticmethod
    def _validator(rule: Rule) -> tuple[Draft202012Validator | None, list[str]]:
        if not isinstance(rule.schema, Mapping) or rule.on != "answer":
            return None, []  # no schema, or one the field checks already refused
        try:
            Draft202012Validator.check_schema(rule.schema)
        except SchemaError as exc:
            where = "/".join(str(p) for p in exc.path) or "(top)"
            return None, [
                f"schema is not valid JSON Schema (Draft 2020-12) at {where}: {exc.message}"
            ]
        return Draft202012Validator(rule.schema), []

    # -- canonical form -----------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The rules in order, in canonical form: what a run's header records (a fresh
        copy each time: every run's header gets one)."""
        return json.loads(self._header)  # type: ignore[no-any-return]

    @property
    def canonical(self) -> str:
        """:meth:`to_json` as canonical text (its digest is :attr:`hash`)."""
        return self._canonical

    @property
    def opaque_rules(self) -> tuple[str, ...]:
        """The ids of rules whose ``when`` is a Python callable (not re-checkable)."""
        return tuple(c.rule.id for c in self._compiled if c.is_opaque)

    @classmethod
    def from_json(
        cls,
        data: Mapping[str, Any],
        tools: Mapping[str, ToolFacts | ToolInfo],
        callables: Iterable[Callable[[Any], Any]] | Mapping[str, Callable[[Any], Any]] = (),
    ) -> RuleSet:
        """Rebuild a rule set from :meth:`to_json`'s form (a run's header).

        An opaque rule needs its callable among ``callables`` (found by its digest of
        name and source); one missing is a :class:`ConfigError` naming the rule and the
        digest recorded. The rebuilt set's :attr:`hash` equals the recorded one.
        ``callables`` may also map recorded digests to stand-ins (``check``, which cannot
        run the application's code, takes those verdicts as recorded); the rebuilt
        set's hash then differs from the recorded one."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(
                f"rules recorded in format {got!r}; this version reads format {FORMAT}"
            )
        by_digest = (
            dict(callables)
            if isinstance(callables, Mapping)
            else {OpaqueCondition.of(fn).digest: fn for fn in callables}
        )
        rules: list[Rule] = []
        missing: list[str] = []
        for index, item in enumerate(data.get("rules", ())):
            try:
                rule, wanted = _rule_from_json(item, by_digest)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"recorded rules[{index}] cannot be read: {exc}") from None
            if wanted is not None:
                missing.append(f"rule {rule.id!r}: its when is the Python callable {wanted}")
            rules.append(rule)
        if missing:
            raise ConfigError(
                "the recorded rules need callables this runtime does not hold (pass them "
                "as callables=[...]):\n" + "\n".join(f"  - {m}" for m in missing)
            )
        return cls(rules, tools)

    # -- judging ------------------------------------------------------------------------

    def judges(self, phase: str, tool: str | None = None) -> bool:
        """Whether any rule of ``phase`` can match (``tool``: for the tool phases, that
        tool): where none can, a judgement would try nothing, so the loop skips it."""
        rules = self._by_phase.get(phase, ())
        if not rules:
            return False
        if phase not in TOOL_PHASES or tool is None:
            return True
        found = self._for_tool.get((phase, tool)) if type(tool) is str else None
        return bool((found or self._candidates(phase, tool)).rules)

    def judge(self, phase: str, facts: Facts) -> Judgement:
        """The verdict of ``phase``'s rules on ``facts``: the first rule that holds decides."""
        return self._judge(phase, facts, ())

    def judge_batch(self, batch: Sequence[Facts]) -> tuple[Judgement, ...]:
        """``before_tool`` for every call of one batch, before any of them runs.

        A call the rules let through counts toward a later call's ``limit`` in the same
        batch, as if executed: the batch's calls would all run before the next
        judgement, so judging each against the executed calls alone would let a batch of
        four past a limit of three."""
        passed: list[Facts] = []
        out: list[Judgement] = []
        for facts in batch:
            tool = facts.tool
            # The engine's facts of a registered tool whose candidates are plain CEL
            # rules (no limit: the calls ahead are not read) go straight to _quick.
            found = self._for_tool.get(("before_tool", tool)) if type(tool) is str else None
            judgement = (
                self._quick("before_tool", facts, found)
                if found is not None and found.plain and facts.appended and facts.effect
                else None
            )
            if judgement is None:
                ahead = tuple(
                    {"tool": f.tool, "args": f.variable("args"), "ok": True, "result": None}
                    for f in passed
                )
                judgement = self._judge("before_tool", facts, ahead)
            out.append(judgement)
            if judgement.verdict in (PASS, "allow"):
                passed.append(facts)
        return tuple(out)

    def executed(self, calls: list[Any], text: str) -> None:
        """The engine appended an entry to ``calls`` (a run's executed calls, an appended
        list): its log takes it at once, screened by ``text`` (the JSON texts its result
        and arguments were parsed from, each strict UTF-8: ``dumps_safe``, R3) rather than
        by encoding it; by encoding it where its tool's name is not ASCII (the one part
        the texts leave out). Where the log at hand is not that list's, up to the entry
        before, the next judgement's log takes it in instead."""
        log = self._entries.last
        if log.calls is calls and log.seen == len(calls) - 1:
            entry = calls[-1]
            tool = entry.get("tool")
            log.take(entry, text if type(tool) is str and tool.isascii() else None)

    def executions(self, rule_id: str, facts: Facts) -> int:
        """How many of ``facts.calls`` count toward rule ``rule_id``'s limit.

        A pure function of the executed calls (so it holds across a resume): a call
        counts when its tool matches the rule's globs and the rule's ``when`` holds for
        it (evaluated on that call, with the calls before it). One whose ``when`` cannot
        be evaluated counts: a limit fails closed too. ``before_model`` limits count
        ``counters.model_calls``."""
        compiled = next((c for c in self._compiled if c.rule.id == rule_id), None)
        if compiled is None or compiled.rule.then != "limit":
            raise KeyError(f"no limit rule {rule_id!r}")
        return self._count(compiled, facts, ())

    def _count(self, compiled: _Compiled, facts: Facts, ahead: Sequence[Mapping[str, Any]]) -> int:
        if compiled.rule.on == "before_model":
            count = (
                facts.counters.get("model_calls", 0) if isinstance(facts.counters, Mapping) else 0
            )
            return count if isinstance(count, int) else 0
        if not isinstance(facts.calls, list | tuple):
            return sys.maxsize  # executions that cannot be counted: the limit fails closed
        calls = [*facts.calls, *ahead]
        names = tuple(sorted(_reads((compiled,))))
        total = 0
        for position, call in enumerate(calls):
            tool = call.get("tool") if isinstance(call, Mapping) else None
            if not isinstance(tool, str) or not compiled.matches_tool(tool):
                continue
            if compiled.condition is None:
                total += 1
                continue
            past = replace(
                facts,
                tool=tool,
                effect=self._effect(tool),
                args=call.get("args"),
                result=call.get("result"),
                calls=calls[:position],
                call_id=None,
                appended=False,  # a slice made here, not the run's growing list
            )
            holds = _evaluate(compiled, past, _Inputs(compiled.rule.on, past, self._entries, names))
            total += holds is not False  # True, or an error: counted (fails closed)
        return total

    def _effect(self, tool: str | None) -> str | None:
        info = self._tools.get(tool) if isinstance(tool, str) else None
        return info.effect if info is not None else None

    def _candidates(self, phase: str, tool: str | None) -> _Candidates:
        if phase not in self._by_phase:
            raise ValueError(f"{phase!r} is not a phase")
        # A tool name that is not a string (never one a model may call) matches no glob.
        key = (phase, tool if phase in TOOL_PHASES and isinstance(tool, str) else None)
        found = self._for_tool.get(key)
        if found is None:  # a tool that is not registered: no batch compiled for it
            rules = tuple(c for c in self._by_phase[phase] if c.matches_tool(tool))
            reads = _reads(rules)
            found = _Candidates(rules, reads, None, names=tuple(sorted(reads)))
            if len(self._for_tool) < 10_000:  # a bounded cache: tool names come from a model
                self._for_tool[key] = found
        return found

    def _judge(self, phase: str, facts: Facts, ahead: Sequence[Mapping[str, Any]]) -> Judgement:
        found = self._candidates(phase, facts.tool)
        if phase in TOOL_PHASES and facts.effect is None and isinstance(facts.tool, str):
            facts = replace(facts, effect=self._effect(facts.tool))
        quick = self._quick(phase, facts, found) if found.plain and facts.appended else None
        if quick is not None:
            return quick
        inputs = _Inputs(phase, facts, self._entries, found.names, found.counters)
        results = inputs.batch_results(found) if found.plain else None
        if results is not None:
            return self._plain(inputs, found, results)
        known = inputs.evaluate_batch(found) if found.batch is not None else None
        tried: list[str] = []
        for position, compiled in enumerate(found.rules):
            rule = compiled.rule
            tried.append(rule.id)
            if known is not None:
                inputs.upto = found.upto[position]
            holds = _evaluate(compiled, facts, inputs, known)
            if isinstance(holds, str):
                closed = "stop" if phase == "answer" else "deny"
                return self._verdict(
                    inputs,
                    tried,
                    compiled,
                    closed,
                    f"rule {rule.id!r} could not be evaluated: {holds}",
                    holds,
                )
            if not holds:
                continue
            if rule.then == "limit":
                count = self._count(compiled, facts, ahead)
                if count < (rule.limit or 0):
                    continue
                what = "model calls" if phase == "before_model" else "executions of matching calls"
                detail = rule.message or f"at most {rule.limit} {what} per run ({count} so far)"
                return self._verdict(inputs, tried, compiled, "limit", detail, None)
            if compiled.validator is not None:
                failed = _schema_failures(compiled.validator, facts.answer)
                if failed is None:
                    continue
                detail = f"{rule.message}: {failed}" if rule.message else failed
                return self._verdict(inputs, tried, compiled, rule.then, detail, None)
            detail = rule.message or f"rule {rule.id!r}: {rule.condition_text()}"
            return self._verdict(inputs, tried, compiled, rule.then, detail, None)
        return Judgement.of(
            phase=phase,
            verdict=PASS,
            rule_id=None,
            inputs_digest=inputs.digest(),
            call_id=facts.call_id,
            tried=tuple(tried),
            opaque=inputs.opaque_ids(),
        )

    def _quick(self, phase: str, facts: Facts, found: _Candidates) -> Judgement | None:
        """:meth:`_plain`'s judgement of the engine's facts (``appended``: its executed
        calls; trusted and plain variables as ``core/judging.py`` hands them over) with
        none of :class:`_Inputs`'s bookkeeping: each variable screened and given its line
        of the digest in one pass, in the digest's order. ``None`` wherever this is not
        sure to judge as the general path does (a variable to screen by walking it, a
        call CEL cannot take, a condition ``celfast`` leaves to the engine): the general
        path then judges (``tests/test_rules_quick.py`` holds the two to one judgement)."""
        screen = found.screen
        taken = screen(facts, self._entries) if screen is not None else None
        if taken is None:
            return None
        screened, lines, log = taken
        batch = cast(tuple[cel.CelBatch, Any], found.batch)[0]  # (a plain one has a batch)

        def activation() -> Any:
            return cel.activation(phase, screened)

        split = found.split
        results = (
            split.results(log, screened, activation, batch.size)
            if split is not None and log is not None
            else None
        )
        if results is None:  # (CelBatch.evaluate_on, without its call)
            fast = batch.fast
            results = fast(screened) if fast is not None else None
            if results is None:
                results = batch.evaluate(activation())
                if results is None:
                    return None
        if True not in results:
            # (Positional: the common case, once per judged call.)
            call_id = facts.call_id
            return Judgement.of(phase, PASS, None, inputs_digest(phase, call_id, lines), None,
                                call_id, None, found.ids)  # fmt: skip
        position = results.index(True)
        read = frozenset(found.upto[position])
        lines = [line for name, line in zip(found.names, lines, strict=True) if name in read]
        rule = found.rules[position].rule
        return Judgement.of(phase=phase, verdict=rule.then, rule_id=rule.id,
                            inputs_digest=inputs_digest(phase, facts.call_id, lines),
                            detail=rule.message or f"rule {rule.id!r}: {rule.condition_text()}",
                            call_id=facts.call_id, tried=found.ids[: position + 1])  # fmt: skip

    def _plain(self, inputs: _Inputs, found: _Candidates, results: list[bool]) -> Judgement:
        """The common case without the loop: every rule a CEL condition with a plain
        verdict, all evaluated at once, and the first that holds decides."""
        if True not in results:
            inputs.upto = found.names
            return Judgement.of(
                phase=inputs.phase,
                verdict=PASS,
                rule_id=None,
                inputs_digest=inputs.digest(),
                call_id=inputs.facts.call_id,
                tried=found.ids,
            )
        position = results.index(True)
        inputs.upto = found.upto[position]
        compiled = found.rules[position]
        rule = compiled.rule
        detail = rule.message or f"rule {rule.id!r}: {rule.condition_text()}"
        tried = list(found.ids[: position + 1])
        return self._verdict(inputs, tried, compiled, rule.then, detail, None)

    @staticmethod
    def _verdict(
        inputs: _Inputs,
        tried: list[str],
        compiled: _Compiled,
        verdict: str,
        detail: str,
        error: str | None,
    ) -> Judgement:
        return Judgement.of(
            phase=inputs.phase,
            verdict=verdict,
            rule_id=compiled.rule.id,
            inputs_digest=inputs.digest(),
            detail=detail,
            call_id=inputs.facts.call_id,
            error=error,
            tried=tuple(tried),
            opaque=inputs.opaque_ids(),
        )


class _EntryCache:
    """Each executed call's screened form, computed once per run, not once per judgement:
    ``calls`` only grows, and its entries (built once by the engine, never changed) are
    screened in full otherwise at every call the rules judge.

    Keyed by identity, holding the entry itself so that its id is not reused; bounded.
    A list the caller vouches only grows (``Facts.appended``, the engine's) has a
    :class:`_Log` instead: its screened entries as a list that grows with it, so a
    judgement late in a long run walks none of the entries it has seen before (its
    entries are not kept here as well: each is taken in once, when it is appended)."""

    __slots__ = ("_logs", "_screened", "context", "last", "texts")

    LIMIT = 20_000
    #: The logs kept (one per run being judged; a runtime drives few runs at once).
    LOGS = 64

    def __init__(self) -> None:
        self._screened: dict[int, tuple[Any, Any]] = {}
        self._logs: dict[int, _Log] = {}
        #: The last context digested, with its digest; each name's canonical text.
        self.context: tuple[Any, str] = (None, "")
        self.texts: dict[str, str] = {}
        #: The log used last (the run being judged: its judgements and its executed
        #: calls find it here, not by a lookup; ``log`` where another run's was last).
        self.last = _Log([])

    def text(self, name: str) -> str:
        """:func:`canonical_text` of a name (a tool's, an effect), once per name."""
        text = self.texts.get(name)
        if text is None:
            if len(self.texts) >= self.LIMIT:
                self.texts.clear()
            text = self.texts[name] = canonical_text(name)
        return text

    def context_digest(self, context: Any) -> str:
        """The digest of a trusted context (the run's, never changed): once per run."""
        held, known = self.context
        if held is not context:
            known = digest(context)
            self.context = (context, known)
        return known

    def log(self, calls: list[Any]) -> _Log:
        """The log of ``calls`` (an appended list), brought up to its length."""
        log = self._logs.get(id(calls))
        count = len(calls)
        # Kept while the list still starts with the entries seen (it only grew).
        if (
            log is None
            or log.calls is not calls
            or (seen := log.seen) > count
            or (seen and log.last is not calls[seen - 1])
        ):
            if len(self._logs) >= self.LOGS:
                self._logs.clear()
            log = self._logs[id(calls)] = _Log(calls)
            seen = 0
        if seen < count:
            log.extend()
        self.last = log
        return log

    def screened(self, calls: Sequence[Any]) -> list[Any]:
        out = []
        for position, entry in enumerate(calls):
            out.append(self.screen_entry(entry, position))
        return out

    def screen_entry(self, entry: Any, position: int) -> Any:
        hit = self._screened.get(id(entry))
        if hit is None or hit[0] is not entry:
            hit = (entry, cel.screen(entry, f"calls[{position}]"))
            if len(self._screened) >= self.LIMIT:
                self._screened.clear()
            self._screened[id(entry)] = hit
        return hit[1]


class _Log:
    """One appended list's entries, screened, as far as it has been seen, and the
    tallies of the quantifiers judged over them (each entry evaluated once, as it is
    taken in, for every split that asked for its tallies).

    ``screened`` stops at the first entry CEL cannot take (``refused`` says why): a rule
    reading ``calls`` then fails closed, as when the whole list is screened at once."""

    __slots__ = ("calls", "last", "refused", "screened", "seen", "tallies", "watched")

    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls
        self.seen = 0  # how many of the entries were taken in (the digest's count)
        self.last: Any = None  # the last entry seen, to tell that the list only grew
        self.screened: list[Any] = []
        self.refused: cel.Unrepresentable | None = None
        #: Per split (by identity: the rule set holds them), its quantifiers' tallies;
        #: and the same pairs, to bring up to date as entries come in.
        self.tallies: dict[_Split, _Tallies] = {}
        self.watched: list[tuple[Callable[[Any], Sequence[bool | None]], _Tallies]] = []

    def tallies_of(self, split: _Split) -> _Tallies | None:
        """The tallies of ``split``'s quantifiers over every call, each call evaluated
        once for all of them; ``None`` where a call is one CEL cannot take."""
        if self.refused is not None:
            return None
        found = self.tallies.get(split)
        if found is None:  # its first judgement in this run: over the calls so far
            found = self.tallies[split] = _Tallies()
            for entry in self.screened:
                found.add(split.bodies(entry))
            self.watched.append((split.bodies, found))
        return found

    def extend(self) -> None:
        """Take in the entries appended since (each encoded: :meth:`take` where their
        texts are at hand)."""
        calls = self.calls
        for position in range(self.seen, len(calls)):
            self.take(calls[position], None)

    def take(self, entry: Any, text: str | None) -> None:
        """Take in ``entry``, the list's next: screened (taken as it is where a JSON text
        of it shows it within CEL's limits: ``text``, the engine's, joining the texts its
        parts were parsed from, else its canonical text; else walked and copied by
        :func:`cel.screen`), then tallied for every split that asked."""
        position = self.seen
        self.seen, self.last = position + 1, entry
        if self.refused is not None:
            return
        if not _within_limits(canonical_text(entry) if text is None else text):
            try:
                entry = cel.screen(entry, f"calls[{position}]")
            except cel.Unrepresentable as exc:
                self.refused = exc
                return
        self.screened.append(entry)
        for bodies, found in self.watched:
            held = bodies(entry)
            if found.each is None and True not in held and None not in held:
                found.seen += 1  # (the common case: no tally per quantifier yet)
            else:
                found.add(held)


class _Inputs:
    """The inputs of one judgement: screened once, on first use, for all its rules."""

    __slots__ = (
        "_activation",
        "_counters",
        "_entries",
        "_log",
        "_names",
        "_opaque",
        "_parts",
        "_ready",
        "_refused",
        "_screened",
        "_wanted",
        "facts",
        "phase",
        "upto",
    )

    def __init__(
        self,
        phase: str,
        facts: Facts,
        entries: _EntryCache,
        wanted: tuple[str, ...],
        counters: tuple[str, ...] | None = None,
    ) -> None:
        self.phase = phase
        self.facts = facts
        self._counters = counters  # the counters' fields the conditions read, if by name
        #: Each variable's component of the digest (``digest``), kept where screening
        #: worked it out on the way (a plain variable's canonical text, say).
        self._parts: dict[str, str] = {}
        self._entries = entries
        self._wanted = wanted  # what the candidate rules read, by name (sorted)
        self._log: _Log | None = None  # the run's calls as a log, fetched once
        self._screened: dict[str, Any] = {}
        self._refused: dict[str, cel.Unrepresentable] = {}
        #: What the batch-evaluated rules tried read, by name.
        self.upto: tuple[str, ...] = ()
        self._activation: Any = None
        self._ready = False  # whether the wanted variables were screened
        self._names: set[str] = set()  # the variables the tried rules read (digested)
        self._opaque: list[str] = []

    def screened_for(self, program: cel.CelProgram) -> dict[str, Any]:
        """The screened inputs for ``program``; raises
        :class:`~fsm_agent._rules.cel.Unrepresentable` for an input of it CEL cannot take.

        Screened once per judgement with every variable the candidate rules read, so
        they serve them all; a variable CEL cannot take is left out and fails only the
        rules that read it."""
        self._names |= program.names
        try:
            return self._screened_all()
        except cel.Unrepresentable:
            for name in program.names & self._refused.keys():
                raise self._refused[name] from None
            return self._screened

    @property
    def screened(self) -> dict[str, Any]:
        """The variables screened so far (all the wanted ones, once screened)."""
        return self._screened

    def activation(self) -> Any:
        """The screened inputs as the engine's activation, built once, on first need
        (a condition ``celfast`` evaluates needs none)."""
        if self._activation is None:
            self._activation = cel.activation(self.phase, self._screened)
        return self._activation

    def evaluate_batch(self, found: _Candidates) -> dict[int, bool] | None:
        """The batch's results by condition id, or ``None`` (then one by one)."""
        assert found.batch is not None
        results = self.batch_results(found)
        return dict(zip(found.batch[1], results, strict=True)) if results is not None else None

    def batch_results(self, found: _Candidates) -> list[bool] | None:
        """The batch's results in the order of its conditions, or ``None``."""
        assert found.batch is not None
        try:
            screened = self._screened_all()
        except cel.Unrepresentable:
            return None
        split, facts = found.split, self.facts
        if split is not None and facts.appended and type(facts.calls) is list:
            results = split.results(self.log(), screened, self.activation, found.batch[0].size)
            if results is not None:
                return results
        return found.batch[0].evaluate_on(screened, self.activation)

    def _screened_all(self) -> dict[str, Any]:
        if not self._ready:
            self._ready = True
            self._screen_wanted()
        if self._refused:
            raise next(iter(self._refused.values()))
        return self._screened

    def _screen_wanted(self) -> None:
        facts, screened, parts = self.facts, self._screened, self._parts
        trusted, plain = facts.trusted, facts.plain
        for name in self._wanted:
            if name in trusted and name != "counters":  # as they are (no projection)
                value = screened[name] = getattr(facts, name)
                if name in _NAMES and type(value) is str:  # its digest part, on the way
                    parts[name] = self._entries.text(value)
                elif name == "context":  # (the run's: digested once per run)
                    parts[name] = self._entries.context_digest(value)
                continue
            if name == "calls" and facts.appended and type(facts.calls) is list:
                log = self.log()  # (not copied, as variable() does)
                parts[name] = f"count:{log.seen}"
                if log.refused is not None:
                    self._refused[name] = log.refused
                else:
                    screened[name] = log.screened
                continue
            value = self._value(name)
            if name in trusted:  # the engine's counters (a projection): its part too
                screened[name], parts[name] = value, canonical_text(value)
                continue
            if name in plain:
                text = canonical_text(value)
                if _within_limits(text):
                    screened[name], parts[name] = value, text
                    continue
            try:
                if name == "calls" and isinstance(value, list):
                    screened[name] = self._entries.screened(value)
                else:
                    screened[name] = cel.screen(value, name)
            except cel.Unrepresentable as exc:
                self._refused[name] = exc

    def log(self) -> _Log:
        """The run's calls (an appended list) as their log, up to date: fetched once
        per judgement (they do not grow while it is judged)."""
        log = self._log
        if log is None:
            log = self._log = self._entries.log(self.facts.calls)  # type: ignore[arg-type]
        return log

    def _value(self, name: str) -> Any:
        """A variable as the conditions are given it, and digested: of ``counters``, only
        the fields they read where they read it by field name (unless a Python
        condition ran: it may read any)."""
        value = self.facts.variable(name)
        fields = self._counters
        if name != "counters" or fields is None or self._opaque or type(value) is not dict:
            return value
        return {field: value[field] for field in fields if field in value}

    def read_everything(self, rule_id: str) -> None:
        """A Python condition may read any fact: all of the phase's are digested."""
        self._names |= cel.PHASE_VARIABLES[self.phase].keys()
        self._opaque.append(rule_id)

    def opaque_ids(self) -> tuple[str, ...]:
        return tuple(self._opaque)

    def digest(self) -> str:
        """The digest of what the tried rules read (:func:`inputs_digest`): each variable
        as its canonical text, but ``calls`` by its length (its entries are bound by the
        trace's chain, which records each before the judgement) and ``context`` as its
        digest (computed once per run where it is trusted: the run's, fixed). A part
        screening worked out on the way is taken as it is."""
        names = self.upto if not self._names else sorted(self._names.union(self.upto))
        parts = self._parts
        if self._opaque:
            parts.pop("counters", None)  # a Python condition ran: all of them, not a projection
        out = []
        for name in names:
            part = parts.get(name)
            if part is None:
                part = parts[name] = self._part(name)
            out.append(f"{name}={part}")
        return inputs_digest(self.phase, self.facts.call_id, out)

    def _part(self, name: str) -> str:
        facts = self.facts
        if name == "calls":
            calls = facts.calls
            if not isinstance(calls, list | tuple):
                return canonical_text(calls)
            return f"count:{len(calls)}"  # (the trace's chain binds the entries)
        if name == "context":
            context = facts.context
            trusted = name in facts.trusted
            return self._entries.context_digest(context) if trusted else digest(context)
        return canonical_text(self._value(name))


#: A generated screener (:func:`_screener`).
Screen = Callable[[Facts, "_EntryCache"], "tuple[dict[str, Any], list[str], _Log | None] | None"]

#: What the quick path's screener does for each variable (``{v}``: its local, ``{q}``:
#: its name as a literal): take it as the engine hands it over, with its part of the
#: digest (as :meth:`_Inputs._screen_wanted` and :meth:`_Inputs.digest` make them), or
#: return ``None`` (not sure: the general path judges).
_SCREEN_STEPS = {
    # Plain JSON from the loop: screened by its canonical text (``Facts.plain``).
    "args": """
    {v} = facts.args
    if {v} is None: {v} = {{}}
    {t} = canonical_text({v})
    if not within({t}): return None""",
    "result": """
    {v} = facts.result
    {t} = canonical_text({v})
    if not within({t}): return None""",
    # The run's executed calls, as a log that grows with them (``Facts.appended``).
    "calls": """
    {v} = facts.calls
    if type({v}) is not list or 'calls' in trusted: return None
    log = entries.last
    if log.calls is not {v} or log.seen != len({v}): log = entries.log({v})
    if log.refused is not None: return None
    {v} = log.screened
    {t} = 'count:' + str(log.seen)""",
    # Trusted, as they are: the counters (those read, if by field name: :data:`_PROJECT`),
    # the context (digested once per run), and names (a tool's, an effect: their text once
    # each).
    "counters": """
    {v} = facts.counters
    if type({v}) is not dict: return None{project}""",
    "context": """
    {v} = facts.context
    {t} = held[1] if (held := entries.context)[0] is {v} else entries.context_digest({v})""",
    "tool": """
    {v} = facts.tool
    if type({v}) is not str: return None
    {t} = entries.texts.get({v}) or entries.text({v})""",
    "effect": """
    {v} = facts.effect
    if type({v}) is not str: return None
    {t} = entries.texts.get({v}) or entries.text({v})""",
}
#: What each variable's step needs the caller to vouch for (``Facts.trusted``, ``plain``).
_TRUSTED_STEPS = frozenset({"counters", "context", "tool", "effect"})
_PLAIN_STEPS = frozenset({"args", "result"})
#: The counters read by field name: where every one is an int (the engine's are), the
#: projection and its canonical text spelled out (``F{j}``: a field's name, ``P{j}``: the
#: text before its value); otherwise both the general way.
_PROJECT = """
    if {present}:
        {v} = {{{pairs}}}
        {t} = {text} + '}}'
    else:
        {v} = {{f: {v}[f] for f in FIELDS if f in {v}}}
        {t} = canonical_text({v})"""


def _screener(names: tuple[str, ...], fields: tuple[str, ...] | None) -> Screen | None:
    """One function screening exactly ``names`` (sorted: the digest's order), straight
    line: no loop over names, no lookup per variable. ``None`` where a variable is one
    it does not take (``answer``: the general path screens it). The source is built from
    the fixed templates above and the variables' names only (``fields`` are passed as
    values, never spelled into it)."""
    if any(name not in _SCREEN_STEPS for name in names):
        return None
    namespace: dict[str, Any] = {"canonical_text": canonical_text, "within": _within_limits,
                                 "FIELDS": fields}  # fmt: skip

    def project(v: str, t: str) -> str:
        if fields is None:
            return f"\n    {t} = canonical_text({v})"
        if not fields:  # read by field name, none of them a counter
            return f"\n    {v} = {{}}\n    {t} = '{{}}'"
        each = range(len(fields))
        return _PROJECT.format(
            present=" and ".join(f"type(x{j} := {v}.get(F{j})) is int" for j in each),
            pairs=", ".join(f"F{j}: x{j}" for j in each),
            text=" + ".join(f"P{j} + str(x{j})" for j in each),
            v=v, t=t,
        )  # fmt: skip

    for j, field in enumerate(fields or ()):
        namespace[f"F{j}"] = field
        namespace[f"P{j}"] = ("{" if j == 0 else ",") + canonical_text(field) + ":"
    head = ["def screen(facts, entries):", "    trusted, plain = facts.trusted, facts.plain"]
    for needed, where, steps in (("TRUSTED", "trusted", _TRUSTED_STEPS),
                                 ("PLAIN", "plain", _PLAIN_STEPS)):  # fmt: skip
        if steps.intersection(names):
            namespace[needed] = steps.intersection(names)
            head.append(f"    if not {needed} <= {where}: return None")
    body, values, lines = [], [], []
    for i, name in enumerate(names):
        v, t = f"v{i}", f"t{i}"
        body.append(_SCREEN_STEPS[name].format(v=v, t=t, project=project(v, t)))
        values.append(f"{name!r}: {v}")
        lines.append(f"{name + '='!r} + {t}")
    log = "log" if "calls" in names else "None"
    source = (
        "\n".join(head)
        + "".join(body)
        + f"\n    return {{{', '.join(values)}}}, [{', '.join(lines)}], {log}\n"
    )
    exec(compile(source, "<fsm_agent._rules.ruleset screen>", "exec"), namespace)
    return namespace["screen"]  # type: ignore[no-any-return]


#: The variables that are names (strings the run repeats: a tool's, an effect).
_NAMES = frozenset({"tool", "effect"})


@dataclass(frozen=True)
class _Candidates:
    """The rules one judgement tries, what their CEL conditions read, and their batch."""

    rules: tuple[_Compiled, ...]
    reads: frozenset[str]
    batch: tuple[cel.CelBatch, tuple[int, ...]] | None  # and the ids of its conditions
    #: What the CEL conditions of ``rules[: i + 1]`` read, by name: a judgement that
    #: stops at rule ``i`` digests this, with no set union per rule tried.
    upto: tuple[tuple[str, ...], ...] = ()
    ids: tuple[str, ...] = ()  # the rules' ids
    #: Every rule a CEL condition deciding as it holds (no limit, no schema): the batch's
    #: first true result is the verdict.
    plain: bool = False
    #: The batch's conditions that are quantifiers over ``calls`` (their positions in
    #: it), and the rest (their positions, and one program for them): a run's growing
    #: calls are then judged from tallies, and CEL is handed the rest only.
    split: _Split | None = None
    names: tuple[str, ...] = ()  # ``reads`` by name
    #: The counters the CEL conditions read, where each reads them by field name only
    #: (``counters.model_calls``): they are given, and digested, those fields only.
    counters: tuple[str, ...] | None = None
    #: ``(facts, entries) -> (screened, digest lines, log) | None`` for the quick path
    #: (:func:`_screener`), where every variable read is one it can take.
    screen: Screen | None = None

    @classmethod
    def of(cls, phase: str, rules: tuple[_Compiled, ...]) -> _Candidates:
        programs = [c.condition for c in rules if isinstance(c.condition, cel.CelProgram)]
        batch = cel.compile_batch(programs, phase)
        ids = tuple(id(p) for p in programs)
        upto = tuple(tuple(sorted(_reads(rules[: i + 1]))) for i in range(len(rules)))
        plain = batch is not None and all(
            isinstance(c.condition, cel.CelProgram)
            and c.rule.then != "limit"
            and c.validator is None
            for c in rules
        )
        return cls(
            rules,
            _reads(rules),
            (batch, ids) if batch is not None else None,
            upto,
            tuple(c.rule.id for c in rules),
            plain,
            _Split.of(phase, programs) if batch is not None else None,
            tuple(sorted(_reads(rules))),
            _counter_fields(programs),
            _screener(tuple(sorted(_reads(rules))), _counter_fields(programs)) if plain else None,
        )


class _Tallies:
    """A split's quantifiers over the calls seen: while every body was false on every
    call (a rule that has not come near holding: the common case), the count alone;
    from the first call one held or erred for, a tally per quantifier."""

    __slots__ = ("each", "seen")

    def __init__(self) -> None:
        self.seen = 0
        self.each: list[cel.Tally] | None = None

    def add(self, held: Sequence[bool | None]) -> None:
        """One more call, each quantifier's body on it."""
        if self.each is None:
            if True not in held and None not in held:
                self.seen += 1
                return
            self.each = [cel.Tally.of_falses(self.seen) for _ in held]
        self.seen += 1
        for tally, one in zip(self.each, held, strict=True):
            tally.add(one)


@dataclass(frozen=True, eq=False)  # by identity: the key of a run's tallies
class _Split:
    """A batch as its quantifiers over ``calls`` and one program for the rest."""

    quantifiers: tuple[cel.Quantifier, ...]  # the batch's quantifiers, in its order
    program: cel.CelBatch | cel.CelProgram | None  # for the rest: none, one, or a batch
    bodies: Callable[[Any], Sequence[bool | None]]  # one call -> each quantifier's body on it
    #: Where each of the batch's conditions is found in the rest's results followed by
    #: the quantifiers' verdicts.
    order: tuple[int, ...]
    #: The quantifiers' verdicts over no call, and over calls none of which any body
    #: held or erred for (then no tally is kept per quantifier: :class:`_Tallies`).
    if_none: tuple[bool | None, ...]
    if_all_false: tuple[bool | None, ...]
    batched: bool = False  # ``program`` is a batch
    fast: Callable[[dict[str, Any]], list[bool] | None] | None = None  # (its ``fast``)

    @classmethod
    def of(cls, phase: str, programs: list[cel.CelProgram]) -> _Split | None:
        quantified = tuple(
            (i, p.quantifier) for i, p in enumerate(programs) if p.quantifier is not None
        )
        if not quantified:
            return None
        rest = tuple(i for i, p in enumerate(programs) if p.quantifier is None)
        others = [programs[i] for i in rest]
        program: cel.CelBatch | cel.CelProgram | None = (
            None if not others else others[0] if len(others) == 1 else None
        )
        if len(others) > 1:
            program = cel.compile_batch(others, phase)
            if program is None:
                return None  # the rest cannot be one program: the whole batch it is
        found_at = [*rest, *(i for i, _ in quantified)]
        order = tuple(found_at.index(i) for i in range(len(programs)))
        quantifiers = tuple(q for _, q in quantified)
        if_none = tuple(q.verdict(cel.Tally.of_falses(0)) for q in quantifiers)
        if_all_false = tuple(q.verdict(cel.Tally.of_falses(1)) for q in quantifiers)
        bodies = cel.bodies(quantifiers)
        fast = program.fast if isinstance(program, cel.CelBatch) else None
        return cls(quantifiers, program, bodies, order, if_none, if_all_false,
                   isinstance(program, cel.CelBatch), fast)  # fmt: skip

    def results(
        self, log: _Log, screened: dict[str, Any], activation: Callable[[], Any], size: int
    ) -> list[bool] | None:
        """The batch's results in its order, or ``None`` (then it is evaluated whole)."""
        tallies = log.tallies.get(self) or log.tallies_of(self)  # (kept up by the log)
        if tallies is None:
            return None
        held: Sequence[bool | None]
        if tallies.each is None:  # every body false on every call: verdicts known
            held = self.if_all_false if tallies.seen else self.if_none
        else:
            held = [q.verdict(t) for q, t in zip(self.quantifiers, tallies.each, strict=True)]
            if None in held:
                return None
        program = self.program
        rest: list[bool] = []
        if self.batched:  # (CelBatch.evaluate_on, without its call: once per judgement)
            fast = self.fast
            got = fast(screened) if fast is not None else None
            if got is None:
                got = cast(cel.CelBatch, program).evaluate(activation())
                if got is None:
                    return None
            rest = got
        elif program is not None:
            single = program.evaluate_on(screened, activation)
            if type(single) is not bool:
                return None
            rest = [single]
        if True not in held and True not in rest:
            return [False] * size  # (the common case: none holds, in any order)
        combined: list[Any] = [*rest, *held]  # (none of held is None here)
        return [combined[i] for i in self.order]


#: Bytes to bytes: each ASCII digit to ``0``, anything else to a space. A UTF-8 text's
#: digits are single bytes and no other character has a byte in ``0``-``9``, so a run of
#: nineteen digits in the text is a run of nineteen ``0`` in its translation (one pass in
#: C; a regular expression's search costs some ten times as much).
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
#: Nineteen digits in a row: where a canonical text has none, every integer in it is
#: within CEL's 64 bits (2**63 has 19 digits).
_LONG_RUN = b"0" * 19
_MAX_DEPTH = cel.MAX_DEPTH


def _within_limits(text: str) -> bool:
    """Whether a plain JSON value whose canonical text is ``text`` is one CEL takes (or
    a value whose parts are JSON values with these texts: :meth:`RuleSet.executed`)."""
    if text.startswith("!"):
        return False
    size = len(text)
    if size < 19:  # too short for 19 digits, or for CEL's nesting limit
        return True
    if size > _MAX_DEPTH and text.count("{") + text.count("[") > _MAX_DEPTH:
        return False
    try:
        return _LONG_RUN not in text.encode("utf-8").translate(_DIGITS)
    except UnicodeEncodeError:  # a lone surrogate (a canonical text never holds one)
        return False


def _counter_fields(programs: list[cel.CelProgram]) -> tuple[str, ...] | None:
    """The counters ``programs`` read, by name, if each reads them by field name only."""
    fields: set[str] = set()
    for program in programs:
        if "counters" in program.names:
            selected = cel.selected_fields(program.source, "counters")
            if selected is None:
                return None
            fields |= selected
    return tuple(sorted(fields))


def _reads(rules: tuple[_Compiled, ...]) -> frozenset[str]:
    """The variables the CEL conditions of ``rules`` read."""
    return frozenset().union(
        *(c.condition.names for c in rules if isinstance(c.condition, cel.CelProgram))
    )


def _evaluate(
    compiled: _Compiled,
    facts: Facts,
    inputs: _Inputs,
    known: Mapping[int, bool] | None = None,
) -> bool | str:
    """Whether the rule's condition holds, or why it cannot be said (then: fail closed).

    ``known`` holds the batch's results (by the condition's id) where it evaluated."""
    condition = compiled.condition
    if condition is None:
        return True
    if known is not None and isinstance(condition, cel.CelProgram):
        return known[id(condition)]  # what it reads is digested through inputs.upto
    if isinstance(condition, OpaqueCondition):
        inputs.read_everything(compiled.rule.id)
        try:
            value = condition.fn(facts)
        except Exception as exc:  # a user's callable: anything it raises fails closed
            return f"{condition.qualname} raised {type(exc).__name__}: {exc!s:.200}"
        if not isinstance(value, bool):
            return f"{condition.qualname} returned {type(value).__name__}, not a bool"
        return value
    try:
        screened = inputs.screened_for(condition)
    except cel.Unrepresentable as exc:
        return f"an input CEL cannot take: {exc}"
    return condition.evaluate_on(screened, inputs.activation)


def _schema_failures(validator: Draft202012Validator, answer: str | None) -> str | None:
    """What is wrong with the answer against the schema, or ``None`` if it meets it."""
    if not isinstance(answer, str):
        return "there is no answer text to parse as JSON"
    try:
        value = json.loads(answer, parse_constant=_refuse_constant)
    except RecursionError:
        return "the answer is nested too deep to parse as JSON"
    except ValueError as exc:
        return f"the answer is not JSON ({exc})"
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
    except RecursionError:
        return "the answer is nested too deep to check against the schema"
    if not errors:
        return None
    shown = [
        f"at {_json_path(e.absolute_path)}: {e.message:.200}" for e in errors[:_SCHEMA_ERRORS_SHOWN]
    ]
    more = len(errors) - len(shown)
    return (
        "the answer does not meet the schema: "
        + "; ".join(shown)
        + (f" (and {more} more)" if more else "")
    )


#: What makes an object schema take fields it does not list (as ``tools/registry.py``
#: reads them: a schema silent about extra fields is closed when a tool is registered).
_OPEN_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def _tools_problems(tools: Any) -> list[str]:
    """What makes ``tools`` unusable: it must map names to objects with an ``effect``
    and a ``schema`` (``fsm_agent.Tool``, or :class:`ToolInfo`)."""
    if not isinstance(tools, Mapping):
        hint = " (for a ToolRegistry: {tool.name: tool for tool in registry})"
        return [f"tools must be a mapping of name to tool, got {type(tools).__name__}{hint}"]
    problems = []
    for name, tool in tools.items():
        if not isinstance(name, str):
            problems.append(f"a tool name must be a string, got {name!r:.40}")
        elif not hasattr(tool, "effect") or not hasattr(tool, "schema"):
            problems.append(
                f"tools[{name!r}] is a {type(tool).__name__}, not a tool: give an "
                "fsm_agent.Tool or ToolInfo(effect, schema)"
            )
    return problems


def _declared_arguments(schema: Any) -> set[str] | None:
    """The argument names a tool's schema allows, or ``None`` if it allows any name."""
    if not isinstance(schema, Mapping):
        return None
    if any(k in schema and schema[k] is not False for k in _OPEN_KEYWORDS):
        return None
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        return set(properties)
    return set() if schema.get("type") == "object" else None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_path(path: Iterable[Any]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _rule_json(compiled: _Compiled) -> dict[str, Any]:
    rule = compiled.rule
    condition = compiled.condition
    when: dict[str, Any] | None
    if condition is None:
        when = None
    elif isinstance(condition, OpaqueCondition):
        when = {
            "python": condition.qualname,
            "digest": condition.digest,
            "source": condition.has_source,
        }
    else:
        when = {"cel": condition.source}
    return {
        "id": rule.id,
        "on": rule.on,
        "tools": list(rule.tools) if rule.tools is not None else None,
        "when": when,
        "then": rule.then,
        "message": rule.message,
        "limit": rule.limit,
        "schema": rule.schema,
    }


def _rule_from_json(
    item: Mapping[str, Any], by_digest: Mapping[str, Callable[[Any], Any]]
) -> tuple[Rule, str | None]:
    """A rule from its recorded form, and the callable it lacks (``None`` if none)."""
    when_data = item["when"]
    when: str | Callable[[Any], Any] | None = None
    wanted = None
    if isinstance(when_data, Mapping) and "cel" in when_data:
        when = when_data["cel"]
    elif isinstance(when_data, Mapping) and "python" in when_data:
        found = by_digest.get(when_data["digest"])
        if found is None:
            wanted = f"{when_data['python']} ({when_data['digest']})"
        when = found
    elif when_data is not None:
        raise ValueError(f"a when of {when_data!r:.60}")
    rule = Rule(
        id=item["id"],
        on=item["on"],
        tools=item["tools"],
        when=when,
        then=item["then"],
        message=item["message"],
        limit=item["limit"],
        schema=item["schema"],
    )
    return rule, wanted
