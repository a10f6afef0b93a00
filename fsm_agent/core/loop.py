"""One run: its context, the edge-taking ``fire``, the actions, and the loop.

The loop (:meth:`Run.steps`) is a generator that never does I/O itself: it yields a
request (ask the model, call a tool, sleep) and is sent the answer. ``Runtime.run()``
and ``Runtime.arun()`` are two small drivers of the same generator, so sync and async
runs cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any

from fsm_agent.core.budget import Budget, RetryPolicy
from fsm_agent.core.content import split_media, tool_message
from fsm_agent.core.decision import Decision, PreparedCall, admit_calls, parse_decision
from fsm_agent.core.reasons import stop_detail
from fsm_agent.core.requests import ModelRequest, Request, SleepRequest, ToolOutcome, ToolRequest
from fsm_agent.core.table import MACHINE_HASH, RUN_MACHINE, TERMINAL_STATES, TRANSITIONS, Transition
from fsm_agent.durable.store import IdempotencyRecord, Store
from fsm_agent.tools.registry import ToolRegistry
from fsm_agent.trace.io import Redactor, TraceSink

__all__ = ["SCHEMA", "TRANSITION_LISTENERS", "Counters", "Run"]

#: Trace schema identifier written in every ``run_start`` header.
SCHEMA = "fsm-agent.trace/1"

_EVENTS = RUN_MACHINE.events

#: Functions called with ``(run, transition)`` after every transition of every run in
#: the process (the pytest plugin's transition coverage uses this). Keep them cheap.
TRANSITION_LISTENERS: list[Callable[[Run, Transition], None]] = []
_TERMINAL = frozenset(TERMINAL_STATES)
_EMPTY = Decision()


class Counters:
    """What a run has spent so far; ``as_dict()`` is ``RunResult.counters``."""

    __slots__ = (
        "cost",
        "input_tokens",
        "model_calls",
        "output_bytes",
        "output_tokens",
        "replays",
        "retries",
        "tokens",
        "tool_attempts",
        "tool_calls",
        "tool_rounds",
        "write_attempts",
    )

    def __init__(self) -> None:
        self.model_calls = self.tool_rounds = self.tool_calls = 0
        self.write_attempts = self.replays = self.retries = self.output_bytes = 0
        self.input_tokens = self.output_tokens = self.tokens = 0
        self.cost = 0.0
        self.tool_attempts: dict[str, int] = {}

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["tool_attempts"] = dict(self.tool_attempts)
        return out


def _content(result: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool message text of a result, and a JSON-safe copy of it for the trace."""
    try:
        return json.dumps(result, ensure_ascii=False, allow_nan=False), result
    except (TypeError, ValueError):
        pass
    try:  # objects that are not JSON: their str(), as the model will see them
        text = json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # circular data and the like: keep a readable form
        text = json.dumps({**result, "value": repr(result.get("value"))}, ensure_ascii=False)
    safe: dict[str, Any] = json.loads(text)
    return text, safe


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return repr(value)


class Run:
    """The context one run carries through the machine (a plain class: see ARCHITECTURE)."""

    def __init__(
        self,
        *,
        run_id: str,
        messages: list[dict[str, Any]],
        registry: ToolRegistry,
        allowed: frozenset[str],
        approved: frozenset[str],
        tool_specs: list[dict[str, Any]],
        budget: Budget,
        retry: RetryPolicy,
        policy: str,
        store: Store,
        clock: Callable[[], float],
        sink: TraceSink | None = None,
        redact: Redactor | None = None,
    ) -> None:
        self.state = "deciding"  # the attribute ``transitions`` reads and writes
        self.run_id = run_id
        self.messages = messages
        self.registry, self.allowed, self.approved = registry, allowed, approved
        self.tool_specs = tool_specs
        self.budget, self.retry, self.policy = budget, retry, policy
        self.store, self.clock = store, clock
        self.sink, self.redact = sink, redact
        self.events: list[dict[str, Any]] = []
        self.counters = Counters()
        self.started = self.now = clock()
        self.seq = 0
        self.decision: Decision = _EMPTY
        self.batch_appended = False
        self.index = 0
        self.call: PreparedCall = PreparedCall(-1, "", "", "")
        self.attempt = 0
        self.outcome = ToolOutcome("ok")
        self.in_flight = False
        self.cost_unknown = False
        self.guard_log: dict[str, bool] = {}
        self.taken: Transition = TRANSITIONS[0]
        self.answered: set[str] = set()
        #: call id -> index in ``messages`` of a synthetic result a reviewer may replace.
        self.placeholders: dict[str, int] = {}
        # Durable runs (durable.py): reviewers' decisions per paused call id, indexes of
        # messages replaced in place since the last checkpoint, and the hook that saves
        # a checkpoint after every transition (None: nothing is saved).
        self.reviews: dict[str, dict[str, Any]] = {}
        self.rewritten: list[int] = []
        self.checkpoint: Callable[[Run], None] | None = None
        self.status: str | None = None
        self.reason: str | None = None
        self.detail = ""
        self.answer: str | None = None
        self.model_error = ""

    # ── events ────────────────────────────────────────────────────────────────────

    def emit(self, event: dict[str, Any]) -> None:
        self.seq += 1
        event["seq"] = self.seq
        self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        if self.redact is not None:
            event = self.redact(event)
        self.events.append(event)
        if self.sink is not None:
            self.sink.write(event)

    def start(self, header: dict[str, Any]) -> None:
        self._write(
            {
                "type": "run_start",
                "seq": 0,
                "schema": SCHEMA,
                "run_id": self.run_id,
                "machine_hash": MACHINE_HASH,
                "policy": self.policy,
                "budget": self.budget.to_dict(),
                "retry": self.retry.to_dict(),
                "allowed_tools": sorted(self.allowed),
                **header,
                "messages": list(self.messages),
            }
        )

    def fire(self, trigger: str) -> None:
        """Take the first edge of ``trigger`` whose guards hold, record it, run its action."""
        source = self.state
        self.guard_log = {}
        _EVENTS[trigger].trigger(self)
        t = self.taken
        for listener in TRANSITION_LISTENERS:
            listener(self, t)
        event: dict[str, Any] = {
            "type": "transition",
            "trigger": trigger,
            "source": source,
            "dest": self.state,
            "guards": self.guard_log,
            "t": round(self.now - self.started, 6),
        }
        payloads: list[dict[str, Any]] = []
        if t.action is not None:
            getattr(self, t.action)(payloads)
        if self.call.index >= 0:
            event["call_id"], event["tool"] = self.call.id, self.call.name
            event["attempt"] = self.attempt
        if t.reason is not None:
            event["reason"] = t.reason
        if t.reason is not None:
            event["detail"] = self.detail
        self.emit(event)
        for payload in payloads:
            self.emit(payload)
        if self.state in _TERMINAL:
            self.emit(
                {
                    "type": "run_end",
                    "status": self.status,
                    "reason": self.reason,
                    "detail": self.detail,
                    "answer": self.answer,
                    "counters": self.counters.as_dict(),
                }
            )
        if self.checkpoint is not None:
            self.checkpoint(self)

    # ── the loop ──────────────────────────────────────────────────────────────────

    def steps(self) -> Generator[Request, Any, None]:  # noqa: C901 - one branch per working state
        """Drive the run to a terminal state, yielding every I/O request to the driver."""
        while self.state not in _TERMINAL:
            state = self.state
            if state == "deciding":
                reply = yield ModelRequest(list(self.messages), self.tool_specs)
                self.now = self.clock()
                self.counters.model_calls += 1
                if isinstance(reply, BaseException):
                    self.model_error = f"{type(reply).__name__}: {reply}"
                    self.emit({"type": "decision", "error": self.model_error})
                    self.fire("model_failed")
                    continue
                self._take_reply(reply)
                self.fire("model_replied")
            elif state == "validating":
                if self.decision.malformed is None and self.decision.missing_id is None:
                    admit_calls(self.decision, self.registry, self.allowed, self.approved)
                self.fire("validate")
            elif state == "executing":
                call = self.call
                if call.idempotency_key is not None:
                    call.record = self.store.get_idempotency(call.name, call.idempotency_key)
                self.now = self.clock()
                self.fire("dispatch")
                if self.state != "executing":
                    continue
                tool = call.tool
                assert tool is not None  # admitted calls have a tool
                if call.idempotency_key is not None:
                    self.store.begin_idempotency(
                        IdempotencyRecord(
                            call.name,
                            call.idempotency_key,
                            call.args_digest,
                            "pending",
                            self.run_id,
                            call.id,
                        )
                    )
                self.in_flight = True
                self.outcome = yield ToolRequest(call, self._timeout(tool.timeout_s))
                self.in_flight = False
                self.now = self.clock()
                if call.idempotency_key is not None:
                    if self.outcome.kind == "ok":
                        self.store.commit_idempotency(
                            call.name, call.idempotency_key, _json_safe(self.outcome.value)
                        )
                    elif self.outcome.kind == "rejected":
                        self.store.abort_idempotency(call.name, call.idempotency_key)
                self.fire("tool_returned")
            elif state == "retry_wait":
                yield SleepRequest(self.retry.backoff(self.attempt))
                self.now = self.clock()
                self.fire("retry")
            else:  # observing
                self.now = self.clock()
                self.fire("observe")

    def cancel(self) -> None:
        """The driver was interrupted (task cancelled, Ctrl-C): end the run in a defined
        state with every open call answered. No-op once the run is over."""
        if self.state not in _TERMINAL:
            self.now = self.clock()
            self.fire("cancel")

    def _take_reply(self, reply: Any) -> None:
        usage = reply.get("usage") if isinstance(reply, dict) else None
        self.emit({"type": "decision", "message": _json_safe(reply)})
        if isinstance(usage, dict):
            self._count_usage(usage)
        self.decision = parse_decision(reply)
        self.batch_appended = False
        # Ids need only be unique within a batch: a new batch may reuse an earlier one's ids.
        self.answered = set()

    def _count_usage(self, usage: dict[str, Any]) -> None:
        def whole(*names: str) -> int:
            for name in names:
                value = usage.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    return value
            return 0

        c = self.counters
        inp = whole("input_tokens", "prompt_tokens")
        out = whole("output_tokens", "completion_tokens")
        c.input_tokens += inp
        c.output_tokens += out
        c.tokens += whole("total_tokens") or inp + out
        if "cost" in usage:
            cost = usage["cost"]
            if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0:
                c.cost += float(cost)
            else:  # a reply that could not be priced is never counted as free
                self.cost_unknown = True

    def _timeout(self, tool_timeout: float | None) -> float | None:
        limit = self.budget.max_wall_clock_s
        if limit is None:
            return tool_timeout
        left = max(limit - (self.now - self.started), 0.0)
        return left if tool_timeout is None else min(tool_timeout, left)

    def next_backoff(self) -> float:
        return self.retry.backoff(self.attempt)

    # ── actions (named by the table; each may add payload events) ─────────────────

    def start_batch(self, payloads: list[dict[str, Any]]) -> None:
        self._append_batch()
        self.counters.tool_rounds += 1
        self.counters.tool_calls += len(self.decision.calls)
        self._select(0)

    def next_call(self, payloads: list[dict[str, Any]]) -> None:
        index = self.index + 1
        while self.decision.calls[index].id in self.answered:  # settled by a reviewer
            index += 1
        self._select(index)

    def end_batch(self, payloads: list[dict[str, Any]]) -> None:
        self.decision = _EMPTY
        self.call = PreparedCall(-1, "", "", "")

    def start_attempt(self, payloads: list[dict[str, Any]]) -> None:
        self.attempt += 1
        c = self.counters
        c.tool_attempts[self.call.name] = c.tool_attempts.get(self.call.name, 0) + 1
        if self.call.effect == "write":
            c.write_attempts += 1

    def schedule_retry(self, payloads: list[dict[str, Any]]) -> None:
        self.counters.retries += 1

    def answer_refusal(self, payloads: list[dict[str, Any]]) -> None:
        call = self.call
        self._answer(payloads, {"ok": False, "error": call.refusal, "detail": call.refusal_detail})

    def answer_replay(self, payloads: list[dict[str, Any]]) -> None:
        record = self.call.record
        assert record is not None
        self.counters.replays += 1
        if self.call.effect == "write":
            self.counters.write_attempts += 1
        self._answer(payloads, {"ok": True, "value": record.result, "replayed": True})

    def answer_result(self, payloads: list[dict[str, Any]]) -> None:
        self._answer(payloads, {"ok": True, "value": self.outcome.value})

    def answer_failure(self, payloads: list[dict[str, Any]]) -> None:
        kind = self.outcome.kind
        error = {"rejected": "rejected", "timeout": "timeout"}.get(kind, "tool_failed")
        self._answer(
            payloads,
            {"ok": False, "error": error, "detail": self.outcome.error, "attempts": self.attempt},
        )

    def finish(self, payloads: list[dict[str, Any]]) -> None:
        self.messages.append(self.decision.message)
        self.answer = self.decision.answer
        self._set_stop()

    def stop(self, payloads: list[dict[str, Any]]) -> None:
        """Enter a terminal state, answering every unanswered call so history stays valid."""
        self._set_stop()
        d = self.decision
        pairable = (
            d.calls and d.malformed is None and d.missing_id is None and (d.duplicate_id is None)
        )
        if d is _EMPTY or not pairable:
            if d is not _EMPTY and not d.calls and d.malformed is None:
                self.messages.append(d.message)  # a text reply stopped by a budget is kept
            return
        self._append_batch()
        reason = self.reason
        review = self.state == "review_required"
        for call in d.calls:
            if call.id in self.answered:
                continue
            if reason == "cancelled":
                error, detail = "cancelled", "the run was cancelled before this call ran"
            elif reason == "approval_required" and call.needs_approval:
                error, detail = "approval_required", "no approval matches these exact arguments"
            elif review and call is self.call and reason != "approval_required":
                error, detail = reason or "", stop_detail(self)
            elif review:
                error, detail = "skipped_pending_review", f"the run stopped for review: {reason}"
            else:
                error, detail = "not_executed", f"the run stopped: {self.status}/{reason}"
            at = self._answer(
                payloads, {"ok": False, "error": error, "detail": detail}, call=call, synthetic=True
            )
            if review:
                self.placeholders[call.id] = at

    def answer_stored(self, payloads: list[dict[str, Any]]) -> None:
        """The result a write stored (idempotency record) before the process died."""
        record = self.call.record
        assert record is not None
        self._answer(payloads, {"ok": True, "value": record.result})

    def apply_review(self, payloads: list[dict[str, Any]]) -> None:
        """Settle the paused batch with the reviewers' decisions (recorded by durable.py):
        a denied call is answered as denied, a reconciled one with the observed result;
        approved and skipped calls keep their placeholder until they run afresh."""
        if self.reason == "approval_required":  # the pause came before the batch started
            self.counters.tool_rounds += 1
            self.counters.tool_calls += len(self.decision.calls)
        for call in self.decision.calls:
            if call.id not in self.placeholders:
                continue
            review = self.reviews.get(call.id, {})
            action = review.get("action")
            if action == "deny":
                self._answer(
                    payloads,
                    {
                        "ok": False,
                        "error": "denied",
                        "detail": review.get("reason") or "denied by review",
                    },
                    call=call,
                    synthetic=True,
                )
            elif action == "reconcile":
                self._answer(
                    payloads,
                    {"ok": True, "value": review.get("result"), "reconciled": True},
                    call=call,
                )
            else:
                self.answered.discard(call.id)
        self.reviews = {}
        self.index, self.attempt = -1, 0  # next_call picks the first call still to run
        self.call = PreparedCall(-1, "", "", "")
        self.status = self.reason = None
        self.detail = ""

    # ── helpers ───────────────────────────────────────────────────────────────────

    def _select(self, index: int) -> None:
        self.index = index
        self.call = self.decision.calls[index]
        self.attempt = 0

    def _append_batch(self) -> None:
        if not self.batch_appended:
            self.messages.append(self.decision.message)
            self.batch_appended = True

    def _answer(
        self,
        payloads: list[dict[str, Any]],
        result: dict[str, Any],
        *,
        call: PreparedCall | None = None,
        synthetic: bool = False,
    ) -> int:
        call = call or self.call
        value, media = split_media(result)
        content, safe = _content(value)
        message = tool_message(call.id, content, media)
        at = self.placeholders.pop(call.id, None)
        if at is None:
            at = len(self.messages)
            self.messages.append(message)
        else:  # a reviewed batch: the real answer takes the placeholder's place
            self.messages[at] = message
            self.rewritten.append(at)
        self.answered.add(call.id)
        if not synthetic:
            self.counters.output_bytes += len(content.encode("utf-8"))
        payloads.append(
            {
                "type": "observation",
                "call_id": call.id,
                "tool": call.name,
                "result": safe,
                "synthetic": synthetic,
            }
        )
        return at

    def _set_stop(self) -> None:
        self.status, self.reason = self.state, self.taken.reason
        self.detail = stop_detail(self)


def _check_actions() -> None:
    missing = [
        t.action for t in TRANSITIONS if t.action and not callable(getattr(Run, t.action, None))
    ]
    if missing:
        raise RuntimeError(f"run machine table names unknown actions: {missing}")


_check_actions()
