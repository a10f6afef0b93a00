"""The application's rules (issue 19) judged by the loop, and drawn as rows of its machine.

A runtime built with ``rules=[...]`` runs :func:`rules_machine`: the default table plus one
or more rows per rule, each guarded by ``rule:<id>`` ("rule ``id`` decided here"), so the
machine hash covers the rules, the diagram draws them and the coverage report counts them.
The loop judges at four points, each a small function below called from one place of
``core/loop.py``, and only when the run has rules (a run without rules runs none of this):

* :func:`before_tool`: the whole batch, after admission and before any call runs
  (``RuleSet.judge_batch``). ``deny`` and ``limit`` refuse the call (``denied_by_rule``,
  ``limit_reached``: answered at dispatch as any refusal; the strict policy's rows stop the
  run); ``review`` pauses the run at ``validate`` with that call's placeholder waiting for a
  reviewer (``rule_review``), whose approval is bound to the call id and its arguments'
  digest and lets the call through when the batch is judged again on resume.
* :func:`after_tool`: a call's successful result, before the history gets it; ``deny``
  answers the call ``denied_by_rule`` instead of the result (the strict policy's row stops
  the run ``protocol_error/denied_by_rule``, the call answered the same way).
* :func:`before_model`: before the model is asked again after a tool round, and before
  its first call (the ``begin`` edge, fired only where ``before_model`` rules exist).
* :func:`answer`: the final answer; ``retry`` sends the rule's detail back to the model
  within the model-call budget, ``stop`` ends ``protocol_error/answer_rejected``.

Every judgement that tried a rule is one ``rule`` event, recorded before the transition
that acts on it, so ``check`` (which replays the loop) re-judges it and compares.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fsm_agent._core.actions import record, recorded_value
from fsm_agent._core.canonical import digest
from fsm_agent._core.table import DEFAULT_MACHINE, Machine, Transition
from fsm_agent._rules import Facts, Judgement, RuleSet

if TYPE_CHECKING:
    from fsm_agent._core.state import RunState

__all__ = [
    "RULE_ACTIONS",
    "RULE_GUARD",
    "RULE_REASONS",
    "after_tool",
    "answer",
    "before_model",
    "before_tool",
    "record_execution",
    "rule_rows",
    "rules_machine",
]

#: The prefix of a rule's guard: ``rule:<id>`` holds when rule ``id`` decided the
#: judgement the edge acts on.
RULE_GUARD = "rule:"

#: The reasons and actions only the rules' rows use (the default table has none of them).
RULE_REASONS = frozenset({"denied_by_rule", "rule_limit", "rule_review", "answer_rejected"})
RULE_ACTIONS = frozenset({"retry_answer", "answer_rule"})

#: before_tool verdicts that refuse the call, and the error it is answered with.
_REFUSALS = {"deny": "denied_by_rule", "limit": "limit_reached"}


# ── the rows ──────────────────────────────────────────────────────────────────────


def rule_rows(rules: RuleSet) -> dict[tuple[str, str], list[Transition]]:
    """``(source, trigger)`` -> the rows the rules add to that group, in rule order."""
    T = Transition
    rows: dict[tuple[str, str], list[Transition]] = {}
    for rule in rules.rules:
        guard = f"{RULE_GUARD}{rule.id}"
        cite = f"{rule.id}: {rule.condition_text()}"
        if rule.on == "before_tool" and rule.then == "review":
            new = [T("validate", "validating", "review_required", (guard,), "rule_review",
                     "stop", cite)]  # fmt: skip
        elif rule.on == "before_tool" and rule.then == "deny":
            new = [T("validate", "validating", "protocol_error", ("strict_policy", guard),
                     "denied_by_rule", "stop", cite)]  # fmt: skip
        elif rule.on == "before_tool" and rule.then == "limit":
            new = [T("validate", "validating", "budget_exhausted", ("strict_policy", guard),
                     "rule_limit", "stop", cite)]  # fmt: skip
        elif rule.on == "after_tool" and rule.then == "deny":
            new = [T("tool_returned", "executing", "protocol_error",
                     ("strict_policy", "call_succeeded", guard), "denied_by_rule", "stop",
                     f"{cite} (strict: the run stops; the call ran, its result withheld)"),
                   T("tool_returned", "executing", "observing", ("call_succeeded", guard),
                     None, "answer_rule", cite)]  # fmt: skip
        elif rule.on == "before_model" and rule.then in ("deny", "limit"):
            dest, reason = (
                ("protocol_error", "denied_by_rule") if rule.then == "deny"
                else ("budget_exhausted", "rule_limit")
            )  # fmt: skip
            new = [T("observe", "observing", dest, (guard,), reason, "stop", cite),  # type: ignore[arg-type]
                   T("begin", "deciding", dest, (guard,), reason, "stop",  # type: ignore[arg-type]
                     f"{cite} (before the first model call)")]  # fmt: skip
        elif rule.on == "answer" and rule.then == "retry":
            new = [
                T("validate", "validating", "deciding", (guard, "!model_calls_spent"), None,
                  "retry_answer", cite),
                T("validate", "validating", "protocol_error", (guard,), "answer_rejected",
                  "stop", f"{cite} (no model call left to retry)"),
            ]  # fmt: skip
        elif rule.on == "answer" and rule.then == "stop":
            new = [T("validate", "validating", "protocol_error", (guard,), "answer_rejected",
                     "stop", cite)]  # fmt: skip
        else:  # allow: decides, and takes no edge of its own
            continue
        for row in new:
            rows.setdefault((row.source, row.trigger), []).append(row)
    return rows


#: Where a group's rule rows go: before the first edge of the group whose guards start
#: with one of these (a result is judged before it is bound as the call's answer), else
#: before the group's fallback. ``validate`` is placed by hand: answer rows before the
#: answer may end the run as done, call rows before approvals are asked for.
_BEFORE: dict[tuple[str, str], tuple[str, ...]] = {
    ("executing", "tool_returned"): ("call_succeeded",),
}


def rules_machine(
    rules: RuleSet, base: Machine = DEFAULT_MACHINE, *, rules_hash: str | None = None
) -> Machine:
    """``base`` plus the rows of ``rules`` (checked as any application's machine), whose
    hash covers the rules' hash (``rules_hash``: the one a trace header's rules have,
    when ``rules`` were rebuilt from it with stand-ins for opaque conditions)."""
    from fsm_agent._core.engine import check_machine  # the engine imports this module

    added = rule_rows(rules)
    table = [replace(t, index=-1) for t in base.transitions]
    for group, rows in added.items():
        before = _BEFORE.get(group, ())
        members = [i for i, t in enumerate(table) if (t.source, t.trigger) == group]
        at = members[-1]  # the fallback
        if group == ("validating", "validate"):
            answer_rows = [r for r in rows if r.reason == "answer_rejected"
                           or r.action == "retry_answer"]  # fmt: skip
            tool_rows = [r for r in rows if r not in answer_rows]
            # (A base machine without these edges gets the rows before its fallback.)
            first_answer = next(
                (i for i in members if table[i].guards[:1] == ("!has_tool_calls",)), at
            )
            approval = next(
                (i for i in members if table[i].guards[:1] == ("batch_needs_approval",)), at
            )
            table[approval:approval] = tool_rows
            table[first_answer:first_answer] = answer_rows
            continue
        for i in members:
            if table[i].guards[:1] and table[i].guards[0] in before:
                at = i
                break
        table[at:at] = rows
    covers = (*base.covers, ("rules", rules_hash or rules.hash))
    machine = Machine.of(table, name=f"{base.name} with rules", initial=base.initial,
                         states=base.states, terminal=base.terminal, covers=covers)  # fmt: skip
    check_machine(machine)
    return machine


# ── the facts ─────────────────────────────────────────────────────────────────────


#: What the loop hands the rules unscreened: the tool's name and effect (the registry's,
#: or a name the decision cleaned), the engine's own counters, and the context (screened
#: once, when the run was asked for: ``runtime/config.py``).
_TRUSTED = frozenset({"tool", "effect", "counters", "context"})
#: What the loop hands over as plain JSON (strictly parsed arguments, a result made
#: JSON-safe): screened by its canonical text only (``Facts.plain``).
_PLAIN = frozenset({"args", "result"})


def _facts(s: RunState, **more: Any) -> Facts:
    counters = s.counters.as_dict()
    return Facts.of(counters=counters, calls=s.executed, context=s.context, trusted=_TRUSTED,
                 appended=True, plain=_PLAIN, **more)  # fmt: skip


def _words(judgement: Judgement) -> str:
    """``rule 'id': what it says`` (its message, or its condition)."""
    prefix = f"rule {judgement.rule_id!r}: "
    detail = judgement.detail or ""
    return detail if detail.startswith(prefix) else prefix + detail


def _record(s: RunState, judgement: Judgement, extra: dict[str, Any] | None = None) -> None:
    """The judgement as a ``rule`` event, with ``extra``'s fields."""
    if not judgement.tried:  # no rule of this phase matched: nothing was evaluated
        return
    s.seq += 1
    s.events.append(judgement.event(s.seq, extra))


# ── the four points ───────────────────────────────────────────────────────────────


def before_tool(s: RunState, rules: RuleSet) -> None:
    """Judge every admitted call of the batch before any runs (the loop's ``_admit``)."""
    decided: set[str] = set()
    s.rule_detail = ""
    # On resume: what is answered stays answered, and the call that was dispatched keeps
    # the judgement it was dispatched with (its write may have started: R6, R11); a call
    # a reviewer denied is not judged again.
    answered, placeholders, reviews, current = s.answered, s.placeholders, s.reviews, s.call
    judged = rules.judged["before_tool"]  # (a registered tool's answer, looked up)
    calls = [
        c
        for c in s.decision.calls
        if c.refusal is None
        and c.arguments is not None
        and (c.id not in answered or c.id in placeholders)
        and c is not current
        and (c.id not in reviews or (reviews[c.id] or {}).get("action") != "deny")
        and (judged.get(c.name) or (c.name not in judged and rules.judges("before_tool", c.name)))
    ]
    if not calls:
        s.ruled = frozenset()
        return
    counters = s.counters.as_dict()  # once for the batch, shared by its facts
    batch = [
        Facts.of(tool=c.name, effect=c.effect, args=c.arguments, counters=counters,
              calls=s.executed, context=s.context, call_id=c.id, trusted=_TRUSTED,
              appended=True, plain=_PLAIN)
        for c in calls
    ]  # fmt: skip
    for call, judgement in zip(calls, rules.judge_batch(batch), strict=True):
        verdict, rule_id = judgement.verdict, judgement.rule_id
        call.review_rule = None
        if verdict in _REFUSALS and rule_id is not None:
            call.refusal, call.refusal_rule = _REFUSALS[verdict], rule_id
            call.refusal_detail = _words(judgement)
            decided.add(rule_id)
            _record(s, judgement)
        elif verdict == "review" and rule_id is not None:
            args_digest = call.args_digest or digest(call.name, call.arguments or {})
            if _approved(s, call.id, args_digest):
                _record(s, judgement, {"args_digest": args_digest, "reviewed": "approve"})
                continue
            call.review_rule = rule_id
            decided.add(rule_id)
            s.rule_detail += (
                f"{'; ' if s.rule_detail else ''}{call.id} ({call.name}) needs review: "
                f"{_words(judgement)}"
            )
            _record(s, judgement, {"args_digest": args_digest})
        else:
            _record(s, judgement)
    s.ruled = frozenset(decided)


def _approved(s: RunState, call_id: str, args_digest: str) -> bool:
    """A reviewer approved this very call with these very arguments (kept with the run
    once applied, as the loop's approval lookup keeps it)."""
    if s.approvals.get(call_id) == f"review:{call_id}":
        return True
    review = s.reviews.get(call_id) or {}
    if review.get("action") == "approve" and review.get("digest") == args_digest:
        s.approvals[call_id] = f"review:{call_id}"
        return True
    return False


def after_tool(s: RunState, rules: RuleSet) -> None:
    """Judge the current call's successful result before the history gets it."""
    call, outcome = s.call, s.outcome
    s.ruled, s.ahead = frozenset(), None
    if "after_tool" not in rules.phases or outcome.kind != "ok":
        return
    if not rules.judges("after_tool", call.name):
        return
    # As the observation records it (what check replays), media split off; the answer
    # takes this record rather than make it again. One kept by its size only is not
    # judged: the model never gets it, and the run stops on it (R9, output_budget_spent).
    s.ahead = record(s, {"ok": True, "value": outcome.value})
    if s.ahead[4]:  # (oversized)
        return
    result = recorded_value(s.ahead)
    facts = _facts(
        s, tool=call.name, effect=call.effect, args=call.arguments, result=result,
        call_id=call.id,
    )  # fmt: skip
    judgement = rules.judge("after_tool", facts)
    if judgement.verdict != "deny" or judgement.rule_id is None:
        _record(s, judgement)
        return
    # The withheld result is recorded here (the observation holds the denial), so check
    # replays the judgement on what the tool returned; a redaction hook may hide it.
    _record(s, judgement, {"result": result})
    s.ruled = frozenset({judgement.rule_id})
    s.rule_detail = _words(judgement)


def before_model(s: RunState, rules: RuleSet) -> None:
    """Judge the next model call when the batch is done (the loop's ``observe`` step)."""
    s.ruled = frozenset()
    if "before_model" not in rules.phases:
        return
    if any(c.id not in s.answered for c in s.decision.calls):
        return  # the batch has calls left: no model call follows this observe
    judgement = rules.judge("before_model", _facts(s))
    _record(s, judgement)
    if judgement.verdict in ("deny", "limit") and judgement.rule_id is not None:
        s.ruled = frozenset({judgement.rule_id})
        s.rule_detail = _words(judgement)


def answer(s: RunState, rules: RuleSet) -> None:
    """Judge a final answer (a decision without calls) before it may end the run."""
    s.ruled = frozenset()
    d = s.decision
    if d.calls or d.malformed is not None or not (d.answer and d.answer.strip()):
        return
    if "answer" not in rules.phases:
        return
    judgement = rules.judge("answer", _facts(s, answer=d.answer))
    _record(s, judgement)
    if judgement.verdict in ("retry", "stop") and judgement.rule_id is not None:
        s.ruled = frozenset({judgement.rule_id})
        s.rule_detail = _words(judgement)


def record_execution(s: RunState, *, returned: bool = True) -> None:
    """Add the current call to ``calls`` (what rules read as the run's executed calls):
    once per call that ran, after its last attempt; never changed afterwards. One whose
    tool never returned here (``returned=False``: cancelled in flight, or running when
    the process died) counts as run and not ok, unless its stored result is its answer."""
    rules = s.config.rules
    if rules is not None and not rules.reads_calls:
        return  # no rule reads them: nothing to keep (the same in check's replay)
    call, taken = s.call, s.taken.action
    ok = s.outcome.kind == "ok" if returned else taken == "answer_stored"  # (stored: answered)
    text, result = "null", None
    if ok:
        # What the trace records of the result: the answer's observation, or, withheld
        # by an after_tool rule, what that rule judged (its rule event records it).
        made = s.ahead if taken == "answer_rule" else s.recorded
        text = made[0]
        result = recorded_value(made)
    arguments = call.arguments
    entry = {"tool": call.name, "args": arguments if arguments is not None else {}, "ok": ok,
             "result": result}  # fmt: skip
    s.executed.append(entry)
    if rules is not None and arguments is not None:
        # The texts the entry's parts were parsed from: its log screens it by them.
        rules.executed(s.executed, f"{text}\n{call.raw_arguments}")
