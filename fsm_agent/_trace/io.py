"""Traces: JSON Lines, one event per line (docs/concepts/traces.md).

A trace is ``run_start`` (schema, run id, machine hash, budget, retry, policy, allowed
tools, the tools' declared facts, the configured approvals' digests, the integrity mode,
the initial messages), then events in ``seq`` order, then ``run_end``:

``transition``   ``trigger``, ``source``, ``dest``, ``guards`` (each guard evaluated, in
                 order, with its outcome), ``t`` (seconds since start) and, where they
                 apply, ``call_id``, ``tool``, ``attempt``, ``approval`` (what a write
                 consumed), ``outcome`` and ``error`` (what the tool did), ``reason``,
                 ``detail``, ``inputs`` (what the world answered since the previous
                 transition: keys, approval uses, intent claims, loaded records, and
                 ``resumed`` where a later driving took over)
``decision``     the model's reply as received (``message``; ``malformed``: why it was
                 refused; ``raw_arguments``: arguments with lone surrogates), or
                 ``error``
``observation``  a result bound to ``call_id``; ``synthetic`` for answers the runtime
                 wrote for calls that did not run
``review``       a reviewer's decision on a paused call
``run_end``      ``status``, ``reason``, ``detail``, ``answer``, ``counters``

``seq`` is 0 for the header and then contiguous. Everything the runtime did can be
rebuilt from these events: they hold every input the loop took, so ``fsm-agent check``
replays the run through the engine (``trace/replay.py``). Written by the runtime, every
line also ends with the run id and its chain link (``trace/chain.py``). A ``redact`` hook
sees each event before it leaves the runtime (file, store, ``RunResult.events``) and
returns the event to keep.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from fsm_agent._errors import ConfigError, TraceError
from fsm_agent._trace.chain import dumps_event

__all__ = [
    "MAX_LINE",
    "JsonlTrace",
    "LineSink",
    "Redactor",
    "TraceSink",
    "iter_trace",
    "read_trace",
]

#: The longest trace line ``fsm-agent check`` parses (its memory is bounded by it). The
#: runtime never writes a longer one under any budget: one line holds at most one model
#: reply or tool result, each at most ``core/budget.py``'s ``MAX_RECORD_BYTES`` (a
#: quarter of this), and error messages are cut to ``MAX_ERROR_CHARS``. What a caller
#: hands in itself (the task's messages in the header, a reviewer's reconciled result)
#: is the caller's to keep under it.
MAX_LINE = 64 * 1024 * 1024

Redactor = Callable[[dict[str, Any]], dict[str, Any]]


class TraceSink(Protocol):
    """Anything that takes trace events (a file, a store, a list)."""

    def write(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class LineSink(TraceSink, Protocol):
    """A sink that takes encoded lines: the driver hands it each event's chained line
    (``trace/chain.py``), the same bytes a serializing store keeps."""

    def write_line(self, line: str) -> None: ...


class JsonlTrace:
    """Writes events to a JSON Lines file, flushing each line so a crash loses none.

    One trace file holds one run: an existing file is refused (``ConfigError``) unless
    ``append=True`` says the caller means to add to it. Lines are strict UTF-8 JSON (no
    bare ``NaN``/``Infinity``; see ``core/jsonsafe.py``).
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self.append = append
        if not append and self.path.exists():
            raise ConfigError(
                f"{self.path}: the trace file exists; one file holds one run. Choose a new "
                "path (e.g. Runtime(trace_dir=...) names files by run id) or pass "
                "JsonlTrace(path, append=True)"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{self.path}: cannot write a trace there ({exc.strerror or exc})"
            ) from None
        # Opened at the first event: a run that never started leaves no file behind.
        self._file: IO[str] | None = None
        self._closed = False

    def write(self, event: dict[str, Any]) -> None:
        """Write one event as it is (no chain link: the runtime writes lines)."""
        self.write_line(dumps_event(event))

    def write_line(self, line: str) -> None:
        """Write one encoded event line (the runtime's chained lines)."""
        if self._closed:
            raise ValueError(f"trace {self.path} is closed")
        if self._file is None:
            self._file = self.path.open("a" if self.append else "x", encoding="utf-8")
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


def iter_trace(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the events of a trace file, or raise :class:`TraceError` naming the line."""
    name = str(path)
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TraceError(name, 0, f"cannot open: {exc.strerror or exc}") from None
    with handle:
        line_no = 0
        try:
            for line_no, line in enumerate(handle, 1):
                if not line.endswith("\n"):
                    raise TraceError(
                        name,
                        line_no,
                        "truncated: the last line has no newline (was the run killed mid-write?)",
                    )
                if not line.strip():
                    raise TraceError(name, line_no, "empty line")
                try:
                    event = json.loads(line)
                except ValueError as exc:
                    raise TraceError(name, line_no, f"not JSON: {exc}") from None
                except RecursionError:
                    raise TraceError(
                        name, line_no, "not JSON this reader takes: nested too deeply"
                    ) from None
                if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                    raise TraceError(name, line_no, "not a trace event (no 'type' field)")
                yield event
        except UnicodeDecodeError as exc:
            raise TraceError(name, line_no + 1, f"not UTF-8 text: {exc.reason}") from None
        if line_no == 0:
            raise TraceError(name, 1, "empty trace: no run_start header")


def read_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a trace file (see :func:`iter_trace`)."""
    return list(iter_trace(path))
