"""The run machine: one transition table, declared as data.

This table is the single source of truth. The runtime fires it, the diagram draws it,
the trace checker verifies traces against it and the coverage report counts its edges.
Nothing else in the package declares an edge.

Reading the table
-----------------
Each :class:`Transition` is one edge: ``trigger`` fired in ``source`` moves the run to
``dest`` when every guard holds. A guard written ``"!name"`` must be false. Transitions
that share a trigger and a source are tried in the order they are listed here, and that
order is their priority: the first whose guards all hold wins, so every such group ends
with an unguarded fallback (checked at import). ``reason`` is the stop reason recorded
when the edge enters a terminal state, ``action`` names the :class:`~fsm_agent.run.Run`
method run after the edge is taken, and ``rule`` says which rule of SPEC.md §2 the edge
encodes.

Triggers are fired by the runtime (the I/O shell) when it has news:

``model_replied`` / ``model_failed``  the model answered / raised
``validate``                          the decision and its whole batch are checked
``dispatch``                          one call of the batch is about to run
``tool_returned``                     that call's tool returned or raised
``retry``                             the backoff before a retry has elapsed
``observe``                           the call's result has been paired with its id
``cancel``                            the caller cancelled the run (asyncio cancel, Ctrl-C)
``resume``                            a stored run is picked up again (durable.py): its
                                      process died, or reviewers settled it

Changing the table changes :data:`MACHINE_HASH`, which every trace records.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from transitions import Machine
from transitions import Transition as TransitionsEdge
from transitions.core import Event as TransitionsEvent
from transitions.core import EventData

from fsm_agent.core.guards import GUARDS

__all__ = [
    "INITIAL_STATE",
    "MACHINE_HASH",
    "RUN_MACHINE",
    "STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "WORKING_STATES",
    "Transition",
    "check_table",
    "definition",
    "transitions_from",
]


@dataclass(frozen=True)
class Transition:
    """One edge of the run machine."""

    trigger: str
    source: str
    dest: str
    guards: tuple[str, ...] = ()
    reason: str | None = None
    action: str | None = None
    rule: str = ""

    @property
    def conditions(self) -> list[str]:
        return [g for g in self.guards if not g.startswith("!")]

    @property
    def unless(self) -> list[str]:
        return [g[1:] for g in self.guards if g.startswith("!")]

    @property
    def label(self) -> str:
        """``trigger [guard, !guard]``, as drawn on the diagram."""
        return f"{self.trigger} [{', '.join(self.guards)}]" if self.guards else self.trigger


INITIAL_STATE = "deciding"
WORKING_STATES: tuple[str, ...] = ("deciding", "validating", "executing", "retry_wait", "observing")
TERMINAL_STATES: tuple[str, ...] = (
    "done",
    "budget_exhausted",
    "protocol_error",
    "review_required",
    "cancelled",
)
STATES: tuple[str, ...] = WORKING_STATES + TERMINAL_STATES

T = Transition

TRANSITIONS: tuple[Transition, ...] = (
    # ── deciding: the model has been asked ──────────────────────────────────────────
    T(
        "model_replied",
        "deciding",
        "budget_exhausted",
        ("tokens_spent",),
        "tokens",
        "stop",
        "R9: a reply that takes tokens past the budget executes nothing new",
    ),
    T(
        "model_replied",
        "deciding",
        "budget_exhausted",
        ("cost_spent",),
        "cost",
        "stop",
        "R9: a reply that takes cost past the budget executes nothing new",
    ),
    T(
        "model_replied",
        "deciding",
        "validating",
        (),
        None,
        None,
        "R1: every decision is checked before anything in it runs",
    ),
    T(
        "model_failed",
        "deciding",
        "protocol_error",
        (),
        "model_error",
        "stop",
        "a model that raises or returns no message ends the run with its error",
    ),
    # ── validating: the whole batch, before any call runs ───────────────────────────
    T(
        "validate",
        "validating",
        "protocol_error",
        ("decision_malformed",),
        "malformed_decision",
        "stop",
        "R1: a decision that is not an assistant message of well-formed calls is refused",
    ),
    T(
        "validate",
        "validating",
        "done",
        ("!has_tool_calls", "has_answer"),
        "final_answer",
        "finish",
        "done means no new tool call and a non-empty answer",
    ),
    T(
        "validate",
        "validating",
        "protocol_error",
        ("!has_tool_calls",),
        "empty_answer",
        "stop",
        "no tool call and no answer is not an ending",
    ),
    T(
        "validate",
        "validating",
        "protocol_error",
        ("call_id_missing",),
        "missing_tool_call_id",
        "stop",
        "R1: a call without an id can never be paired; the whole batch is refused",
    ),
    T(
        "validate",
        "validating",
        "protocol_error",
        ("call_id_duplicate",),
        "duplicate_tool_call_id",
        "stop",
        "R1: results are bound by id, so ids must be unique; the whole batch is refused",
    ),
    T(
        "validate",
        "validating",
        "budget_exhausted",
        ("tool_rounds_spent",),
        "tool_rounds",
        "stop",
        "R9: no tool round past the round budget; the model may answer before it",
    ),
    T(
        "validate",
        "validating",
        "budget_exhausted",
        ("round_too_large",),
        "calls_per_round",
        "stop",
        "R9: a batch larger than the per-round limit runs nothing",
    ),
    T(
        "validate",
        "validating",
        "budget_exhausted",
        ("total_calls_spent",),
        "total_calls",
        "stop",
        "R9: a batch that takes total calls past the budget runs nothing",
    ),
    T(
        "validate",
        "validating",
        "protocol_error",
        ("strict_policy", "batch_has_unknown_tool"),
        "unknown_tool",
        "stop",
        "R10: under the strict policy an unknown tool stops the run",
    ),
    T(
        "validate",
        "validating",
        "protocol_error",
        ("strict_policy", "batch_has_denied_call"),
        "permission_denied",
        "stop",
        "R4/R10: under the strict policy a call outside allowed_tools stops the run",
    ),
    T(
        "validate",
        "validating",
        "protocol_error",
        ("strict_policy", "batch_has_invalid_arguments"),
        "invalid_arguments",
        "stop",
        "R3/R10: under the strict policy invalid arguments stop the run",
    ),
    T(
        "validate",
        "validating",
        "review_required",
        ("batch_needs_approval",),
        "approval_required",
        "stop",
        "R8: a write without an approval bound to its exact arguments runs nothing",
    ),
    T(
        "validate",
        "validating",
        "executing",
        (),
        None,
        "start_batch",
        "R1: the batch is accepted whole; its calls run one by one",
    ),
    # ── executing: one call, checked again just before it runs ──────────────────────
    T(
        "dispatch",
        "executing",
        "observing",
        ("!call_admitted",),
        None,
        "answer_refusal",
        "R3/R4/R10: an unknown tool, a denied call or invalid arguments is "
        "answered as a structured error and never runs",
    ),
    T(
        "dispatch",
        "executing",
        "budget_exhausted",
        ("wall_clock_spent",),
        "wall_clock",
        "stop",
        "R9: no tool call once the wall-clock budget is spent",
    ),
    T(
        "dispatch",
        "executing",
        "review_required",
        ("idempotency_conflict",),
        "idempotency_conflict",
        "stop",
        "R7: the same idempotency key with different arguments is never overwritten",
    ),
    T(
        "dispatch",
        "executing",
        "review_required",
        ("idempotency_pending",),
        "outcome_unknown",
        "stop",
        "R6/R7: an earlier write under this key may have taken effect; it is not run again",
    ),
    T(
        "dispatch",
        "executing",
        "observing",
        ("idempotent_replay",),
        None,
        "answer_replay",
        "R7: the same key and arguments return the stored result, executing nothing",
    ),
    T(
        "dispatch",
        "executing",
        "executing",
        (),
        None,
        "start_attempt",
        "the call is admitted and its tool runs now",
    ),
    # ── executing: the tool has returned or raised ──────────────────────────────────
    T(
        "tool_returned",
        "executing",
        "observing",
        ("call_succeeded",),
        None,
        "answer_result",
        "R1: the result is bound to its call id",
    ),
    T(
        "tool_returned",
        "executing",
        "observing",
        ("call_rejected",),
        None,
        "answer_failure",
        "R6: a definite rejection means nothing happened; the model is told",
    ),
    T(
        "tool_returned",
        "executing",
        "retry_wait",
        ("is_retryable", "attempts_left", "retry_fits_deadline"),
        None,
        "schedule_retry",
        "R5: only a read (or deduplicated write) is retried, only when "
        "transient, within max_attempts and the deadline",
    ),
    T(
        "tool_returned",
        "executing",
        "review_required",
        ("is_write",),
        "outcome_unknown",
        "stop",
        "R6: a write that failed in an unknown way may have happened; stop for review",
    ),
    T(
        "tool_returned",
        "executing",
        "observing",
        (),
        None,
        "answer_failure",
        "R5: a read that failed for good is answered as an error",
    ),
    # ── resume: a stored run is picked up again (durable.py fires these) ───────────
    T(
        "resume",
        "executing",
        "review_required",
        ("write_outcome_lost",),
        "outcome_unknown",
        "stop",
        "R6/§5: a write that was running when the process died may have happened; "
        "it is never run again",
    ),
    T(
        "resume",
        "executing",
        "observing",
        ("write_result_stored",),
        None,
        "answer_stored",
        "§5: the write finished and its result was stored before the process "
        "died: that result is its answer, and it is not run again",
    ),
    T(
        "resume",
        "executing",
        "executing",
        (),
        None,
        None,
        "§5: a read, or a write known not to have started, is dispatched again",
    ),
    T(
        "resume",
        "review_required",
        "observing",
        (),
        None,
        "apply_review",
        "§5: a reviewer settled every paused call; placeholders are replaced "
        "and the skipped calls run afresh",
    ),
    T(
        "retry",
        "retry_wait",
        "executing",
        (),
        None,
        None,
        "R5: after the backoff the same call is dispatched again",
    ),
    # ── observing: the result is paired; what next? ─────────────────────────────────
    T(
        "observe",
        "observing",
        "budget_exhausted",
        ("output_budget_spent",),
        "tool_output",
        "stop",
        "R9: tool output past its size budget ends the run",
    ),
    T(
        "observe",
        "observing",
        "executing",
        ("batch_has_more_calls",),
        None,
        "next_call",
        "R1: the next call of the accepted batch",
    ),
    T(
        "observe",
        "observing",
        "budget_exhausted",
        ("model_calls_spent",),
        "model_calls",
        "stop",
        "R9: no model call past the model-call budget",
    ),
    T(
        "observe",
        "observing",
        "budget_exhausted",
        ("wall_clock_spent",),
        "wall_clock",
        "stop",
        "R9: no model call once the wall-clock budget is spent",
    ),
    T(
        "observe",
        "observing",
        "deciding",
        (),
        None,
        "end_batch",
        "R2: every call is answered, so the model may be asked again",
    ),
    # ── cancel: the caller stopped waiting; the history must still be valid ─────────
    T(
        "cancel",
        "executing",
        "review_required",
        ("write_in_flight",),
        "outcome_unknown",
        "stop",
        "R6: a write cancelled mid-flight may still land; stop for review",
    ),
    *(
        T(
            "cancel",
            state,
            "cancelled",
            (),
            "cancelled",
            "stop",
            "R2: a cancelled run answers every open call so its history stays valid",
        )
        for state in WORKING_STATES
    ),
)

del T


def transitions_from(source: str, trigger: str) -> tuple[Transition, ...]:
    """The edges of ``trigger`` fired in ``source``, in priority order."""
    return _BY_SOURCE_TRIGGER.get((source, trigger), ())


def definition() -> dict[str, Any]:
    """The structural part of the table (what :data:`MACHINE_HASH` covers)."""
    return {
        "initial": INITIAL_STATE,
        "states": list(STATES),
        "terminal": list(TERMINAL_STATES),
        "transitions": [
            [t.trigger, t.source, t.dest, list(t.guards), t.reason] for t in TRANSITIONS
        ],
    }


def _hash_definition() -> str:
    text = json.dumps(definition(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def check_table(  # noqa: C901 - one check per table property
    transitions: tuple[Transition, ...],
    states: tuple[str, ...] = STATES,
    terminal: tuple[str, ...] = TERMINAL_STATES,
    initial: str = INITIAL_STATE,
) -> list[str]:
    """The inconsistencies of a table: unknown guards or states, reasons that disagree
    with terminality, shadowed or missing fallbacks, unreachable states.

    Run at import so a bad table fails at once, not at the first unlucky trigger. (Action
    names are checked against :class:`~fsm_agent.run.Run` when that module loads.)
    """
    problems: list[str] = []
    groups: dict[tuple[str, str], list[Transition]] = {}
    for t in transitions:
        groups.setdefault((t.source, t.trigger), []).append(t)
        for name in (*t.conditions, *t.unless):
            if name not in GUARDS:
                problems.append(f"{t.label} ({t.source}->{t.dest}): unknown guard {name!r}")
        for state in (t.source, t.dest):
            if state not in states:
                problems.append(f"{t.label}: unknown state {state!r}")
        if (t.dest in terminal) != (t.reason is not None):
            problems.append(f"{t.label} ({t.source}->{t.dest}): reason and terminal disagree")
        if t.source in terminal and t.trigger != "resume":
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


class _Edge(TransitionsEdge):
    """A ``transitions`` edge that knows its table row.

    The stock ``execute`` logs at debug level and runs (empty) prepare/before/after
    callback lists for every candidate edge it tries; ``validate`` alone tries up to 14 per
    decision. Our guards are pure and nothing hooks those lists, so this ``execute`` checks
    the conditions and sets the state through the machine, and nothing else. (Measured on
    the overhead benchmark: about half the engine's time per tool round.)
    """

    row: Transition
    #: (guard name, predicate, required outcome), in the order transitions checks them.
    checks: tuple[tuple[str, Callable[[Any], bool], bool], ...] = ()

    def execute(self, event_data: Any) -> bool:
        run = event_data.model
        log = run.guard_log
        for name, predicate, target in self.checks:
            value = predicate(run)
            log[name] = value
            if value != target:
                return False
        event_data.machine.set_state(self.dest, run)
        run.taken = self.row
        return True


class _Trigger(TransitionsEvent):
    """A ``transitions`` event fired the way this machine is configured: unqueued, with no
    prepare/finalize/exception callbacks (``_build`` asserts that). It finds the model's
    state, refuses an invalid source as the stock event does, and tries the candidate
    edges in order; it skips the stock path's empty callback lists and debug logging,
    which cost more than the edge choice itself on the hot path. (tests/test_machine_
    equivalence.py checks it picks what stock ``transitions`` picks.)"""

    def trigger(self, model: Any, *args: Any, **kwargs: Any) -> bool:
        edges = self.transitions.get(model.state)  # the states are plain strings here
        if edges is None:  # no edge from this state: the stock path raises MachineError
            return bool(super().trigger(model, *args, **kwargs))
        event_data = EventData(None, self, self.machine, model, args=args, kwargs=kwargs)
        for edge in edges:
            event_data.transition = edge
            if edge.execute(event_data):
                return True
        return False


class _RunMachine(Machine):
    transition_cls = _Edge
    event_cls = _Trigger


def _build(guards: dict[str, Callable[[Any], bool]] | None = None) -> Machine:
    """The shared machine. ``guards`` replaces :data:`GUARDS` (tests compare this machine
    with a stock ``transitions`` one under arbitrary guard outcomes)."""
    guards = GUARDS if guards is None else guards
    # Guards are passed as callables taking the run, not as names: no getattr per check.
    machine = _RunMachine(
        model=None,
        states=list(STATES),
        initial=INITIAL_STATE,
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
    # _Trigger relies on these staying unset.
    assert not (
        machine.has_queue or machine.prepare_event or machine.finalize_event or machine.on_exception
    )
    for t in TRANSITIONS:
        machine.add_transition(
            t.trigger,
            t.source,
            t.dest,
            conditions=[guards[g] for g in t.conditions],
            unless=[guards[g] for g in t.unless],
        )
        edge = cast(_Edge, machine.events[t.trigger].transitions[t.source][-1])
        edge.row = t
        pairs = [*((g, True) for g in t.conditions), *((g, False) for g in t.unless)]
        edge.checks = tuple((g, guards[g], target) for g, target in pairs)
    return machine


_BY_SOURCE_TRIGGER: dict[tuple[str, str], tuple[Transition, ...]] = {}
for _t in TRANSITIONS:
    _BY_SOURCE_TRIGGER[(_t.source, _t.trigger)] = (
        *_BY_SOURCE_TRIGGER.get((_t.source, _t.trigger), ()),
        _t,
    )
del _t

MACHINE_HASH: str = _hash_definition()
_problems = check_table(TRANSITIONS)
if _problems:
    raise RuntimeError("invalid run machine table:\n  " + "\n  ".join(_problems))
#: The one shared ``transitions`` machine; runs are fired through ``RUN_MACHINE.events``.
RUN_MACHINE: Machine = _build()
