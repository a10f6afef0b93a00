"""A trace walked over the machine: one step per event, and the frame at any step.

Step ``N`` is the event with ``seq`` N (step 0 is the ``run_start`` header, where the run
sits in the initial state). The frame at step N shows the state after that event, the
path so far, how often each edge was taken and the edge taken last. Edges are found with
the same selection the checker uses (:func:`fsm_agent.check.select_edge`), so a replay
and a check never disagree about which edge an event took. A trace of an application's
own machine is replayed over that machine (``Replay(path, machine=...)``): the one
selector over its edges, with the same fallback to the event's destination and reason.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsm_agent.core.select import select_recorded
from fsm_agent.core.table import DEFAULT_MACHINE, INITIAL_STATE, Machine, Transition
from fsm_agent.errors import StepError
from fsm_agent.render.dot import Overlay
from fsm_agent.render.edges import drawing, priority
from fsm_agent.trace.checker import load_trace, select_edge

__all__ = ["Replay", "Step", "StepError", "aggregate_overlay"]


@dataclass(frozen=True)
class Step:
    index: int
    event: dict[str, Any]
    state: str
    transition: Transition | None
    #: The machine the transition is an edge of.
    machine: Machine = field(default=DEFAULT_MACHINE, repr=False, compare=False)

    @property
    def edge_id(self) -> str | None:
        if self.transition is None:
            return None
        return drawing(self.machine).edge_of(self.transition).id


def _edge_in(
    machine: Machine, source: str, trigger: str, dest: Any, reason: Any, guards: Mapping[str, Any]
) -> Transition | None:
    """:func:`select_edge` over another machine's edges."""
    try:
        found = select_recorded(source, trigger, guards, machine=machine)
    except LookupError:
        found = None
    if found is not None and found.dest == dest and found.reason == reason:
        return found
    edges = machine.edges_from(source, trigger)
    return next((t for t in edges if t.dest == dest and t.reason == reason), found)


class Replay:
    """The steps of one trace file (read with :func:`fsm_agent.check.load_trace`), over
    ``machine`` (the one the trace was recorded under; default: the built-in one)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        events: list[dict[str, Any]] | None = None,
        *,
        machine: Machine = DEFAULT_MACHINE,
    ) -> None:
        self.path = str(path)
        self.machine = machine
        self.events = events if events is not None else load_trace(path, machine.hash)
        self.steps: list[Step] = []
        state: str = INITIAL_STATE
        for i, event in enumerate(self.events):
            taken = None
            if event.get("type") == "transition":
                guards = event.get("guards")
                where = (str(event.get("source")), str(event.get("trigger")))
                said = (event.get("dest"), event.get("reason"))
                outcomes = guards if isinstance(guards, dict) else {}
                if machine == DEFAULT_MACHINE:
                    taken = select_edge(*where, *said, outcomes)
                else:
                    taken = _edge_in(machine, *where, *said, outcomes)
                dest = event.get("dest")
                state = dest if isinstance(dest, str) else state
            self.steps.append(Step(i, event, state, taken, machine))

    def __len__(self) -> int:
        return len(self.steps)

    def step(self, n: int) -> Step:
        if not 0 <= n < len(self.steps):
            raise StepError(
                f"step {n} is out of range: {self.path} has {len(self.steps)} "
                f"steps (0-{len(self.steps) - 1})"
            )
        return self.steps[n]

    def overlay(self, n: int | None = None) -> Overlay:
        """The frame after step ``n`` (default: the last step)."""
        n = len(self.steps) - 1 if n is None else n
        current = self.step(n)
        counts: Counter[int] = Counter()
        visited: set[str] = {INITIAL_STATE}
        last: int | None = None
        for step in self.steps[: n + 1]:
            if step.transition is not None:
                last = step.transition.index
                counts[last] += 1
                visited.add(step.state)
        event = current.event
        caption = f"{os.path.basename(self.path)}  step {n} of {len(self.steps) - 1}: "
        caption += describe_event(event)
        return Overlay(
            counts=dict(counts),
            visited=frozenset(visited),
            current=current.state,
            last=last,
            caption=caption,
        )


def describe_event(event: dict[str, Any]) -> str:
    """A one-line summary of an event (frame captions, the stepper's title)."""
    kind = event.get("type")
    if kind == "transition":
        text = f"{event.get('trigger')}: {event.get('source')} -> {event.get('dest')}"
        if event.get("reason"):
            text += f" ({event['reason']})"
        if event.get("call_id"):
            text += f"  call {event['call_id']} {event.get('tool', '')}"
        return text
    if kind == "observation":
        result = event.get("result")
        ok = result.get("ok") if isinstance(result, dict) else None
        return f"observation for {event.get('call_id')}: ok={ok}" + (
            " (synthetic)" if event.get("synthetic") else ""
        )
    if kind == "decision":
        message = event.get("message")
        if isinstance(message, dict):
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):  # a malformed reply, recorded as it came
                return "decision: malformed tool_calls"
            return f"decision: {len(calls)} tool call(s)" if calls else "decision: an answer"
        return "decision: the model failed"
    if kind == "run_end":
        return f"run_end: {event.get('status')}/{event.get('reason')}"
    if kind == "run_start":
        return f"run_start: run {event.get('run_id')}"
    return str(kind)


def describe_step(replay: Replay, n: int, width: int | None = None) -> list[str]:
    """The text the stepper shows for step ``n``: state, edge and guards, payload.

    Lines are wrapped at ``width`` (the terminal's) when given, continuation lines indented
    under their first; printed text keeps them whole (for grep and less).
    """
    step = replay.step(n)
    event = step.event
    lines = [
        f"step {n} of {len(replay) - 1}   line {n + 1}   {describe_event(event)}",
        f"  state:  {step.state}",
    ]
    if event.get("type") == "transition":
        if step.transition is None:
            lines.append("  edge:   (not an edge of this machine: run `fsm-agent check`)")
        else:
            rank, size = priority(step.transition)
            number = f"{rank}. " if size > 1 else ""
            lines.append(f"  edge:   {number}{step.transition.label} -> {step.transition.dest}")
            if step.transition.rule:
                lines.append(f"  rule:   {step.transition.rule}")
        guards = event.get("guards")
        if isinstance(guards, dict) and guards:
            lines.append("  guards: " + ", ".join(f"{k}={_short(v)}" for k, v in guards.items()))
        if event.get("detail"):
            lines.append(f"  detail: {event['detail']}")
    payload = {k: v for k, v in event.items() if k not in ("type", "seq", "guards", "t")}
    if event.get("type") in ("decision", "observation", "run_end", "run_start"):
        text = json.dumps(payload, indent=2, ensure_ascii=False, default=repr)
        lines.append("  payload:")
        lines += ["    " + line for line in text.splitlines()]
    return [part for line in lines for part in _wrap(_printable(line), width)]


def _short(value: Any) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def _printable(line: str) -> str:
    # Terminal control characters in trace content must not reach the terminal raw.
    return "".join(ch if ch.isprintable() else "\N{REPLACEMENT CHARACTER}" for ch in line)


def _wrap(line: str, width: int | None) -> list[str]:
    """``line`` in pieces of at most ``width`` columns, broken at spaces where possible;
    pieces after the first are indented four columns past the line's own indent."""
    if width is None or len(line) <= width:
        return [line]
    indent = " " * min(len(line) - len(line.lstrip(" ")) + 4, max(width // 2, 1))
    pieces: list[str] = []
    rest, room = line, width
    while len(rest) > room:
        cut = rest.rfind(" ", 0, room + 1)
        if cut <= len(indent) if pieces else cut <= 0:
            cut = room  # one long word (a JSON string): break it where the line ends
        pieces.append(rest[:cut].rstrip(" "))
        rest = indent + rest[cut:].lstrip(" ")
        room = width
    pieces.append(rest)
    return pieces


def aggregate_overlay(replays: Iterable[Replay]) -> Overlay:
    """One heat map of edge counts over many traces."""
    counts: Counter[int] = Counter()
    visited: set[str] = {INITIAL_STATE}
    runs = 0
    for replay in replays:
        runs += 1
        for step in replay.steps:
            if step.transition is not None:
                counts[step.transition.index] += 1
                visited.add(step.state)
    return Overlay(
        counts=dict(counts),
        visited=frozenset(visited),
        heat=True,
        caption=f"edge counts over {runs} trace(s)",
    )
