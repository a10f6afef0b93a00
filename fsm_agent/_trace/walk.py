"""The checker's walk over one run's events: the machine, the guards, the pairing.

:class:`Walk` is fed events in order (``trace/checker.py`` reads and authenticates the
lines) and keeps only what the run keeps — the settings, the counters, the current batch
— so a trace of any length is checked in constant memory. For each event it checks:

* ``seq`` is contiguous; a decision comes only when the model was asked;
* a transition fires from the state the run is in, and is the edge the one selector
  (``core/select.py``) picks from the guard outcomes *recomputed* from the trace
  (``trace/model.py``); the recorded outcomes must be exactly the guards that choice
  evaluates, with the recomputed values (a guard the trace cannot settle counts as
  recorded, within what the trace does settle);
* the edge's action happened: its payloads (observations, ``run_end``) follow it, in
  the loop's order, with what the action writes (ids, ``synthetic``, error kinds), the
  call and attempt it names are the run's, a write that needs an approval names one
  that covers exactly its arguments;
* pairing: every call of an accepted batch answered once by id, no orphan answers; no
  idempotent write executed twice with the same arguments; nothing after a terminal
  state but reviews of the paused calls and the ``resume`` edge once they are settled;
  ``run_end`` reports the counters the events add up to.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from fsm_agent._core.actions import BLOCKING, FITS
from fsm_agent._core.budget import MAX_RECORD_BYTES
from fsm_agent._core.canonical import ArgumentsError, digest, parse_arguments
from fsm_agent._core.decision import NO_DECISION, Decision
from fsm_agent._core.select import GuardNotRecorded, select, select_recorded
from fsm_agent._core.table import INITIAL_STATE, TERMINAL_STATES, Transition, edges_from
from fsm_agent._trace.model import (
    UNSURE,
    CallFacts,
    Settings,
    Usage,
    count_usage,
    read_decision,
    result_size,
)

__all__ = ["Walk", "Write"]

_TERMINAL = _TERMINAL_SET = frozenset(TERMINAL_STATES)
_FAILURE_ERRORS = {"rejected": "rejected", "timeout": "timeout", "not_started": "not_executed"}
_KINDS = frozenset({"ok", "rejected", "transient", "timeout", "error", "not_started"})
#: Seconds within which a recorded ``t`` (rounded to 1 µs) cannot settle a deadline.
_CLOCK_SLACK = 2e-6

# Per (source, trigger): the guard names its edges read, in table order.
_NAMES: dict[tuple[str, str], tuple[str, ...]] = {}


def _names(source: str, trigger: str) -> tuple[str, ...]:
    key = (source, trigger)
    names = _NAMES.get(key)
    if names is None:
        seen: dict[str, None] = {}
        for edge in edges_from(source, trigger):
            for name, _ in edge.checks:
                seen.setdefault(name, None)
        names = _NAMES[key] = tuple(seen)
    return names


#: (source, trigger, values) -> (edge, evaluated outcomes) or (None, name not recorded).
_CHOICES: dict[tuple[Any, ...], tuple[Transition | None, Any]] = {}


def _choose(source: str, trigger: str, names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """The one selector over the given outcomes, memoised (a trace repeats few shapes)."""
    key = (source, trigger, values)
    found = _CHOICES.get(key)
    if found is None:
        table = dict(zip(names, values, strict=True))
        evaluated: dict[str, bool] = {}

        def guard(name: str) -> bool:
            value = table.get(name)
            if value is None:
                raise KeyError(name)
            evaluated[name] = value
            return bool(value)

        try:
            found = (select(source, trigger, guard), evaluated)
        except KeyError as exc:
            found = (None, exc.args[0])
        if len(_CHOICES) < 100_000:  # bounded: hostile traces vary outcomes freely
            _CHOICES[key] = found
    return found


def _flag(value: Any) -> Any:
    return value if value is True or value is False else UNSURE


def _dispatch(w: Walk, e: dict[str, Any], guards: dict[str, Any]) -> tuple[Any, ...]:
    call = w.call
    if call is None:
        return (None,)
    admitted = call.admitted
    if w.resumed and admitted:
        admitted = UNSURE
    if admitted is UNSURE:
        admitted = _flag(guards.get("call_admitted"))
    clock = w.clock(e, 0.0) if w.settings.budget.max_wall_clock_s is not None else False
    if clock is UNSURE:
        clock = _flag(guards.get("wall_clock_spent"))
    refused = _refused(w, e)
    if not call.idempotent or w.claimed:
        return (admitted, clock, False, False, False, refused)
    return (
        admitted,
        clock,
        _flag(guards.get("idempotency_conflict")),
        _flag(guards.get("idempotency_pending")),
        _flag(guards.get("idempotent_replay")),
        refused,
    )


def _refused(w: Walk, e: dict[str, Any]) -> Any:
    """``approval_refused``: the store's recorded answer; after a resume also a call the
    resuming runtime's approvals no longer cover (admission is not in the trace)."""
    if e.get("approval_use") == "refused":
        return True
    return _flag(e.get("guards", {}).get("approval_refused")) if w.resumed else False


def _returned(w: Walk, e: dict[str, Any], guards: dict[str, Any]) -> tuple[Any, ...]:
    known = w.recompute("tool_returned", e)
    return tuple(
        _flag(guards.get(n)) if known.get(n, UNSURE) is UNSURE else known[n]
        for n in _names("executing", "tool_returned")
    )


def _observe(w: Walk, e: dict[str, Any], guards: dict[str, Any]) -> tuple[Any, ...]:
    b = w.settings.budget
    limit = b.max_output_bytes
    clock = w.clock(e, 0.0) if b.max_wall_clock_s is not None else False
    if clock is UNSURE:
        clock = _flag(guards.get("wall_clock_spent"))
    return (
        limit is not None and w.output_bytes > limit,
        w.more_calls(),
        w.model_calls >= b.max_model_calls,
        clock,
    )


def _no_guards(w: Walk, e: dict[str, Any], guards: dict[str, Any]) -> tuple[Any, ...]:
    return ()


def _generic(source: str, trigger: str) -> Callable[[Walk, dict[str, Any], dict[str, Any]], Any]:
    def values(w: Walk, e: dict[str, Any], guards: dict[str, Any]) -> tuple[Any, ...]:
        return w.values(source, trigger, _names(source, trigger), guards, e)

    return values


#: (source, trigger) -> the recomputed outcomes of its guards, in ``_names`` order.
_PROVIDERS: dict[tuple[Any, Any], Callable[[Walk, dict[str, Any], dict[str, Any]], Any]] = {}
#: ((source, trigger, dest, reason, recorded outcomes), recomputed) -> the edge, for
#: shapes that checked clean.
_SEEN: dict[tuple[Any, ...], Transition] = {}


class Write(NamedTuple):
    """A write of an idempotent tool as the trace reports it (``check --db``)."""

    line: int
    call_id: str
    tool: str
    how: str  # executed | stored | replayed | reconciled
    digest: str | None
    value: Any


def args_digest(call: CallFacts) -> str | None:
    """The digest an idempotency record binds: tool name + canonical arguments."""
    try:
        return digest(call.name, parse_arguments(call.raw))
    except (ArgumentsError, RecursionError):
        return None


class Expected:
    """A payload event the last transition's action must have written next."""

    __slots__ = ("call", "check", "kind")

    def __init__(self, kind: str, call: CallFacts | None = None, check: Any = None) -> None:
        self.kind, self.call, self.check = kind, call, check


class Walk:
    """See the module docstring. ``fail(line, message)`` receives each violation."""

    def __init__(self, head: Mapping[str, Any], fail: Callable[[int, str], None], *, legacy: bool):
        self._report = fail
        self.count = 0  # violations so far (the fast path learns only from clean events)
        self.legacy = legacy
        self.settings = Settings(head)
        if self.settings.problems:
            fail(1, "the header " + "; ".join(self.settings.problems))
        self.state: str = INITIAL_STATE
        self.seq = 1
        self.decided = False
        self.ended = 0  # line of the run_end that closed the run (0 while it runs)
        self.status: str | None = None
        self.stop_reason: str | None = None
        self.answer: str | None = None
        self.expect: deque[Expected] = deque()
        self.prev_line = 1
        # counters, as the loop keeps them
        self.model_calls = self.tool_rounds = self.tool_calls = 0
        self.write_attempts = self.replays = self.retries = self.output_bytes = 0
        self.tool_attempts: dict[str, int] = {}
        self.usage = Usage()
        self.reply_oversized = False
        # the batch
        self.decision: Decision = NO_DECISION
        self.calls: list[CallFacts] = []
        self.by_id: dict[str, CallFacts] = {}
        self.accepted = False  # a batch in the history whose calls must all be answered
        self.batch_line = 0
        self.answered: set[str] = set()
        self.placeholders: dict[str, str] = {}  # call id -> placeholder error
        self.reviews: dict[str, Mapping[str, Any]] = {}
        self.index = -1
        self.call: CallFacts | None = None
        self.attempt = 0
        self.outcome = "ok"
        self.in_flight = False
        self.claimed = False
        self.last: Transition | None = None
        self.resumed = False  # a resume may narrow the allow-list: admission then as recorded
        self.uses: dict[str, int] = {}  # configured approval id -> calls that took it
        self.approved: dict[str, Mapping[str, Any]] = {}  # call id -> its approve review
        self.to_dispatch = False  # a call was selected (or is due again) and not dispatched
        self.line = 1
        self.executed: dict[tuple[str, str], int] = {}
        #: Writes as the trace reports them, for the store cross-check (when asked).
        self.writes: list[Write] | None = None

    def fail(self, line: int, message: str) -> None:
        self.count += 1
        self._report(line, message)

    def feed(self, line: int, e: dict[str, Any]) -> None:
        self.event(line, e)

    def feed_many(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        for line, e in events:
            self.event(line, e)

    def skip(self, line: int, *, numbered: bool) -> None:
        """A line that holds no event (reported already); ``numbered``: it was JSON, so
        it counts as an event that used up a seq."""
        if numbered:
            self.seq += 1

    # ── the events ────────────────────────────────────────────────────────────────

    def event(self, line: int, e: dict[str, Any]) -> None:  # noqa: C901 - one branch per event type, the hot path kept flat
        self.line = line
        seq = e.get("seq")
        if seq != self.seq:
            self.fail(
                line,
                f"seq is {seq!r}, expected {self.seq} (events missing, duplicated or reordered)",
            )
        self.seq = (seq + 1) if type(seq) is int else self.seq + 1
        kind = e.get("type")
        if self.ended and kind not in ("transition", "review"):
            self.fail(
                line,
                f"{kind} event after the run ended in {self.state} (run_end at line {self.ended})",
            )
            return
        expect = self.expect
        if expect:
            wanted = expect[0]
            if kind != wanted.kind:
                self.missing(line, wanted)
                expect.clear()
            else:
                expect.popleft()
                if kind == "observation":
                    self.observation(line, e, wanted)
                elif kind == "review":
                    self.review(line, e)
                else:
                    self.run_end(line, e)
                self.prev_line = line
                return
        if kind == "transition":
            self.transition(line, e)
        elif kind == "decision":
            self.decision_event(line, e)
        elif kind == "review":
            if "at" in e:  # (a bare review is an older writer's, which recorded no time)
                self.fail(line, "a review event that no review transition wrote")
            self.review(line, e)
        elif kind == "observation":
            call_id = e.get("call_id")
            if isinstance(call_id, str) and call_id in self.answered:
                self.fail(line, f"call {call_id!r} answered a second time")
            elif isinstance(call_id, str) and call_id in self.by_id:
                self.fail(line, f"an answer to {call_id!r} that no transition wrote here")
            else:
                self.fail(
                    line,
                    f"observation for {call_id!r}, which is not a call of the current batch "
                    "(an orphan result)",
                )
        elif kind == "run_end":
            self.fail(line, f"run_end while the run is in {self.state}, not right after its stop")
        elif kind == "run_start":
            self.fail(line, "a second run_start: one trace file holds one run")
        else:
            self.fail(line, f"unknown event type {kind!r}")
        self.prev_line = line

    def missing(self, line: int, wanted: Expected) -> None:
        if wanted.kind == "run_end":
            self.fail(line, f"the run stopped in {self.state} but run_end does not follow")
        elif wanted.kind == "review":
            self.fail(line, "the review transition is not followed by its review event")
        else:
            who = wanted.call.id if wanted.call is not None else "?"
            self.fail(
                line,
                f"the answer to call {who!r} that the last transition wrote is missing here",
            )

    def finish(self, line: int) -> None:
        if self.expect and self.expect[0].kind != "run_end":
            self.missing(line, self.expect[0])
        elif not self.ended:
            self.fail(line, f"the trace ends in state {self.state} without run_end")

    # ── decision ──────────────────────────────────────────────────────────────────

    def decision_event(self, line: int, e: dict[str, Any]) -> None:
        if self.state != INITIAL_STATE or self.decided or self.ended:
            self.fail(
                line,
                f"a decision while the run is in {self.state}"
                + (" and the previous decision was not acted on" if self.decided else ""),
            )
        self.decided = True
        self.model_calls += 1
        self.answered = set()
        oversized = e.get("oversized")
        self.reply_oversized = (
            type(oversized) is int and oversized > self.settings.budget.max_reply_bytes
        )
        if oversized is not None:  # recorded by its size: model_replied stops reply_size
            self.decision = NO_DECISION
            self.calls, self.by_id, self.accepted = [], {}, False
            count_usage(self.usage, e.get("usage"))
            return
        if "message" not in e:
            return  # the model raised: model_failed follows
        message = e.get("message")
        d, calls = read_decision(message)
        verdict = e.get("malformed")
        if d.malformed is not None and verdict is None and not self.legacy:
            self.fail(line, f"the decision is malformed ({d.malformed}) but not marked so")
        if verdict is not None and d.malformed is None:
            # Refused for a value its JSON-safe record no longer shows (R12).
            d = Decision(message=d.message, malformed=str(verdict))
            calls = []
        self.decision = d
        self.calls = calls
        self.by_id = {c.id: c for c in calls}
        self.accepted = False
        if isinstance(message, dict):
            count_usage(self.usage, message.get("usage"))
        if d.malformed is None and d.missing_id is None:
            for c in calls:
                c.admit(self.settings)
                self.approve(c)

    def approve(self, c: CallFacts) -> None:
        """Whether the call needs an approval: the one it holds, a reviewer's approval of
        it, or a configured one for its digest (``core/loop.py``'s ``_admit``)."""
        if not c.requires_approval or c.refusal is not UNSURE or c.digest is None:
            c.needs_approval = False
            return
        if c.approval is not None:
            c.needs_approval = False
            return
        review = self.reviews.get(c.id) or {}
        if review.get("action") == "approve" and review.get("digest") == c.digest:
            c.approval = f"review:{c.id}"
            c.needs_approval = False
            return
        settings = self.settings
        if c.digest not in settings.approvals:
            # Needed, if admitted: the schema (not in the trace) may still refuse the call,
            # and then nothing needs approval. A write that runs must name an approval
            # covering its digest (check_approval), so a false "no" is caught there.
            c.needs_approval = UNSURE
            return
        # Admission only identifies a configured approval; a limited one's use is spent
        # at dispatch, and the store's answer is recorded there (``approval_use``).
        c.needs_approval = False
        if settings.approvals[c.digest] is None:
            c.approval = f"config:{c.digest[:16]}"

    # ── transitions ───────────────────────────────────────────────────────────────

    def transition(self, line: int, e: dict[str, Any]) -> None:
        get = e.get
        source, trigger, dest, reason = get("source"), get("trigger"), get("dest"), get("reason")
        guards = get("guards")
        if (
            source == self.state
            and type(trigger) is str
            and type(guards) is dict
            and not self.ended
            and not self.legacy
        ):
            # The fast path: an event whose shape (edge, recorded outcomes) and recomputed
            # outcomes were seen before and found right is right again; only its action
            # (counters, the batch) needs doing. A trace repeats few such shapes.
            provider = _PROVIDERS.get((source, trigger))
            if provider is not None:
                try:
                    shape = (source, trigger, dest, reason, tuple(guards.items()))
                    key = (shape, provider(self, e, guards))
                    edge = _SEEN.get(key)
                except TypeError:  # an unhashable outcome: the slow path says what is wrong
                    edge = key = None
                if edge is not None:
                    if source == INITIAL_STATE:
                        self.decided = False
                    self.act(line, edge, e)
                    self.last = edge
                    self.state = dest = edge.dest  # (the shape was checked: the same)
                    if dest in _TERMINAL_SET:
                        self.status, self.stop_reason = dest, reason
                        self.expect.append(Expected("run_end"))
                    return
                if key is not None:
                    before = self.count
                    self.slow_transition(line, e)
                    if self.count == before and self.last is not None and len(_SEEN) < 100_000:
                        _SEEN[key] = self.last
                    return
        self.slow_transition(line, e)

    def slow_transition(self, line: int, e: dict[str, Any]) -> None:
        source, trigger, dest = e.get("source"), e.get("trigger"), e.get("dest")
        reason = e.get("reason")
        if not (isinstance(source, str) and isinstance(trigger, str) and isinstance(dest, str)):
            self.fail(line, "a transition without a source, trigger or dest")
            return
        state = self.state
        if source != state:
            self.fail(line, f"{trigger} fired in {source!r}, but the run was in {state}")
        guards = e.get("guards")
        if not isinstance(guards, dict):
            if guards is not None or not self.legacy:
                self.fail(line, "guards is not an object of guard outcomes")
            guards = {}
        if self.ended and not edges_from(source, trigger):
            self.fail(
                line,
                f"{trigger} after the run ended in {state} (run_end at line {self.ended}); "
                "the table has no such edge out of it",
            )
        edge = self.choose(line, source, trigger, guards, e)
        if edge is not None and (edge.dest != dest or edge.reason != reason):
            self.wrong_edge(line, edge, source, trigger, dest, reason)
            edge = next(
                (t for t in edges_from(source, trigger) if t.dest == dest and t.reason == reason),
                None,
            )
        elif edge is None and not edges_from(source, trigger) and not self.ended:
            self.fail(line, f"the table has no {trigger!r} edge out of {source}")
        if source == INITIAL_STATE:
            self.decided = False
        if state in _TERMINAL and trigger == "resume":
            self.ended = 0
        if edge is not None:
            self.act(line, edge, e)
        self.last = edge
        self.state = dest
        if dest in _TERMINAL and state not in _TERMINAL:  # (a review: still paused)
            self.status, self.stop_reason = dest, reason
            self.expect.append(Expected("run_end"))

    def choose(
        self, line: int, source: str, trigger: str, guards: dict[str, Any], e: dict[str, Any]
    ) -> Transition | None:
        """The edge the recomputed outcomes select; every difference from the recorded
        outcomes is a violation."""
        if self.legacy:
            try:
                return select_recorded(source, trigger, guards, legacy=True)
            except GuardNotRecorded as exc:
                self.fail(line, f"{trigger} in {source}: {exc}")
                return None
        names = _names(source, trigger)
        values = self.values(source, trigger, names, guards, e)
        chosen: tuple[Transition | None, Any] = _choose(source, trigger, names, values)
        edge, evaluated = chosen
        if edge is None:
            if evaluated is not None and names:
                self.fail(
                    line,
                    f"{trigger} in {source}: the outcome of guard {evaluated!r} decides the "
                    "edge, and it was not recorded",
                )
            return None
        if guards != evaluated:
            self.compare(line, trigger, guards, evaluated)
        return edge

    def compare(
        self, line: int, trigger: str, recorded: dict[str, Any], evaluated: dict[str, bool]
    ) -> None:
        for name, value in evaluated.items():
            if name not in recorded:
                self.fail(line, f"{trigger}: guard {name!r} decides the edge and is not recorded")
            elif recorded[name] is not value:
                self.fail(
                    line,
                    f"{trigger}: guard {name!r} is recorded {_js(recorded[name])}, but the "
                    f"trace makes it {_js(value)}",
                )
        for name in recorded:
            if name not in evaluated:
                self.fail(
                    line, f"{trigger}: guard {name!r} is recorded but the choice never reads it"
                )

    def wrong_edge(
        self, line: int, edge: Transition, source: str, trigger: str, dest: str, reason: Any
    ) -> None:
        if edge.dest != dest:
            self.fail(
                line,
                f"the guard outcomes select {edge.label} -> {edge.dest}, "
                f"but the event went to {dest!r}",
            )
        else:
            self.fail(
                line,
                f"{edge.label} -> {edge.dest} records reason {edge.reason!r}, "
                f"the event says {reason!r}",
            )

    # ── recomputed guard values ───────────────────────────────────────────────────

    def values(
        self,
        source: str,
        trigger: str,
        names: tuple[str, ...],
        guards: dict[str, Any],
        e: dict[str, Any],
    ) -> tuple[Any, ...]:
        known = self.recompute(trigger, e)
        out = []
        for name in names:
            value = known.get(name, UNSURE)
            if value is UNSURE:
                value = guards.get(name)
                if value is not True and value is not False:
                    value = UNSURE
            out.append(value)
        return tuple(out)

    def recompute(self, trigger: str, e: dict[str, Any]) -> dict[str, Any]:  # noqa: C901 - one branch per trigger, each a few lines
        b = self.settings.budget
        if trigger == "model_replied":
            u = self.usage
            return {
                "reply_too_large": self.reply_oversized,
                "usage_unknown": u.tokens_unknown
                and (b.max_tokens is not None or b.max_cost is not None),
                "tokens_spent": b.max_tokens is not None
                and (u.tokens_unknown or u.tokens > b.max_tokens),
                "cost_spent": b.max_cost is not None and (u.cost_unknown or u.cost > b.max_cost),
            }
        if trigger == "validate":
            return self.validate_values()
        call = self.call
        if trigger == "dispatch":
            if call is None:
                return {}
            admitted = call.admitted
            if self.resumed and admitted:
                admitted = UNSURE  # the resuming caller may have narrowed the allow-list
            plain = not call.idempotent or self.claimed
            return {
                "call_admitted": admitted,
                "wall_clock_spent": self.clock(e, 0.0),
                "idempotency_conflict": False if plain else UNSURE,
                "idempotency_pending": False if plain else UNSURE,
                "idempotent_replay": False if plain else UNSURE,
                "approval_refused": _refused(self, e),
            }
        if trigger == "tool_returned":
            kind = e.get("outcome")
            if call is None or kind not in _KINDS:
                if not self.legacy:
                    self.fail(self.line, f"tool_returned without a valid outcome: {kind!r}")
                return {}
            self.outcome = kind
            deadline = self.clock(e, self.settings.retry.backoff(self.attempt))
            return {
                "call_not_started": kind == "not_started",
                "call_succeeded": kind == "ok",
                "call_rejected": kind == "rejected",
                "is_retryable": kind in ("transient", "timeout")
                and (call.effect == "read" or call.dedup),
                "attempts_left": self.attempt < self.settings.retry.max_attempts,
                "retry_fits_deadline": UNSURE if deadline is UNSURE else not deadline,
                "is_write": call.effect == "write",
            }
        if trigger == "observe":
            limit = b.max_output_bytes
            return {
                "output_budget_spent": limit is not None and self.output_bytes > limit,
                "batch_has_more_calls": self.more_calls(),
                "model_calls_spent": self.model_calls >= b.max_model_calls,
                "wall_clock_spent": self.clock(e, 0.0),
            }
        if trigger == "resume" and call is not None:
            lost: Any = UNSURE
            if call.effect != "write" or call.dedup:
                lost = False
            elif not call.idempotent:
                lost = True
            return {
                "write_outcome_lost": lost,
                "write_result_stored": UNSURE if call.idempotent else False,
            }
        if trigger == "cancel":
            flying = self.in_flight and call is not None and call.effect == "write"
            return {"write_in_flight": UNSURE if flying else False}
        return {}

    def clock(self, e: dict[str, Any], ahead: float) -> Any:
        """Whether ``t + ahead`` has reached the wall-clock limit (UNSURE within the
        rounding of ``t``, or without a usable ``t``)."""
        limit = self.settings.budget.max_wall_clock_s
        if limit is None:
            return False
        t = e.get("t")
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            return UNSURE
        at = t + ahead
        if abs(at - limit) <= _CLOCK_SLACK:
            return UNSURE
        return at >= limit

    def validate_values(self) -> dict[str, Any]:
        d, b, calls = self.decision, self.settings.budget, self.calls
        n = len(calls)
        out: dict[str, Any] = {
            "decision_malformed": d.malformed is not None,
            "has_tool_calls": bool(d.calls),
            "has_answer": bool(d.answer and d.answer.strip()),
            "call_id_missing": d.missing_id is not None,
            "call_id_duplicate": d.duplicate_id is not None,
            "tool_rounds_spent": self.tool_rounds >= b.max_tool_rounds,
            "round_too_large": n > b.max_calls_per_round,
            "total_calls_spent": self.tool_calls + n > b.max_total_calls,
            "strict_policy": self.settings.strict,
        }
        if d.malformed is not None or d.missing_id is not None:
            return out  # not admitted: nothing else is read
        refusals = [c.refusal for c in calls]
        out["batch_has_unknown_tool"] = "unknown_tool" in refusals
        out["batch_has_denied_call"] = "permission_denied" in refusals
        if self.resumed:
            out["batch_has_denied_call"] = True if out["batch_has_denied_call"] else UNSURE
        out["batch_has_invalid_arguments"] = (
            True
            if "invalid_arguments" in refusals
            else (UNSURE if any(r is UNSURE for r in refusals) else False)
        )
        needs = [c.needs_approval for c in calls]
        out["batch_needs_approval"] = (
            True
            if True in needs
            else (UNSURE if any(x is UNSURE for x in needs) or UNSURE in refusals else False)
        )
        return out

    def more_calls(self) -> bool:
        calls, answered, nxt = self.calls, self.answered, self.index + 1
        if not self.accepted or nxt >= len(calls):
            return False
        return calls[nxt].id not in answered or any(c.id not in answered for c in calls[nxt:])

    # ── what each edge's action did ───────────────────────────────────────────────

    def act(self, line: int, edge: Transition, e: dict[str, Any]) -> None:  # noqa: C901 - one branch per action of the table
        action = edge.action
        self.order(line, edge, e)
        if edge.trigger == "dispatch" and "approval_use" in e:
            self.approval_use(line, edge, e["approval_use"])
        if edge.trigger == "dispatch" and edge.reason == "approval_required" and self.call:
            self.call.needs_approval = True  # its placeholder waits for an approval
        if edge.trigger == "resume":
            self.resumed = True
            self.uses = {}
            self.in_flight = False
            self.to_dispatch = edge.dest == "executing"
        elif edge.trigger == "retry":
            self.to_dispatch = True
        if action == "start_batch":
            self.accepted = True
            self.batch_line = line
            self.tool_rounds += 1
            self.tool_calls += len(self.calls)
            if self.calls:
                self.select(0)
        elif action == "next_call":
            index = self.index + 1
            while index < len(self.calls) and self.calls[index].id in self.answered:
                index += 1
            if index < len(self.calls):
                self.select(index)
        elif action == "end_batch":
            self.decision, self.calls, self.by_id = NO_DECISION, [], {}
            self.accepted = False
            self.call, self.index = None, -1
        elif action == "start_attempt":
            self.start_attempt(line, e)
        elif action == "schedule_retry":
            self.retries += 1
        elif action in ("answer_refusal", "answer_replay", "answer_result", "answer_failure"):
            if action == "answer_replay":
                self.replays += 1
                if self.call is not None and self.call.effect == "write":
                    self.write_attempts += 1
            if action == "answer_failure" or edge.trigger == "tool_returned":
                self.in_flight = False
            self.expect_answer(action)
        elif action == "answer_stored":
            self.expect_answer(action)
        elif action == "finish":
            self.answer = self.decision.answer
        elif action == "stop":
            self.stop(edge)
        elif action == "apply_review":
            self.apply_review()
        elif action == "record_review":
            self.expect.append(Expected("review"))
        if edge.trigger == "tool_returned":
            self.in_flight = False
            if self.outcome in ("rejected", "not_started"):
                self.claimed = False  # the intent was aborted: begun again next time
        self.check_call(line, edge, e)

    def order(self, line: int, edge: Transition, e: dict[str, Any]) -> None:
        """Steps of one call come in the loop's order: selected, dispatched, returned."""
        if self.legacy:
            return
        trigger = edge.trigger
        if trigger == "dispatch":
            if not self.to_dispatch:
                self.fail(line, "dispatch, but no call is waiting to be dispatched")
            self.to_dispatch = False
        elif trigger == "tool_returned" and not self.in_flight:
            self.fail(line, "tool_returned, but no tool was started")
        elif (
            trigger == "resume"
            and edge.source == "executing"
            and not (self.last is not None and self.last.action == "start_attempt")
        ):
            call = self.call
            if call is not None and call.idempotent and self.to_dispatch:
                # A keyed call's attempt keeps no checkpoint of its own: its intent was
                # begun with the checkpoint taken before dispatch, and a resume that finds
                # that intent pending counts the attempt the dead process was starting
                # (``core/loop.py``), naming its approval as ``dispatch`` would have.
                self.to_dispatch = False
                self.start_attempt(line, e)
            else:
                self.fail(line, "resume in executing, but no attempt was in progress")

    def select(self, index: int) -> None:
        self.index = index
        self.call = self.calls[index]
        self.attempt = 0
        self.claimed = False
        self.to_dispatch = True

    def start_attempt(self, line: int, e: dict[str, Any]) -> None:
        call = self.call
        if call is None:
            return
        if self.attempt >= 1 and call.effect == "write" and not call.dedup:
            self.fail(
                line,
                f"write call {call.id!r} started a second attempt, but {call.name!r} "
                "neither reads nor deduplicates",
            )
        self.attempt += 1
        self.tool_attempts[call.name] = self.tool_attempts.get(call.name, 0) + 1
        if call.effect == "write":
            self.write_attempts += 1
        self.in_flight = True
        if call.idempotent:
            self.claimed = True
        self.check_approval(line, call, e.get("approval"))

    def approval_use(self, line: int, edge: Transition, answer: Any) -> None:
        """The store's answer to spending a use of the call's limited approval: asked
        only for a call about to start, so granted starts it and refused stops the run."""
        call = self.call
        limit = None if call is None else self.settings.approvals.get(call.digest or "")
        if call is None or not call.requires_approval or limit is None:
            self.fail(line, f"approval_use {answer!r}, but the call has no limited approval")
        elif answer == "refused":
            call.needs_approval = True  # its placeholder waits for a reviewer's approval
        elif answer != "granted":
            self.fail(line, f"approval_use is {answer!r}, not 'granted' or 'refused'")
        elif edge.action != "start_attempt":
            self.fail(line, "approval_use 'granted' on a dispatch that starts no attempt")

    def check_approval(self, line: int, call: CallFacts, named: Any) -> None:
        """A write that needs an approval names one covering exactly its arguments."""
        if self.legacy:
            return
        if not call.requires_approval:
            if named is not None:
                self.fail(line, f"call {call.id!r} names approval {named!r}, but needs none")
            return
        if not isinstance(named, str):
            self.fail(line, f"call {call.id!r} of {call.name!r} ran without naming its approval")
            return
        if call.approval is not None and named == call.approval:
            return
        if named == f"review:{call.id}":
            review = self.approved.get(call.id)
            if review is None or review.get("digest") != call.digest:
                self.fail(
                    line,
                    f"call {call.id!r} names a reviewer's approval, but no approve review of "
                    "its exact arguments was recorded",
                )
            call.approval = named
            return
        digest = call.digest or ""
        if named != f"config:{digest[:16]}" or digest not in self.settings.approvals:
            self.fail(
                line,
                f"call {call.id!r} names approval {named!r}, which does not cover its "
                "arguments (no configured approval in the header has their digest)",
            )
            return
        limit = self.settings.approvals[digest]
        if call.approval is None:
            used = self.uses.get(named, 0) + 1
            self.uses[named] = used
            if limit is not None and used > limit:
                self.fail(line, f"approval {named!r} covers {limit} call(s); this is call {used}")
            call.approval = named

    def check_call(self, line: int, edge: Transition, e: dict[str, Any]) -> None:
        """The call, tool and attempt the event names are the run's current ones."""
        call = self.call
        named = e.get("call_id")
        if call is None:
            if named is not None and not self.legacy:
                self.fail(line, f"{edge.trigger} names call {named!r}, but no call is current")
            return
        if named != call.id:
            self.fail(
                line,
                f"{edge.trigger} names call {named!r}; the call the batch is at is {call.id!r}",
            )
        elif e.get("tool") != call.name:
            self.fail(line, f"{edge.trigger} names tool {e.get('tool')!r} for call {call.id!r}")
        elif e.get("attempt") != self.attempt and not self.legacy:
            self.fail(
                line,
                f"{edge.trigger} says attempt {e.get('attempt')!r} of call {call.id!r}; it is "
                f"attempt {self.attempt}",
            )

    # ── answers ───────────────────────────────────────────────────────────────────

    def expect_answer(self, action: str) -> None:
        call = self.call
        if call is None:
            return
        if action == "answer_refusal":
            check: Any = ("refused", call.refusal)
        elif action == "answer_replay":
            check = ("replayed", None)
        elif action == "answer_result":
            check = ("ok", None)
        elif action == "answer_stored":
            check = ("stored", None)
        else:
            check = ("failed", _FAILURE_ERRORS.get(self.outcome, "tool_failed"))
        self.expect.append(Expected("observation", call, check))

    def stop(self, edge: Transition) -> None:
        """The synthetic answers ``stop`` writes (``core/actions.py``): every call of a
        pairable batch not answered yet, in batch order."""
        d = self.decision
        pairable = bool(d.calls) and d.malformed is None and d.missing_id is None
        pairable = pairable and d.duplicate_id is None
        if d is NO_DECISION or not pairable:
            return
        self.accepted = True
        reason = edge.reason or ""
        for c in self.calls:
            if c.id in self.answered:
                continue
            if reason == "cancelled":
                errors: Any = ("cancelled",)
            elif reason == "approval_required" and c.needs_approval is not False:
                errors = (
                    ("approval_required",)
                    if c.needs_approval is True
                    else ("approval_required", "skipped_pending_review")
                )
            elif edge.dest == "review_required":
                if c is self.call and reason != "approval_required":
                    errors = (reason,)
                else:
                    errors = ("skipped_pending_review",)
            else:
                errors = ("not_executed",)
            self.expect.append(Expected("observation", c, ("synthetic", errors)))

    def oversized(self, line: int, e: dict[str, Any], result: dict[str, Any]) -> bool:
        """A result recorded by its size (``oversized``): counted as that many bytes;
        it must be the stand-in, and too large for what one result may keep."""
        size = e.get("oversized")
        if size is None:
            return False
        limit = self.settings.budget.max_output_bytes
        ceiling = MAX_RECORD_BYTES if limit is None else min(limit, MAX_RECORD_BYTES)
        stand_in = {"ok": False, "error": "output_too_large", "bytes": size}
        if not _whole(size) or size <= ceiling or result != stand_in:
            self.fail(line, f"an oversized answer must be {stand_in} over {ceiling} bytes")
        self.output_bytes += size if _whole(size) else 0
        return True

    def observation(self, line: int, e: dict[str, Any], wanted: Expected) -> None:  # noqa: C901 - one check per field an answer carries
        call = wanted.call
        assert call is not None
        call_id = e.get("call_id")
        if call_id != call.id:
            self.fail(
                line,
                f"observation for {call_id!r}; the transition before it answered call {call.id!r}",
            )
            return
        if call_id in self.answered and not self.legacy:
            self.fail(line, f"call {call_id!r} answered a second time")
        result = e.get("result")
        if not isinstance(result, dict):
            self.fail(line, f"the answer to {call_id!r} is not a result object")
            result = {}
        synthetic = e.get("synthetic") is True
        what, detail = wanted.check
        ok = result.get("ok")
        error = result.get("error")
        if what == "synthetic" or what == "denied":
            if not synthetic or ok is not False or error not in detail:
                self.fail(
                    line,
                    f"call {call_id!r} must be answered synthetically with "
                    f"{' or '.join(map(repr, detail))}; the trace says "
                    f"{'synthetic' if synthetic else 'a real result'} {_short(result)}",
                )
            if what == "synthetic" and self.state == "review_required":
                self.placeholders[call_id] = str(error)
            self.answered.add(call_id)
            return
        if synthetic:
            self.fail(line, f"call {call_id!r}: a real result marked synthetic")
        elif self.oversized(line, e, result):
            # Kept by its size only (core/actions.py): what it said is not in the trace.
            self.answered.add(call_id)
            return
        else:
            media = e.get("media_bytes", 0)
            self.output_bytes += result_size(result) + (media if _whole(media) else 0)
        self.answered.add(call_id)
        if what == "refused":
            expected = detail
            if ok is not False or (
                error != expected
                and not (expected is UNSURE and error == "invalid_arguments")
                and not (self.resumed and error in ("unknown_tool", "permission_denied"))
            ):
                self.fail(
                    line,
                    f"call {call_id!r} was refused ({expected}); the answer says {_short(result)}",
                )
        elif what == "failed":
            if ok is not False or error != detail:
                self.fail(
                    line,
                    f"call {call_id!r} failed ({self.outcome}): its answer must be error "
                    f"{detail!r}, not {_short(result)}",
                )
        elif what == "replayed":
            if ok is not True or result.get("replayed") is not True:
                self.fail(line, f"call {call_id!r} was replayed; the answer says {_short(result)}")
            self.note_write(line, call, "replayed", result.get("value"))
        elif what == "reconciled":
            if ok is not True or result.get("reconciled") is not True:
                self.fail(
                    line, f"call {call_id!r} was reconciled; the answer says {_short(result)}"
                )
            self.note_write(line, call, "reconciled", result.get("value"))
        else:  # ok: the tool's (or the stored) result
            if ok is not True or result.get("replayed") or result.get("reconciled"):
                self.fail(
                    line,
                    f"call {call_id!r} returned a result; the answer says {_short(result)}",
                )
            self.executed_write(line, call, "executed" if what == "ok" else "stored")

    def executed_write(self, line: int, call: CallFacts, how: str) -> None:
        if call.effect != "write":
            return
        self.note_write(line, call, how)
        if not call.idempotent:
            return
        first = self.executed.setdefault((call.name, call.args_key), line)
        if first != line:
            self.fail(
                line,
                f"write {call.name!r} executed twice with the same arguments under one "
                f"idempotency key (first at line {first})",
            )

    def note_write(self, line: int, call: CallFacts, how: str, value: Any = None) -> None:
        if self.writes is not None and call.idempotent:
            self.writes.append(Write(line, call.id, call.name, how, args_digest(call), value))

    # ── the end, reviews, resume ──────────────────────────────────────────────────

    def run_end(self, line: int, e: dict[str, Any]) -> None:
        self.ended = line
        if e.get("status") != self.status:
            self.fail(line, f"run_end says status {e.get('status')!r}, the run is in {self.status}")
        elif e.get("reason") != self.stop_reason:
            self.fail(
                line,
                f"run_end says reason {e.get('reason')!r}, the stop edge recorded "
                f"{self.stop_reason!r}",
            )
        if self.legacy:
            return
        if e.get("answer") != self.answer:
            self.fail(line, "run_end's answer is not the answer of the final decision")
        counters = e.get("counters")
        mine = self.counters()
        if counters != mine:
            if not isinstance(counters, dict):
                self.fail(line, "run_end carries no counters")
                return
            wrong = sorted(k for k in set(mine) | set(counters) if counters.get(k) != mine.get(k))
            self.fail(
                line,
                "run_end's counters are not what the events add up to: "
                + ", ".join(
                    f"{k} {_js(counters.get(k))} (events: {_js(mine.get(k))})" for k in wrong
                ),
            )

    def counters(self) -> dict[str, Any]:
        u = self.usage
        return {
            "cost": u.cost,
            "input_tokens": u.input_tokens,
            "model_calls": self.model_calls,
            "output_bytes": self.output_bytes,
            "output_tokens": u.output_tokens,
            "replays": self.replays,
            "retries": self.retries,
            "tokens": u.tokens,
            "tool_attempts": dict(self.tool_attempts),
            "tool_calls": self.tool_calls,
            "tool_rounds": self.tool_rounds,
            "write_attempts": self.write_attempts,
        }

    def review(self, line: int, e: dict[str, Any]) -> None:
        """A reviewer's decision: only while the run waits for review, on a paused call,
        with an action that fits what the call waits for, once."""
        if not self.ended or self.state != "review_required":
            self.fail(
                line,
                f"a review event while the run is in {self.state}"
                + ("" if self.ended else " and has not ended"),
            )
            return
        call_id = e.get("call_id")
        waiting = self.placeholders.get(call_id) if isinstance(call_id, str) else None
        if waiting is None:
            self.fail(line, f"review of {call_id!r}, which is not a paused call of the batch")
            return
        action = e.get("action")
        if action not in FITS or waiting not in FITS[action]:
            self.fail(line, f"review {action!r} of call {call_id!r}, which waits for {waiting}")
            return
        if call_id in self.reviews:
            self.fail(line, f"call {call_id!r} was already reviewed")
            return
        assert isinstance(call_id, str)  # (it names a placeholder)
        call = self.by_id.get(call_id)
        if call is not None and e.get("tool") != call.name:
            self.fail(line, f"review names tool {e.get('tool')!r} for call {call_id!r}")
        if (
            action == "approve"
            and call is not None
            and (call.digest is None or e.get("digest") != call.digest)
        ):
            self.fail(
                line,
                f"the approval of {call_id!r} is bound to digest {e.get('digest')!r}, not "
                "to the digest of the call's exact arguments",
            )
        self.reviews[call_id] = e

    def apply_review(self) -> None:
        """The resume of a paused batch (``core/actions.py``'s ``apply_review``)."""
        blocking = [c for c, err in self.placeholders.items() if err in BLOCKING]
        unsettled = [c for c in blocking if c not in self.reviews]
        if unsettled:
            self.fail(
                self.line,
                f"resumed while {', '.join(map(repr, unsettled))} still wait for a reviewer",
            )
        if self.stop_reason == "approval_required" and self.call is None:
            # (paused at validate: a use refused at dispatch paused a started batch)
            self.tool_rounds += 1
            self.tool_calls += len(self.calls)
        approved = dict(self.approved)
        for c in self.calls:
            if c.id not in self.placeholders:
                continue
            review = self.reviews.get(c.id, {})
            action = review.get("action")
            if action == "deny":
                self.answered.discard(c.id)
                self.expect.append(Expected("observation", c, ("denied", ("denied",))))
            elif action == "reconcile":
                self.answered.discard(c.id)
                self.expect.append(Expected("observation", c, ("reconciled", None)))
            else:
                if action == "approve":
                    approved[c.id] = review
                self.answered.discard(c.id)
        self.approved = approved
        # Admission runs again on resume: a reviewer's approval now covers its call.
        for c in self.calls:
            if c.id in approved and c.needs_approval is not False:
                c.approval = f"review:{c.id}" if approved[c.id].get("digest") == c.digest else None
                c.needs_approval = c.approval is None
        self.placeholders = {}
        self.reviews = {}
        self.index, self.attempt, self.call = -1, 0, None
        self.status = self.stop_reason = None


def _js(value: Any) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _install() -> None:
    from fsm_agent._core.table import TRANSITIONS

    special = {
        ("executing", "dispatch"): _dispatch,
        ("executing", "tool_returned"): _returned,
        ("observing", "observe"): _observe,
    }
    for t in TRANSITIONS:
        key = (t.source, t.trigger)
        if key in special:
            assert _names(*key) == {
                ("executing", "dispatch"): (
                    "call_admitted", "wall_clock_spent", "idempotency_conflict",
                    "idempotency_pending", "idempotent_replay", "approval_refused",
                ),
                ("executing", "tool_returned"): _names(*key),
                ("observing", "observe"): (
                    "output_budget_spent", "batch_has_more_calls", "model_calls_spent",
                    "wall_clock_spent",
                ),
            }[key], f"the table's guards of {key} changed: update trace/walk.py"  # fmt: skip
            _PROVIDERS[key] = special[key]
        elif not _names(*key):
            _PROVIDERS[key] = _no_guards
        else:
            _PROVIDERS[key] = _generic(*key)


_install()


def _whole(value: Any) -> bool:
    """A byte count as the runtime records it: a whole number >= 0."""
    return type(value) is int and value >= 0
