"""The run machine: a transition table, declared as data, and held as a value.

:data:`DEFAULT_MACHINE` (the table below) is the single source of truth of the built-in
rules; an application may run another :class:`Machine` (built and checked by
``engine.compile_machine``, usually this table plus rows of its own). The loop fires a
run's machine (through ``transitions``, see ``engine.py``), the diagram draws it, the
coverage report counts its edges and the trace checker verifies traces against the default
one. Nothing else in the package declares an edge.

Reading the table
-----------------
Each :class:`Transition` is one edge: ``trigger`` fired in ``source`` moves the run to
``dest`` when every guard holds. A guard written ``"!name"`` must be false. Edges that
share a trigger and a source are tried in the order they are listed here, and within an
edge its guards are evaluated in the order listed, each only until one fails (so a trace
records exactly the guards that decided). That order is the priority: the first edge
whose guards all hold wins, so every such group ends with an unguarded fallback (checked
at import). ``reason`` is the stop reason recorded when the edge enters a terminal state;
``action`` names the function of ``core/actions.py`` run after the edge is taken; ``rule``
cites the rules of ``docs/concepts/rules.md`` the edge encodes (R1–R12, and D1–D3 for
durable runs).

Triggers are fired by the loop when it has news:

``begin``                             the first model call is about to be asked (fired
                                      only in a run whose rules judge ``before_model``)
``model_replied`` / ``model_failed``  the model answered / raised
``validate``                          the decision and its whole batch are checked
``dispatch``                          one call of the batch is about to run
``tool_returned``                     that call's tool returned, raised or never started
``retry``                             the backoff before a retry has elapsed
``observe``                           the call's result has been paired with its id
``cancel``                            the caller stopped the run (asyncio cancel, Ctrl-C,
                                      any other exit)
``resume``                            a stored run is picked up again: its process died,
                                      or reviewers settled it
``review``                            a reviewer decides on a paused call (approve, deny,
                                      reconcile); the run stays paused

Identity: an edge's ``index`` is its position in its machine; its ``key``
(``trigger/source->dest[guards]``) names it independently of position. A machine's
:attr:`Machine.hash` covers every column the runtime uses (states, and per edge trigger,
source, dest, guards, reason, action); every trace and every stored checkpoint records
it, and :data:`MACHINE_HASH` is the default machine's (the same definition, so the same
hash, as before machines were values).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

__all__ = [
    "CALL_STEP",
    "DEFAULT_MACHINE",
    "ENDS",
    "INITIAL_STATE",
    "LEGACY_MACHINE_HASHES",
    "MACHINE_HASH",
    "STARTS_BATCH",
    "STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "WORKING_STATES",
    "Action",
    "Machine",
    "Reason",
    "State",
    "Transition",
    "Trigger",
    "check_table",
    "definition",
    "edge_by_key",
    "edges_from",
    "transitions_from",
]

State = Literal[
    "deciding", "validating", "executing", "retry_wait", "observing",
    "done", "budget_exhausted", "protocol_error", "review_required", "cancelled",
]  # fmt: skip
Trigger = Literal[
    "begin", "model_replied", "model_failed", "validate", "dispatch", "tool_returned",
    "retry", "observe", "cancel", "resume", "review",
]  # fmt: skip
Reason = Literal[
    "final_answer", "model_error", "malformed_decision", "empty_answer",
    "missing_tool_call_id", "duplicate_tool_call_id", "unknown_tool", "permission_denied",
    "invalid_arguments", "tool_rounds", "calls_per_round", "total_calls", "model_calls",
    "tokens", "cost", "wall_clock", "tool_output", "outcome_unknown", "approval_required",
    "idempotency_conflict", "cancelled", "reply_size", "usage_unknown", "denied_by_rule",
    "rule_limit", "rule_review", "answer_rejected",
]  # fmt: skip
Action = Literal[
    "stop", "finish", "start_batch", "next_call", "end_batch", "start_attempt",
    "schedule_retry", "answer_refusal", "answer_replay", "answer_result", "answer_failure",
    "answer_stored", "apply_review", "record_review", "retry_answer", "answer_rule",
]  # fmt: skip


#: :attr:`Transition.save_point` values: the edge ends the run (a terminal destination)
#: or resumes it; it starts a call's attempt or takes its result; it starts a batch.
ENDS, CALL_STEP, STARTS_BATCH = 1, 2, 3


@dataclass(frozen=True)
class Transition:
    """One edge of the run machine (see the module docstring)."""

    trigger: Trigger
    source: State
    dest: State
    guards: tuple[str, ...] = ()
    reason: Reason | None = None
    action: Action | None = None
    rule: str = ""
    #: Position in its machine's table (-1 for an edge built outside a machine).
    index: int = field(default=-1, compare=False)
    #: ``(rank, size)``: tried ``rank``-th (1-based) of the ``size`` edges of its trigger
    #: in its source (``(0, 0)`` outside a machine).
    rank: tuple[int, int] = field(default=(0, 0), compare=False, repr=False)
    #: ``(guard name, required outcome)`` in evaluation order.
    checks: tuple[tuple[str, bool], ...] = field(init=False, repr=False, compare=False)
    #: Which of the loop's checkpoint points the edge is (``core/loop.py``'s
    #: ``_wants_save``), read off its columns once, not on every firing: :data:`ENDS`,
    #: :data:`CALL_STEP`, :data:`STARTS_BATCH` or 0 (none).
    save_point: int = field(init=False, repr=False, compare=False)
    #: The edge enters a terminal state from a working one (``run_end`` follows it; a
    #: review of a paused run does not end it), read off its columns once.
    ends_run: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checks = tuple((g[1:], False) if g.startswith("!") else (g, True) for g in self.guards)
        object.__setattr__(self, "checks", checks)
        if self.dest in TERMINAL_STATES or self.trigger == "resume":
            point = ENDS
        elif self.action == "start_attempt" or self.trigger == "tool_returned":
            point = CALL_STEP
        elif self.action == "start_batch":
            point = STARTS_BATCH
        else:
            point = 0
        object.__setattr__(self, "save_point", point)
        ends = self.dest in TERMINAL_STATES and self.source not in TERMINAL_STATES
        object.__setattr__(self, "ends_run", ends)

    @property
    def key(self) -> str:
        """``trigger/source->dest`` plus ``[guards]``: stable when rows are reordered."""
        base = f"{self.trigger}/{self.source}->{self.dest}"
        return f"{base}[{','.join(self.guards)}]" if self.guards else base

    @property
    def label(self) -> str:
        """``trigger [guard, !guard]``, as drawn on the diagram."""
        return f"{self.trigger} [{', '.join(self.guards)}]" if self.guards else self.trigger

    @property
    def conditions(self) -> list[str]:
        """Guards that must hold."""
        return [g for g, want in self.checks if want]

    @property
    def unless(self) -> list[str]:
        """Guards that must not hold."""
        return [g for g, want in self.checks if not want]


INITIAL_STATE: State = "deciding"
WORKING_STATES: tuple[State, ...] = (
    "deciding", "validating", "executing", "retry_wait", "observing",
)  # fmt: skip
TERMINAL_STATES: tuple[State, ...] = (
    "done", "budget_exhausted", "protocol_error", "review_required", "cancelled",
)  # fmt: skip
STATES: tuple[State, ...] = WORKING_STATES + TERMINAL_STATES

T = Transition

# fmt: off
_ROWS: tuple[Transition, ...] = (
    # ── deciding: the model has been asked ──────────────────────────────────────────
    T("model_replied", "deciding", "budget_exhausted", ("reply_too_large",), "reply_size",
      "stop", "R9/R12: a reply larger than its size budget is neither read nor run"),
    T("model_replied", "deciding", "budget_exhausted", ("usage_unknown",), "usage_unknown",
      "stop", "R9: a reply that reports no usage under a token or cost budget executes "
      "nothing new (unknown usage is never counted as zero)"),
    T("model_replied", "deciding", "budget_exhausted", ("tokens_spent",), "tokens", "stop",
      "R9: a reply that takes tokens past the budget executes nothing new"),
    T("model_replied", "deciding", "budget_exhausted", ("cost_spent",), "cost", "stop",
      "R9: a reply that takes cost past the budget (or cannot be priced) executes nothing new"),
    T("model_replied", "deciding", "validating", (), None, None,
      "R1: every decision is checked before anything in it runs"),
    T("model_failed", "deciding", "protocol_error", (), "model_error", "stop",
      "a model that raises or returns no message ends the run with its error"),

    # ── validating: the whole batch, before any call runs ───────────────────────────
    T("validate", "validating", "protocol_error", ("decision_malformed",), "malformed_decision",
      "stop", "R1: a decision that is not an assistant message of well-formed calls is refused"),
    T("validate", "validating", "done", ("!has_tool_calls", "has_answer"), "final_answer",
      "finish", "done means no new tool call and a non-empty answer"),
    T("validate", "validating", "protocol_error", ("!has_tool_calls",), "empty_answer",
      "stop", "no tool call and no answer is not an ending"),
    T("validate", "validating", "protocol_error", ("call_id_missing",), "missing_tool_call_id",
      "stop", "R1: a call without an id can never be paired; the whole batch is refused"),
    T("validate", "validating", "protocol_error", ("call_id_duplicate",),
      "duplicate_tool_call_id", "stop",
      "R1: results are bound by id, so ids must be unique; the whole batch is refused"),
    T("validate", "validating", "budget_exhausted", ("tool_rounds_spent",), "tool_rounds",
      "stop", "R9: no tool round past the round budget; the model may answer before it"),
    T("validate", "validating", "budget_exhausted", ("round_too_large",), "calls_per_round",
      "stop", "R9: a batch larger than the per-round limit runs nothing"),
    T("validate", "validating", "budget_exhausted", ("total_calls_spent",), "total_calls",
      "stop", "R9: a batch that takes total calls past the budget runs nothing"),
    T("validate", "validating", "protocol_error", ("strict_policy", "batch_has_unknown_tool"),
      "unknown_tool", "stop", "R10: under the strict policy an unknown tool stops the run"),
    T("validate", "validating", "protocol_error", ("strict_policy", "batch_has_denied_call"),
      "permission_denied", "stop",
      "R4/R10: under the strict policy a call outside allowed_tools stops the run"),
    T("validate", "validating", "protocol_error",
      ("strict_policy", "batch_has_invalid_arguments"), "invalid_arguments", "stop",
      "R3/R10: under the strict policy invalid arguments stop the run"),
    T("validate", "validating", "review_required", ("batch_needs_approval",),
      "approval_required", "stop",
      "R8: a write without an approval bound to its exact arguments runs nothing"),
    T("validate", "validating", "executing", (), None, "start_batch",
      "R1: the batch is accepted whole; its calls run one by one"),

    # ── executing: one call, checked again just before it runs ──────────────────────
    T("dispatch", "executing", "observing", ("!call_admitted",), None, "answer_refusal",
      "R3/R4/R10: an unknown tool, a denied call or invalid arguments is answered as a "
      "structured error and never runs"),
    T("dispatch", "executing", "budget_exhausted", ("wall_clock_spent",), "wall_clock", "stop",
      "R9: no tool call once the wall-clock budget is spent"),
    T("dispatch", "executing", "review_required", ("idempotency_conflict",),
      "idempotency_conflict", "stop",
      "R7: the same idempotency key with different arguments is never overwritten"),
    T("dispatch", "executing", "review_required", ("idempotency_pending",), "outcome_unknown",
      "stop", "R6/R7/R11: an earlier write under this key may have taken effect; it is not "
      "run again"),
    T("dispatch", "executing", "observing", ("idempotent_replay",), None, "answer_replay",
      "R7: the same key and arguments return the stored result, executing nothing"),
    T("dispatch", "executing", "review_required", ("approval_refused",), "approval_required",
      "stop", "R8: a write whose limited approval has no use left (max_uses, counted by the "
      "store across runs and workers) runs nothing"),
    T("dispatch", "executing", "executing", (), None, "start_attempt",
      "the call is admitted and its tool runs now"),

    # ── executing: the tool has returned, raised, or never started ──────────────────
    T("tool_returned", "executing", "observing", ("call_not_started",), None, "answer_failure",
      "R11: a call that never started (cancelled while queued) did nothing: not_executed"),
    T("tool_returned", "executing", "observing", ("call_succeeded",), None, "answer_result",
      "R1: the result is bound to its call id"),
    T("tool_returned", "executing", "observing", ("call_rejected",), None, "answer_failure",
      "R6: a definite rejection means nothing happened; the model is told"),
    T("tool_returned", "executing", "retry_wait",
      ("is_retryable", "attempts_left", "retry_fits_deadline"), None, "schedule_retry",
      "R5: only a read (or deduplicated write) is retried, only when transient, within "
      "max_attempts and the deadline"),
    T("tool_returned", "executing", "review_required", ("is_write",), "outcome_unknown", "stop",
      "R6: a write that failed in an unknown way may have happened; stop for review"),
    T("tool_returned", "executing", "observing", (), None, "answer_failure",
      "R5: a read that failed for good is answered as an error"),

    # ── review: a reviewer decides on a paused call ─────────────────────────────────
    T("review", "review_required", "review_required", ("review_fits",), None, "record_review",
      "D2: a decision that fits what the paused call waits for (approve: approval_required, "
      "reconcile: outcome_unknown, deny: any paused call) is recorded, once per call, with "
      "who decided, when and why; the run stays paused until every blocking call is settled"),
    T("review", "review_required", "review_required", (), None, None,
      "D2: a decision that does not fit the paused call is refused and records nothing"),

    # ── resume: a stored run is picked up again ─────────────────────────────────────
    T("resume", "executing", "review_required", ("write_outcome_lost",), "outcome_unknown",
      "stop", "R6/D1: a write that was running when the process died may have happened; "
      "it is never run again"),
    T("resume", "executing", "observing", ("write_result_stored",), None, "answer_stored",
      "D1: the write finished and its result was stored before the process died: that "
      "result is its answer, and it is not run again"),
    T("resume", "executing", "executing", (), None, None,
      "D1: a read, or a write known not to have started, is dispatched again"),
    T("resume", "review_required", "observing", (), None, "apply_review",
      "D2: a reviewer settled every paused call; placeholders are replaced and the skipped "
      "calls run afresh"),

    T("retry", "retry_wait", "executing", (), None, None,
      "R5: after the backoff the same call is dispatched again"),

    # ── observing: the result is paired; what next? ─────────────────────────────────
    T("observe", "observing", "budget_exhausted", ("output_budget_spent",), "tool_output",
      "stop", "R9: tool output past its size budget ends the run"),
    T("observe", "observing", "executing", ("batch_has_more_calls",), None, "next_call",
      "R1: the next call of the accepted batch"),
    T("observe", "observing", "budget_exhausted", ("model_calls_spent",), "model_calls",
      "stop", "R9: no model call past the model-call budget"),
    T("observe", "observing", "budget_exhausted", ("wall_clock_spent",), "wall_clock", "stop",
      "R9: no model call once the wall-clock budget is spent"),
    T("observe", "observing", "deciding", (), None, "end_batch",
      "R2: every call is answered, so the model may be asked again"),

    # ── cancel: the caller stopped the run; the history must still be valid ─────────
    T("cancel", "executing", "review_required", ("write_in_flight",), "outcome_unknown",
      "stop", "R6: a write cancelled mid-flight may still land; stop for review"),
    *(T("cancel", state, "cancelled", (), "cancelled", "stop",
        "R2: a cancelled run answers every open call so its history stays valid")
      for state in WORKING_STATES),

    # ── deciding, before the first model call (last: the rows above keep their index) ─
    T("begin", "deciding", "deciding", (), None, None,
      "the first model call is asked for; an application's before_model rules, judged "
      "here first, add their rows before this one"),
)
# fmt: on

del T


@dataclass(frozen=True, eq=False)
class Machine:
    """A run machine as a value: its states, its edges in priority order, and the hash
    of their definition (what every trace header and checkpoint records).

    Build one with :meth:`of` (no name checks: ``core/engine.py``'s
    :func:`~fsm_agent._core.engine.compile_machine` checks guard and action names, which
    this module cannot see). Two machines are equal when their hashes are.
    """

    #: Every edge, carrying its ``index`` (position here) and ``rank`` (within its group).
    transitions: tuple[Transition, ...]
    hash: str
    name: str = "run machine"
    initial: str = INITIAL_STATE
    states: tuple[str, ...] = STATES
    terminal: tuple[str, ...] = TERMINAL_STATES
    #: ``(source, trigger)`` -> its edges in priority order (what :func:`select` walks).
    groups: dict[tuple[str, str], tuple[Transition, ...]] = field(repr=False, default_factory=dict)
    by_key: dict[str, Transition] = field(repr=False, default_factory=dict)
    #: ``(name, digest)`` of what else the machine's rows stand for, covered by its hash:
    #: the application's rules (``("rules", RuleSet.hash)``), whose rows name only their
    #: ids, so a changed condition is a changed machine.
    covers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls,
        rows: Iterable[Transition],
        *,
        name: str = "run machine",
        initial: str = INITIAL_STATE,
        states: tuple[str, ...] = STATES,
        terminal: tuple[str, ...] = TERMINAL_STATES,
        covers: tuple[tuple[str, str], ...] = (),
    ) -> Machine:
        """The machine of ``rows`` (in priority order), each edge re-indexed for it."""
        rows = tuple(rows)
        groups: dict[tuple[str, str], list[Transition]] = {}
        for t in rows:
            groups.setdefault((t.source, t.trigger), []).append(t)
        edges: list[Transition] = []
        for i, t in enumerate(rows):
            group = groups[(t.source, t.trigger)]
            rank = (next(n for n, g in enumerate(group) if g is t) + 1, len(group))
            edges.append(replace(t, index=i, rank=rank))
        transitions = tuple(edges)
        by_group: dict[tuple[str, str], tuple[Transition, ...]] = {}
        for t in transitions:
            by_group[(t.source, t.trigger)] = (*by_group.get((t.source, t.trigger), ()), t)
        definition = _definition(initial, states, terminal, transitions, covers)
        return cls(
            transitions=transitions,
            hash=_digest(definition),
            name=name,
            initial=initial,
            states=tuple(states),
            terminal=tuple(terminal),
            groups=by_group,
            by_key={t.key: t for t in transitions},
            covers=tuple(covers),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Machine) and other.hash == self.hash

    def __hash__(self) -> int:
        return hash(self.hash)

    def edges_from(self, source: str, trigger: str) -> tuple[Transition, ...]:
        """The edges of ``trigger`` fired in ``source``, in priority order."""
        return self.groups.get((source, trigger), ())

    def edge_by_key(self, key: str) -> Transition | None:
        """The edge whose :attr:`Transition.key` is ``key``."""
        return self.by_key.get(key)

    def definition(self) -> dict[str, Any]:
        """Every column the runtime uses (what :attr:`hash` covers)."""
        return _definition(self.initial, self.states, self.terminal, self.transitions, self.covers)

    def extended(self, rows: Iterable[Transition], *, name: str | None = None) -> Machine:
        """This machine plus ``rows``: each is tried after the guarded edges of its trigger
        in its state and before that group's unguarded fallback (a row that opens a new
        group goes last). Not checked: see :func:`~fsm_agent._core.engine.compile_machine`."""
        table = [replace(t, index=-1) for t in self.transitions]
        for row in rows:
            at = len(table)
            for i, t in enumerate(table):
                if (t.source, t.trigger) == (row.source, row.trigger) and not t.guards:
                    at = i
            table.insert(at, row)
        return Machine.of(table, name=name or self.name, initial=self.initial,
                          states=self.states, terminal=self.terminal,
                          covers=self.covers)  # fmt: skip


def _definition(
    initial: str,
    states: Iterable[str],
    terminal: Iterable[str],
    edges: Iterable[Transition],
    covers: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    extra = {"covers": [list(c) for c in covers]} if covers else {}  # (a machine without
    return {  # any keeps the hash it had before machines could cover more)
        **extra,
        "initial": initial,
        "states": list(states),
        "terminal": list(terminal),
        "transitions": [
            [t.trigger, t.source, t.dest, list(t.guards), t.reason, t.action] for t in edges
        ],
    }


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


#: Today's table: the machine a runtime runs unless given another (``Runtime(machine=)``).
DEFAULT_MACHINE: Machine = Machine.of(_ROWS)

#: The default machine's edges, each carrying its ``index``.
TRANSITIONS: tuple[Transition, ...] = DEFAULT_MACHINE.transitions

#: The default machine's hash.
MACHINE_HASH: str = DEFAULT_MACHINE.hash


def edges_from(source: str, trigger: str) -> tuple[Transition, ...]:
    """The edges of ``trigger`` fired in ``source`` of the default machine, in priority
    order (:meth:`Machine.edges_from` for another machine)."""
    return DEFAULT_MACHINE.groups.get((source, trigger), ())


#: The 0.1 name of :func:`edges_from`.
transitions_from = edges_from


def edge_by_key(key: str) -> Transition | None:
    """The default machine's edge whose :attr:`Transition.key` is ``key``."""
    return DEFAULT_MACHINE.by_key.get(key)


def definition() -> dict[str, Any]:
    """Every column of the default table the runtime uses (what :data:`MACHINE_HASH`
    covers)."""
    return DEFAULT_MACHINE.definition()


#: Hashes that fsm-agent 0.1 wrote for tables with the same structure as this one: its
#: hash left out the ``action`` column, and this table's edges differ from 0.1's only by
#: the ``call_not_started`` edge (which 0.1 never took). Traces recorded under them still
#: check and replay; checkpoints recorded under them do not resume (see durable/).
LEGACY_MACHINE_HASHES: frozenset[str] = frozenset({"sha256:b0c6ee309f35fbb9"})


def check_table(
    transitions: tuple[Transition, ...],
    guard_names: Collection[str],
    actions: Collection[str] = get_args(Action),
    states: tuple[str, ...] = STATES,
    terminal: tuple[str, ...] = TERMINAL_STATES,
    initial: str = INITIAL_STATE,
) -> list[str]:
    """The inconsistencies of a table: unknown guards, actions or states, reasons that
    disagree with terminality, shadowed or missing fallbacks, unreachable states.

    ``engine.py`` runs it at import, so a bad table fails at once, not at the first
    unlucky trigger.
    """
    problems: list[str] = []
    groups: dict[tuple[str, str], list[Transition]] = {}
    for t in transitions:
        where = f"{t.label} ({t.source}->{t.dest})"
        groups.setdefault((t.source, t.trigger), []).append(t)
        problems += [f"{where}: unknown guard {g!r}" for g, _ in t.checks if g not in guard_names]
        problems += [f"{where}: unknown state {s!r}" for s in (t.source, t.dest) if s not in states]
        if t.action is not None and t.action not in actions:
            problems.append(f"{where}: unknown action {t.action!r}")
        # A self-loop on a terminal state (a review) keeps the run's stop reason.
        stays = t.source == t.dest and t.source in terminal
        if not stays and (t.dest in terminal) != (t.reason is not None):
            problems.append(f"{where}: reason and terminal disagree")
        if stays and t.reason is not None:
            problems.append(f"{where}: a self-loop on a terminal state keeps the stop reason")
        if t.source in terminal and t.trigger != "resume" and not stays:
            problems.append(f"{t.label}: only 'resume' may leave a terminal state")
    for (source, trigger), group in groups.items():
        if group[-1].guards:
            problems.append(f"{trigger} in {source}: the last edge must be an unguarded fallback")
        if any(not t.guards for t in group[:-1]):
            problems.append(f"{trigger} in {source}: an unguarded edge shadows later edges")
    reachable = {initial}
    frontier = [initial]
    while frontier:
        state = frontier.pop()
        for t in transitions:
            if t.source == state and t.dest not in reachable:
                reachable.add(t.dest)
                frontier.append(t.dest)
    problems += [f"state {s!r} is unreachable" for s in states if s not in reachable]
    return problems
