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

import contextlib
import glob
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsm_agent._core.select import select_recorded
from fsm_agent._core.table import DEFAULT_MACHINE, INITIAL_STATE, Machine, Transition
from fsm_agent._errors import ConfigError, StepError
from fsm_agent._render.dot import Overlay
from fsm_agent._render.edges import drawing, priority
from fsm_agent._trace.checker import load_trace, select_edge
from fsm_agent._trace.replay import recorded_rules

__all__ = ["MAX_TRACE_BYTES", "Replay", "Step", "StepError", "aggregate_overlay"]


#: Failed attempts listed per call (a run makes at most ``max_attempts`` of them).
_MAX_FAILURES_SHOWN = 20


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


#: The largest trace file a replay loads by default. A replay holds every event in memory
#: (measured: about 6 times the file's size, 14 times while writing the HTML page, which
#: is about twice the file and takes ~0.9 s per MB): a 1 GB trace would take ~14 GB and
#: ~15 minutes for a page no browser opens. ``fsm-agent check`` reads any size in
#: constant memory.
MAX_TRACE_BYTES = 32 * 1024 * 1024


class Replay:
    """The steps of one trace file (read with :func:`fsm_agent.check.load_trace`), over
    ``machine`` (the one the trace was recorded under; default: the built-in one).

    A file larger than ``max_bytes`` (default :data:`MAX_TRACE_BYTES`; ``None``: no
    limit) is refused with a :class:`StepError` before anything is read."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        events: list[dict[str, Any]] | None = None,
        *,
        machine: Machine = DEFAULT_MACHINE,
        max_bytes: int | None = MAX_TRACE_BYTES,
    ) -> None:
        self.path = str(path)
        self.machine = machine
        if events is None:
            _refuse_large(self.path, max_bytes)
        self.events = events if events is not None else load_trace(path, machine.hash)
        head = self.events[0] if self.events else {}
        if machine == DEFAULT_MACHINE and head.get("rules") is not None:
            # A run with the application's rules: drawn over the machine its header's
            # rules build (the one check replays), rule rows included.
            # (One it cannot rebuild, load_trace refused already.)
            with contextlib.suppress(ConfigError, ValueError, TypeError, KeyError):
                machine = self.machine = recorded_rules(head)[1]
        self.steps: list[Step] = []
        # Per step, the failed attempts so far of the call it concerns (computed once:
        # the viewer asks for every step of traces of any length).
        self._failed: list[tuple[dict[str, Any], ...]] = []
        failed: dict[Any, tuple[dict[str, Any], ...]] = {}
        state: str = INITIAL_STATE
        for i, event in enumerate(self.events):
            call_id = event.get("call_id")
            if event.get("type") == "decision":
                failed = {}  # call ids are unique only within a batch
            elif (
                event.get("trigger") == "tool_returned"
                and event.get("outcome") not in (None, "ok")
                and isinstance(call_id, str)
            ):
                attempt = {k: event.get(k) for k in ("attempt", "outcome", "error")}
                kept = failed.get(call_id, ())
                # A run makes at most max_attempts; a hostile trace may claim any number.
                if len(kept) < _MAX_FAILURES_SHOWN:
                    failed[call_id] = (*kept, attempt)
            self._failed.append(failed.get(call_id, ()) if isinstance(call_id, str) else ())
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

    def failed_attempts(self, n: int) -> list[dict[str, Any]]:
        """The failed attempts, up to step ``n``, of the call step ``n`` concerns (a
        ``tool_returned``, a retry, an observation): each ``attempt``, ``outcome`` and
        ``error``, so a retry or a failure shows why without opening the raw JSON."""
        self.step(n)  # the range check
        return list(self._failed[n])

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


def _refuse_large(path: str, max_bytes: int | None) -> None:
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # load_trace says why it cannot be read
    if max_bytes is not None and size > max_bytes:
        raise StepError(
            f"{path} is {_mib(size)}: replay holds a whole trace in memory (up to about 15 "
            f"times its size) and stops at {_mib(max_bytes)}. Check it with `fsm-agent check` "
            "(any size, constant memory), or raise the limit with --max-trace-bytes"
        )


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB ({size} bytes)"


def describe_event(event: dict[str, Any]) -> str:
    """A one-line summary of an event (frame captions, the stepper's title)."""
    kind = event.get("type")
    if kind == "transition":
        return _transition_text(event)
    if kind == "rule":
        text = f"rule {event.get('rule') or '(none held)'} [{event.get('phase')}]: "
        text += str(event.get("verdict"))
        return text + (f"  call {event['call_id']}" if event.get("call_id") else "")
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


def _transition_text(event: dict[str, Any]) -> str:
    text = f"{event.get('trigger')}: {event.get('source')} -> {event.get('dest')}"
    if event.get("reason"):
        text += f" ({event['reason']})"
    if event.get("call_id"):
        text += f"  call {event['call_id']} {event.get('tool', '')}"
    if event.get("outcome") not in (None, "ok"):
        text += f"  attempt {event.get('attempt')} {_failure(event)}"
    guards = event.get("guards")
    if isinstance(guards, dict):
        decided = [g[5:] for g, held in guards.items() if g.startswith("rule:") and held is True]
        if decided:  # an application's rule row: the rule that decided it
            text += f"  decided by rule {', '.join(decided)}"
    return text


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
        if event.get("outcome") is not None:
            lines.append(f"  outcome: {_failure(event)}")
        if event.get("detail"):
            lines.append(f"  detail: {event['detail']}")
    failed = replay.failed_attempts(n)
    if failed and not (len(failed) == 1 and event.get("outcome") not in (None, "ok")):
        lines.append(f"  failed attempts of {event.get('call_id')}:")
        lines += [f"    #{f['attempt']} {_failure(f)}" for f in failed]
    if n == len(replay) - 1 and event.get("type") == "run_end":
        lines += [f"  next:   {line}" for line in where_the_rest_is(replay)]
    if event.get("type") == "decision":
        lines += _streamed_lines(event.get("message"))
    payload = {k: v for k, v in event.items() if k not in ("type", "seq", "guards", "t")}
    if event.get("type") in ("decision", "observation", "run_end", "run_start"):
        text = json.dumps(payload, indent=2, ensure_ascii=False, default=repr)
        lines.append("  payload:")
        lines += ["    " + line for line in text.splitlines()]
    return [part for line in lines for part in _wrap(_printable(line), width)]


def _streamed_lines(message: Any) -> list[str]:
    """A streamed reply as it was produced: per block its counts and, when the trace kept
    them (``trace_deltas=True``), its deltas in order, ``|`` between them."""
    streamed = message.get("streamed") if isinstance(message, dict) else None
    if not isinstance(streamed, list) or not streamed:
        return []
    lines = ["  streamed:"]
    for b in streamed:
        if not isinstance(b, dict):
            continue
        call = f" ({b['call_id']})" if b.get("call_id") else ""
        head = f"    {b.get('kind')} #{b.get('index')}{call}: {b.get('deltas')} deltas"
        pieces = b.get("pieces")
        if isinstance(pieces, list):
            shown = " | ".join(json.dumps(p, ensure_ascii=False) for p in pieces)
            lines.append(f"{head}: {shown}")
        else:
            lines.append(head + f", {b.get('chars')} chars (coalesced)")
    return lines


def _failure(attempt: dict[str, Any]) -> str:
    """``transient: TransientToolError: CRM returned 503`` (an outcome and its error)."""
    error = attempt.get("error")
    return f"{attempt.get('outcome')}: {error}" if error else str(attempt.get("outcome"))


def where_the_rest_is(replay: Replay) -> list[str]:
    """For a trace that ends paused for review: where the run went on, if it was resumed
    (a ``trace_dir`` file is continued; a trace path given to ``run()`` is not)."""
    end = replay.events[-1] if replay.events else {}
    if end.get("status") != "review_required":
        return []
    path = Path(replay.path)
    run_id = str(replay.events[0].get("run_id", "RUN"))
    numbered = {
        int(p.stem.rsplit(".", 1)[1]): p
        for p in path.parent.glob(f"{glob.escape(path.stem)}.*.jsonl")
        if p.stem.rsplit(".", 1)[1].isdigit()
    }
    later = [numbered[n] for n in sorted(numbered)]
    if later:
        return [f"the run paused for review; the whole run, resumed, is in {later[-1]}"]
    return [
        "the run paused for review; once resumed, the rest of it is in its store",
        f"(fsm-agent runs export {run_id} --db ...), and in this file if it was written",
        "by Runtime(trace_dir=...) and the run resumed with that trace_dir",
    ]


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
