"""Which edges of a machine an application can take at all, from its declared facts.

An application that registers no tool with an idempotency key can never take the edges
guarded by ``idempotency_conflict``; one whose tools need no approval never pauses for
one. Counting such edges as "missing" makes a coverage threshold meaningless, so the
coverage of an application's machine leaves them out and lists them, with the reason,
as unreachable.

The rules (one per guard that needs a fact; see :data:`RULES`):

===========================================  ============================================
guard that must hold                         unreachable when
===========================================  ============================================
``idempotency_conflict``,                    no write tool declares an idempotency key
``idempotency_pending``,
``idempotent_replay``,
``write_result_stored``
``batch_needs_approval``                     no tool requires approval
``approval_refused``                         no tool requires approval, or no approval
                                             of the runtime sets ``max_uses``
``is_write``, ``write_in_flight``,           no tool is a write
``write_outcome_lost``
``is_retryable``                             no read tool and no write that declares dedup
``strict_policy``                            the runtime's policy is not ``strict``
``tokens_spent``                             the budget sets no ``max_tokens``
``usage_unknown``                            the budget sets neither ``max_tokens`` nor
                                             ``max_cost``
``cost_spent``                               the budget sets no ``max_cost``
``wall_clock_spent``                         the budget sets no ``max_wall_clock_s``
``output_budget_spent``                      the budget sets no ``max_output_bytes``
``model_calls_spent``                        ``max_model_calls`` > ``max_tool_rounds``
                                             (the model is asked once per tool round and
                                             once more: it never reaches the limit)
===========================================  ============================================

Some edges have no guard that must hold, yet are ruled out by what their siblings take
(:data:`EDGE_RULES`, by edge key): ``resume/executing->executing`` (a write in flight
when the process died is dispatched again) needs a write that declares downstream
dedup, because an unkeyed write in flight is always lost, a keyed one is lost or
stored, and a read's attempt is never checkpointed; ``begin/deciding->deciding`` needs a
rule that judges ``before_model`` (the loop fires ``begin`` only then).

Then the graph: an edge whose source state no reachable edge enters (from the initial
state) is unreachable too (``review`` edges when nothing can pause, say). Only a guard
that must *hold* makes an edge unreachable (``!is_write`` is simply always satisfied), and
a guard the rules do not know (an application's own rule) is taken to be reachable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsm_agent._core.table import Machine
from fsm_agent.tools._registry import Tool

__all__ = ["EDGE_RULES", "RULES", "Facts", "facts_of", "rules_only_edges", "unreachable_edges"]


@dataclass(frozen=True)
class Facts:
    """What an application declares that decides which edges it can take."""

    tools: tuple[Tool, ...]
    policy: str
    max_tokens: int | None
    max_cost: float | None
    max_wall_clock_s: float | None
    max_output_bytes: int | None
    #: Whether an approval of the runtime sets ``max_uses`` (only those run out).
    limited_approvals: bool = False
    max_model_calls: int | None = None
    max_tool_rounds: int | None = None
    #: Whether the runtime's rules judge ``before_model`` (only then is ``begin`` fired).
    judges_model_calls: bool = False

    @property
    def writes(self) -> list[Tool]:
        return [t for t in self.tools if t.effect == "write"]


def facts_of(runtime: Any) -> Facts:
    """The facts of a ``Runtime``: its tools, policy and budget."""
    budget = runtime.budget
    return Facts(
        tools=tuple(runtime.tools),
        policy=str(runtime.policy),
        max_tokens=budget.max_tokens,
        max_cost=budget.max_cost,
        max_wall_clock_s=budget.max_wall_clock_s,
        max_output_bytes=budget.max_output_bytes,
        limited_approvals=any(a.max_uses is not None for a in runtime.approvals),
        max_model_calls=budget.max_model_calls,
        max_tool_rounds=budget.max_tool_rounds,
        judges_model_calls=_judges_model_calls(getattr(runtime, "rules", None)),
    )


def _judges_model_calls(rules: Any) -> bool:
    return rules is not None and bool(rules.judges("before_model"))


def _no_key(f: Facts) -> str | None:
    keyed = any(t.idempotency_key is not None for t in f.writes)
    return None if keyed else "no write tool declares an idempotency key"


def _no_approval(f: Facts) -> str | None:
    return None if any(t.requires_approval for t in f.tools) else "no tool requires approval"


def _no_write(f: Facts) -> str | None:
    return None if f.writes else "no tool is a write"


def _nothing_retryable(f: Facts) -> str | None:
    retryable = any(t.effect == "read" or t.dedup for t in f.tools)
    return None if retryable else "no read tool and no write that declares dedup"


def _model_calls_unspendable(f: Facts) -> str | None:
    # At an observe after tool round k the model was asked k times, and round k began
    # only if k - 1 < max_tool_rounds: the guard needs max_model_calls <= max_tool_rounds.
    calls, rounds = f.max_model_calls, f.max_tool_rounds
    if calls is None or rounds is None or calls <= rounds:
        return None
    return (
        f"the model is asked at most max_tool_rounds + 1 = {rounds + 1} times, "
        f"so max_model_calls = {calls} is never reached"
    )


def _no_dedup(f: Facts) -> str | None:
    if any(t.dedup for t in f.writes):
        return None
    return (
        "no write declares downstream dedup: a write in flight at a crash is lost or "
        "stored, and a read's attempt is never checkpointed"
    )


def _unset(name: str) -> Callable[[Facts], str | None]:
    def rule(f: Facts) -> str | None:
        return None if getattr(f, name) is not None else f"the budget sets no {name}"

    return rule


#: guard name -> the reason it can never hold for these facts (``None``: it can).
RULES: dict[str, Callable[[Facts], str | None]] = {
    "idempotency_conflict": _no_key,
    "idempotency_pending": _no_key,
    "idempotent_replay": _no_key,
    "write_result_stored": _no_key,
    "batch_needs_approval": _no_approval,
    "approval_refused": lambda f: (
        _no_approval(f)
        or (None if f.limited_approvals else "no approval of the runtime sets max_uses")
    ),
    "is_write": _no_write,
    "write_in_flight": _no_write,
    "write_outcome_lost": _no_write,
    "is_retryable": _nothing_retryable,
    "strict_policy": lambda f: None if f.policy == "strict" else "the policy is not strict",
    "tokens_spent": _unset("max_tokens"),
    "usage_unknown": lambda f: (
        None
        if f.max_tokens is not None or f.max_cost is not None
        else "the budget sets neither max_tokens nor max_cost"
    ),
    "cost_spent": _unset("max_cost"),
    "wall_clock_spent": _unset("max_wall_clock_s"),
    "output_budget_spent": _unset("max_output_bytes"),
    "model_calls_spent": _model_calls_unspendable,
}

#: edge key -> the reason it can never be taken for these facts (``None``: it can).
EDGE_RULES: dict[str, Callable[[Facts], str | None]] = {
    "resume/executing->executing": _no_dedup,
    "begin/deciding->deciding": lambda f: (
        None
        if f.judges_model_calls
        else (
            "no rule judges before_model: begin is taken only where one judges the first model call"
        )
    ),
}


def rules_only_edges(machine: Machine) -> dict[int, str]:
    """Edge index -> why a run of ``machine`` itself never takes it: ``begin`` is fired
    only where rules judge ``before_model``, and a runtime with rules runs another
    machine (its rules are part of the hash), whose coverage ``--fsm-app`` measures."""
    return {
        t.index: (
            "taken only by a machine whose rules judge before_model, which is another "
            f"machine than this one (--fsm-app MODULE:FACTORY counts it) (edge {t.key})"
        )
        for t in machine.transitions
        if t.key == "begin/deciding->deciding"
    }


def unreachable_edges(machine: Machine, facts: Facts) -> dict[int, str]:
    """Edge index -> why ``facts`` make that edge of ``machine`` impossible to take."""
    why: dict[int, str] = {}
    for t in machine.transitions:
        edge_rule = EDGE_RULES.get(t.key)
        reason = edge_rule(facts) if edge_rule is not None else None
        if reason is not None:
            why[t.index] = f"{reason} (edge {t.key})"
            continue
        for guard in t.conditions:
            rule = RULES.get(guard)
            reason = rule(facts) if rule is not None else None
            if reason is not None:
                why[t.index] = f"{reason} (guard {guard})"
                break
    # States entered by a possible edge, from the initial one; the rest strand their edges.
    reached = {machine.initial}
    grown = True
    while grown:
        grown = False
        for t in machine.transitions:
            if t.index not in why and t.source in reached and t.dest not in reached:
                reached.add(t.dest)
                grown = True
    for t in machine.transitions:
        if t.index not in why and t.source not in reached:
            why[t.index] = f"no possible edge enters {t.source}"
    return why
