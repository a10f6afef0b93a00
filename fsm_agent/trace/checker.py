"""Conformance of recorded traces to the run machine (``fsm-agent check``).

A trace conforms when every ``transition`` event is the edge the table picks from the
state the previous event left (its guard outcomes select that edge, its destination and
reason agree), ``seq`` is contiguous, and the invariants hold:

* every tool call of an accepted batch is answered exactly once (by id), and nothing
  answers a call that was never made;
* no write tool with an idempotency key executes successfully twice with the same
  canonical arguments (a replay is answered ``replayed`` without a tool attempt);
* nothing happens after a terminal state except its synthetic answers and ``run_end``,
  unless the table has an edge out of that state (``resume``) and that edge comes next
  (after the ``review`` events of a run paused for review, each on a paused call).

Everything about edges is read from :data:`fsm_agent.machine.TRANSITIONS`. A trace that
cannot be read at all (empty, truncated, not JSON, another schema, another machine hash)
raises :class:`~fsm_agent.errors.TraceError` instead of producing violations.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fsm_agent.core.canonical import canonical_json
from fsm_agent.core.decision import parse_decision
from fsm_agent.core.loop import SCHEMA
from fsm_agent.core.select import GuardNotRecorded, select_recorded
from fsm_agent.core.table import (
    INITIAL_STATE,
    LEGACY_MACHINE_HASHES,
    MACHINE_HASH,
    TERMINAL_STATES,
    Transition,
    edges_from,
)
from fsm_agent.errors import TraceError
from fsm_agent.trace.io import iter_trace

__all__ = [
    "LEGACY_SCHEMA",
    "SCHEMAS",
    "Violation",
    "check_events",
    "check_file",
    "load_trace",
    "select_edge",
]

#: The 0.1 trace format: no integrity data, guards recorded positive-first.
LEGACY_SCHEMA = "fsm-agent.trace/1"

_TERMINAL = frozenset(TERMINAL_STATES)
# Answer states of one call of the current batch.
_OPEN, _ANSWERED, _PLACEHOLDER = 0, 1, 2


@dataclass(frozen=True)
class Violation:
    """One broken rule, at the 1-based line of the trace file where it shows."""

    line: int
    message: str

    def format(self, path: str) -> str:
        return f"{path}:{self.line}: {self.message}"


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a trace and check its header, or raise :class:`TraceError` naming file and line.

    The common case (a well-formed file) is parsed in one ``json.loads`` of the whole
    file, which is several times faster than a call per line; any problem falls back to
    :func:`~fsm_agent.trace.iter_trace`, whose per-line reading names the bad line.
    """
    name = str(path)
    # Parsing allocates millions of small dicts and strings and no cycles; the cyclic
    # collector would rescan them over and over (measured: it triples the parse time).
    with _no_cyclic_gc():
        events = _parse_whole(path)
    if events is None:
        events = list(iter_trace(path))
    _check_header(name, events)
    return events


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _parse_whole(path: str | os.PathLike[str]) -> list[dict[str, Any]] | None:
    events: list[dict[str, Any]] | None = None
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        if text.endswith("\n") and "\n\n" not in text and not text.startswith("\n"):
            parsed = json.loads("[" + text[:-1].replace("\n", ",") + "]")
            if all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in parsed):
                events = parsed
    except (OSError, ValueError, RecursionError):
        events = None  # the line-by-line reader reports it precisely
    return events


#: The trace format this fsm-agent writes, and the older one it still reads.
SCHEMAS = (SCHEMA, LEGACY_SCHEMA)


def _check_header(name: str, events: list[dict[str, Any]]) -> None:
    if not events:
        raise TraceError(name, 1, "empty trace: no run_start header")
    head = events[0]
    if head.get("type") != "run_start":
        raise TraceError(name, 1, f"the first event is {head.get('type')!r}, not run_start")
    schema = head.get("schema")
    if schema not in SCHEMAS:
        raise TraceError(
            name,
            1,
            f"schema {schema!r} is not one this fsm-agent reads "
            f"({', '.join(SCHEMAS)}); written by another version",
        )
    hashes = {MACHINE_HASH} | (set(LEGACY_MACHINE_HASHES) if schema == LEGACY_SCHEMA else set())
    if head.get("machine_hash") not in hashes:
        raise TraceError(
            name,
            1,
            f"machine hash {head.get('machine_hash')!r} is not this "
            f"machine's {MACHINE_HASH} (the trace was recorded with "
            "another transition table)",
        )


def select_edge(
    source: str,
    trigger: str,
    dest: Any,
    reason: Any,
    guards: Mapping[str, Any],
    *,
    legacy: bool = False,
) -> Transition | None:
    """The edge of ``trigger`` in ``source`` that a transition event took, or None: the
    one selector (``core/select.py``) over the recorded outcomes. A trace whose events
    record no outcomes at all (redacted) cannot say which edge was taken: the first edge
    with the event's destination and reason stands for it. Raises
    :class:`~fsm_agent.core.select.GuardNotRecorded` when an outcome the choice needs is
    missing."""
    if not guards:
        for t in edges_from(source, trigger):
            if t.dest == dest and t.reason == reason:
                return t
    return select_recorded(source, trigger, guards, legacy=legacy)


class _Checker:
    """Walks one trace's events, collecting violations (see the module docstring)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.out: list[Violation] = []
        self.legacy = bool(events) and events[0].get("schema") == LEGACY_SCHEMA
        tools = events[0].get("tools") if events else None
        self.tools: Mapping[str, Any] = tools if isinstance(tools, Mapping) else {}
        self.state: str = INITIAL_STATE
        self.decided = False  # a decision event since the last edge out of the initial state
        self.batch: dict[str, int] = {}
        self.batch_line = 0
        self.args: dict[str, tuple[str, str]] = {}  # call id -> (tool, raw arguments)
        self.attempted: set[str] = set()
        self.executed: dict[tuple[str, str], int] = {}
        self.ended_line = 0  # line of the run_end that closed the run, 0 while it runs
        self.stop_reason: Any = None
        self.prev_type = "run_start"

    def fail(self, line: int, message: str) -> None:
        self.out.append(Violation(line, message))

    def run(self) -> list[Violation]:
        handlers = {
            "decision": self.decision,
            "transition": self.transition,
            "observation": self.observation,
            "run_end": self.run_end,
            "review": self.review,
        }
        expected = 1
        for line, event in enumerate(self.events[1:], 2):
            seq = event.get("seq")
            if seq != expected:
                self.fail(
                    line,
                    f"seq is {seq!r}, expected {expected} (events missing, "
                    "duplicated or reordered)",
                )
            expected = seq + 1 if isinstance(seq, int) else expected + 1
            kind = event["type"]
            if self.ended_line and kind not in ("transition", "review"):
                self.fail(
                    line,
                    f"{kind} event after the run ended in {self.state} "
                    f"(run_end at line {self.ended_line})",
                )
            handler = handlers.get(kind)
            if handler is None:
                if kind == "run_start":
                    self.fail(line, "a second run_start: one trace file holds one run")
                else:
                    self.fail(line, f"unknown event type {kind!r}")
            else:
                handler(line, event)
            self.prev_type = kind
        if not self.ended_line:
            self.fail(len(self.events), f"the trace ends in state {self.state} without run_end")
        return self.out

    # ── events ────────────────────────────────────────────────────────────────────

    def decision(self, line: int, event: dict[str, Any]) -> None:
        if self.state != INITIAL_STATE or self.decided:
            self.fail(
                line,
                f"a decision while the run is in {self.state}"
                + (" and the previous decision was not acted on" if self.decided else ""),
            )
        self.decided = True
        self.close_batch(line)
        message = event.get("message")
        if message is None:
            return  # the model raised: no batch
        d = parse_decision(message)
        if not d.calls or d.malformed or d.missing_id or d.duplicate_id:
            return  # refused whole: nothing of it enters the history, nothing is answered
        self.batch = {c.id: _OPEN for c in d.calls}
        self.batch_line = line
        self.args = {c.id: (c.name, c.raw_arguments) for c in d.calls}
        self.attempted = set()

    def transition(self, line: int, event: dict[str, Any]) -> None:  # noqa: C901 - the hot path of a check, kept in one pass
        # The hot path of a check (most events are transitions): one pass, few lookups.
        get = event.get
        source, trigger, dest, reason = get("source"), get("trigger"), get("dest"), get("reason")
        guards = get("guards")
        if guards is None:
            guards = {}
        elif not isinstance(guards, dict):
            self.fail(line, "guards is not an object of guard outcomes")
            guards = {}
        state = self.state
        if source != state:
            self.fail(line, f"{trigger} fired in {source!r}, but the run was in {state}")
        if not (isinstance(source, str) and isinstance(trigger, str) and isinstance(dest, str)):
            self.fail(line, "a transition without a source, trigger or dest")
            return
        if self.ended_line and not edges_from(source, trigger):
            self.fail(
                line,
                f"{trigger} after the run ended in {state} (run_end at line "
                f"{self.ended_line}); the table has no such edge out of it",
            )
        try:
            edge = select_edge(source, trigger, dest, reason, guards, legacy=self.legacy)
        except GuardNotRecorded as exc:
            self.fail(line, f"{trigger} in {source}: {exc}")
            edge = next(
                (t for t in edges_from(source, trigger) if t.dest == dest and t.reason == reason),
                None,
            )
        if edge is None or edge.dest != dest or edge.reason != reason:
            self.wrong_edge(line, edge, event, guards)
        if source == INITIAL_STATE:
            # (Not every edge out of it needs a decision first: ``cancel`` fires anywhere.)
            self.decided = False
        call_id = get("call_id")
        if call_id is not None:
            if call_id not in self.batch:
                self.fail(
                    line,
                    f"{trigger} for call {call_id!r}, which is not a call of the current batch",
                )
            elif edge is not None and edge.action == "start_attempt":
                if call_id in self.attempted and self.once(get("tool")):
                    self.fail(
                        line,
                        f"write call {call_id!r} started a second attempt, but "
                        f"{get('tool')!r} neither reads nor deduplicates",
                    )
                self.attempted.add(call_id)
            elif edge is not None and edge.action == "answer_stored":
                # Resumed: the store holds this call's committed result, so it ran (its
                # attempt's transition died with the process that took it).
                self.attempted.add(call_id)
        self.state = dest
        if dest in _TERMINAL:
            self.stop_reason = reason
        if state in _TERMINAL:  # resumed: placeholder answers may now be replaced
            self.ended_line = 0
            self.batch = {k: _OPEN if v == _PLACEHOLDER else v for k, v in self.batch.items()}

    def wrong_edge(
        self, line: int, edge: Transition | None, event: dict[str, Any], guards: dict[str, Any]
    ) -> None:
        source, trigger = event["source"], event["trigger"]
        dest, reason = event["dest"], event.get("reason")
        if edge is None:
            if edges_from(source, trigger):
                self.fail(
                    line,
                    f"no {trigger!r} edge out of {source} has its guards satisfied by {guards}",
                )
            elif not self.ended_line:
                self.fail(line, f"the table has no {trigger!r} edge out of {source}")
        elif edge.dest != dest:
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

    def review(self, line: int, event: dict[str, Any]) -> None:
        """A reviewer's decision (durable runs): only while the run waits for review, and
        only on a call of the paused batch that holds a placeholder answer."""
        if not self.ended_line or self.state != "review_required":
            self.fail(
                line,
                f"a review event while the run is in {self.state}"
                + ("" if self.ended_line else " and has not ended"),
            )
            return
        call_id = event.get("call_id")
        if not isinstance(call_id, str) or self.batch.get(call_id) != _PLACEHOLDER:
            self.fail(line, f"review of {call_id!r}, which is not a paused call of the batch")

    def once(self, tool: Any) -> bool:
        """Whether a call of ``tool`` may run at most once (a write without dedup)."""
        spec = self.tools.get(tool) if isinstance(tool, str) else None
        return isinstance(spec, Mapping) and spec.get("effect") == "write" and not spec.get("dedup")

    def observation(self, line: int, event: dict[str, Any]) -> None:
        if self.prev_type not in ("transition", "observation"):
            self.fail(
                line,
                f"an observation right after a {self.prev_type} event; results "
                "follow the transition that produced them",
            )
        call_id = event.get("call_id")
        status = self.batch.get(call_id) if isinstance(call_id, str) else None
        if status is None or not isinstance(call_id, str):
            self.fail(
                line,
                f"observation for {call_id!r}, which is not a call of the current "
                "batch (an orphan result)",
            )
            return
        if status in (_ANSWERED, _PLACEHOLDER):
            self.fail(line, f"call {call_id!r} answered a second time")
            return
        synthetic = bool(event.get("synthetic"))
        placeholder = synthetic and self.state == "review_required"
        self.batch[call_id] = _PLACEHOLDER if placeholder else _ANSWERED
        result = event.get("result")
        if synthetic or not isinstance(result, dict) or result.get("ok") is not True:
            return
        if result.get("reconciled"):  # a reviewer's observed fact, not a tool's result
            return
        if result.get("replayed"):
            if call_id in self.attempted:
                self.fail(line, f"call {call_id!r} is answered as a replay, but its tool ran")
            return
        if call_id not in self.attempted:
            self.fail(line, f"call {call_id!r} has a successful result but no attempt to run it")
        self.check_write(line, call_id)

    def check_write(self, line: int, call_id: str) -> None:
        name, raw = self.args[call_id]
        spec = self.tools.get(name)
        if (
            not isinstance(spec, Mapping)
            or spec.get("effect") != "write"
            or not spec.get("idempotent")
        ):
            return
        try:
            arguments = canonical_json(json.loads(raw))
        except (ValueError, RecursionError):
            arguments = raw
        first = self.executed.setdefault((name, arguments), line)
        if first != line:
            self.fail(
                line,
                f"write {name!r} executed twice with the same arguments under one "
                f"idempotency key (first at line {first})",
            )

    def run_end(self, line: int, event: dict[str, Any]) -> None:
        if self.state not in _TERMINAL:
            self.fail(line, f"run_end while the run is in working state {self.state}")
        elif event.get("status") != self.state:
            self.fail(
                line, f"run_end says status {event.get('status')!r}, the run is in {self.state}"
            )
        elif event.get("reason") != self.stop_reason:
            self.fail(
                line,
                f"run_end says reason {event.get('reason')!r}, the stop edge "
                f"recorded {self.stop_reason!r}",
            )
        self.close_batch(line)
        self.ended_line = line

    def close_batch(self, line: int) -> None:
        """Every call of the batch must be answered before the model is asked again or the
        run ends."""
        missing = [call_id for call_id, status in self.batch.items() if status == _OPEN]
        if missing:
            self.fail(
                line,
                f"calls {', '.join(map(repr, missing))} of the batch at line "
                f"{self.batch_line} were never answered",
            )
            for call_id in missing:
                self.batch[call_id] = _ANSWERED


def check_events(events: list[dict[str, Any]]) -> list[Violation]:
    """Violations in an already loaded trace (``events[0]`` is its ``run_start``)."""
    with _no_cyclic_gc():  # the walk allocates little, but a full collection of a large
        return _Checker(events).run()  # trace's objects costs more than the walk


def check_file(path: str | os.PathLike[str]) -> list[Violation]:
    """Violations in the trace at ``path``; :class:`TraceError` if it cannot be read."""
    return check_events(load_trace(path))


def check_paths(paths: Iterable[str]) -> dict[str, list[Violation] | TraceError]:
    """Check several traces, keeping going past unreadable ones."""
    out: dict[str, list[Violation] | TraceError] = {}
    for path in paths:
        try:
            out[path] = check_file(path)
        except TraceError as exc:
            out[path] = exc
    return out
