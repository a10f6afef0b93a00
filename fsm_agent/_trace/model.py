"""What the checker knows about a run while it walks the trace: the trusted caller's
settings (from the header), the running counters, the batch and its calls.

Everything a guard reads that the trace records is rebuilt here from the events alone,
the way the loop built it (``core/loop.py``, ``core/actions.py``), so the checker can
recompute the guard instead of trusting the recorded outcome:

==========================  ===========================================================
guard                       recomputed from
==========================  ===========================================================
``usage_unknown``,          ``budget`` and the usage of every decision so far
``tokens_spent``,
``cost_spent``
``decision_malformed`` ...  the decision event (its message, its ``malformed`` verdict)
``call_id_duplicate``
``tool_rounds_spent``,      ``budget`` and the rounds and calls accepted so far
``round_too_large``,
``total_calls_spent``
``strict_policy``           ``policy``
``batch_has_unknown_tool``, ``tools`` and ``allowed_tools``; arguments that are not one
``batch_has_denied_call``,  strict JSON object are invalid whatever the schema (the
``call_admitted``           schema is not in the trace: otherwise as recorded)
``batch_needs_approval``    ``tools`` (``requires_approval``), ``approvals`` (digests, uses)
                            and the digest of each call's canonical arguments
``wall_clock_spent``,       ``budget``, ``retry`` and the event's ``t``
``retry_fits_deadline``
``call_*``, ``is_retryable``  the event's ``outcome``, the tool's ``effect`` and ``dedup``
``attempts_left``           ``retry.max_attempts`` and the call's attempts so far
``is_write``,               the tool's ``effect`` (``write_in_flight``: also whether its
``write_in_flight``         attempt started and has not returned)
``output_budget_spent``     ``budget`` and the size of every result fed back so far
``batch_has_more_calls``    the batch and the calls answered so far
``model_calls_spent``       ``budget`` and the decisions so far
==========================  ===========================================================

The idempotency guards (``idempotency_*``, ``write_outcome_lost``,
``write_result_stored``) read the store, which the trace does not hold: for a tool
without an idempotency key they are recomputed (false), otherwise taken as recorded and
cross-checked against the store by ``fsm-agent check --db``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fsm_agent._core.budget import Budget, RetryPolicy, metered
from fsm_agent._core.canonical import ArgumentsError, canonical_json, digest, parse_arguments
from fsm_agent._core.decision import Decision, parse_decision

__all__ = ["UNSURE", "CallFacts", "Settings", "Usage", "count_usage"]

#: A value the trace cannot settle (the recorded outcome then stands).
UNSURE: Any = None


class Settings:
    """The trusted caller's settings, read from the ``run_start`` header."""

    def __init__(self, head: Mapping[str, Any]) -> None:
        problems: list[str] = []
        self.budget = _read(Budget, head.get("budget"), "budget", problems) or Budget()
        self.retry = _read(RetryPolicy, head.get("retry"), "retry", problems) or RetryPolicy()
        policy = head.get("policy")
        if policy not in ("default", "strict"):
            problems.append(f"policy {policy!r} is neither 'default' nor 'strict'")
        self.strict = policy == "strict"
        allowed = head.get("allowed_tools")
        if not isinstance(allowed, list) or not all(isinstance(n, str) for n in allowed):
            problems.append("allowed_tools is not a list of tool names")
            allowed = []
        self.allowed = frozenset(allowed)
        tools = head.get("tools")
        if not isinstance(tools, Mapping):
            problems.append("tools (the registrar's facts) is missing")
            tools = {}
        self.tools: dict[str, Mapping[str, Any]] = {
            str(k): v for k, v in tools.items() if isinstance(v, Mapping)
        }
        #: approval digest -> total uses (None: unlimited), and the id a use records.
        self.approvals: dict[str, int | None] = {}
        approvals = head.get("approvals")
        if not isinstance(approvals, list):
            problems.append("approvals (the configured approvals' digests) is missing")
            approvals = []
        for a in approvals:
            if not isinstance(a, Mapping) or not isinstance(a.get("digest"), str):
                problems.append(f"an approval without a digest: {a!r}")
                continue
            uses = a.get("max_uses")
            before = self.approvals.get(a["digest"], 0)
            if uses is None or before is None:
                self.approvals[a["digest"]] = None
            elif isinstance(uses, int):
                self.approvals[a["digest"]] = before + uses
        self.problems = problems


def _read(cls: Any, value: Any, what: str, problems: list[str]) -> Any:
    if not isinstance(value, Mapping):
        problems.append(f"{what} is missing from the header")
        return None
    try:
        return cls(**value)
    except (TypeError, ValueError) as exc:
        problems.append(f"{what} in the header is not usable: {exc}")
        return None


class CallFacts:
    """One call of the batch, with what the header says about it."""

    __slots__ = (
        "approval",
        "args_key",
        "dedup",
        "digest",
        "effect",
        "id",
        "idempotent",
        "name",
        "needs_approval",
        "raw",
        "refusal",
        "requires_approval",
    )

    def __init__(self, call_id: str, name: str, raw: str) -> None:
        self.id, self.name, self.raw = call_id, name, raw
        self.effect: str | None = None
        self.dedup = self.idempotent = self.requires_approval = False
        #: unknown_tool | permission_denied | invalid_arguments | None (admitted) |
        #: UNSURE (the arguments parse; only the schema, not in the trace, can refuse)
        self.refusal: str | None = UNSURE
        self.digest: str | None = None
        self.args_key: str = raw
        #: True | False | UNSURE (a limited approval another run may have used up)
        self.needs_approval: Any = False
        #: The approval this call holds (``config:...`` / ``review:...``), once known.
        self.approval: str | None = None

    def admit(self, settings: Settings) -> None:
        """What admission decides from the header (``core/decision.py``)."""
        facts = settings.tools.get(self.name)
        if facts is None:
            self.refusal = "unknown_tool"
            return
        self.effect = facts.get("effect") if isinstance(facts.get("effect"), str) else None
        self.dedup = facts.get("dedup") is True
        self.idempotent = facts.get("idempotent") is True
        self.requires_approval = facts.get("requires_approval") is True
        if self.name not in settings.allowed:
            self.refusal = "permission_denied"
            return
        try:
            arguments = parse_arguments(self.raw)
        except (ArgumentsError, RecursionError):
            self.refusal = "invalid_arguments"
            return
        self.refusal = UNSURE
        if self.idempotent:
            self.args_key = canonical_json(arguments)
        if self.requires_approval:
            self.digest = digest(self.name, arguments)

    @property
    def admitted(self) -> Any:
        """True / False / UNSURE: whether admission let the call run."""
        if self.refusal is UNSURE:
            return UNSURE
        return self.refusal is None


class Usage:
    """Tokens and cost counted from the decisions (``core/loop.py``'s ``_count_usage``)."""

    __slots__ = (
        "cost",
        "cost_unknown",
        "input_tokens",
        "output_tokens",
        "tokens",
        "tokens_unknown",
    )

    def __init__(self) -> None:
        self.input_tokens = self.output_tokens = self.tokens = 0
        self.cost = 0.0
        self.tokens_unknown = self.cost_unknown = False


def count_usage(u: Usage, usage: Any) -> None:
    """Add a reply's usage exactly as the loop does (one reading: ``metered``)."""
    m = metered(usage)
    if m.tokens is None:
        u.tokens_unknown = True
    else:
        u.input_tokens += m.input_tokens
        u.output_tokens += m.output_tokens
        u.tokens += m.tokens
    if m.cost is None:
        u.cost_unknown = True
    else:
        u.cost += m.cost


def read_decision(message: Any) -> tuple[Decision, list[CallFacts]]:
    """The decision a recorded message holds and its calls."""
    d = parse_decision(message)
    return d, [CallFacts(c.id, c.name, c.raw_arguments) for c in d.calls]


def result_size(result: Any) -> int:
    """Bytes of a result as the history holds it (``core/actions.py``: the JSON text of
    the result object, default separators): what ``max_output_bytes`` counts."""
    try:
        return len(json.dumps(result, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        return 0
