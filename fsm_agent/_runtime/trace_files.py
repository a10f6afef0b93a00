"""A resumed run's ``trace_dir`` file: continued, so it holds the whole run.

``Runtime(trace_dir=...)`` names one ``<run id>.jsonl`` per run. A run that pauses for
review, or dies, is continued later by ``resume``/``aresume`` (a worker's, a review's
with ``resume=True``; in this process or another): :func:`continue_trace_file` opens the
run's file again, first appends what the store holds that the file lacks (the reviews
recorded meanwhile, from the CLI or another host), and hands back the chain the rest of the run
continues, so ``fsm-agent check`` passes on the whole file.

The file is continued only when it is exactly a prefix of the run as its store holds it
(its last line is, byte for byte, the store's event of that ``seq``, chained over the
store's events before it). Otherwise —
the file was edited, cut mid-line, belongs to another run with the same id, or holds
events a failed store never kept — it is left as it is, the whole run is written to
``<run id>.2.jsonl`` (the first free number), and a ``RuntimeWarning`` names both files.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from fsm_agent._errors import ConfigError
from fsm_agent._trace.chain import MODES, SIGNED, Chain, dumps_event
from fsm_agent._trace.io import JsonlTrace

__all__ = ["continue_trace_file"]

#: How much of a file's end is read at a time to find its last line.
_BLOCK = 1 << 16


def continue_trace_file(
    folder: Path, run_id: str, events: list[dict[str, Any]], key: bytes | None
) -> tuple[JsonlTrace, Chain | None]:
    """The trace sink of a resumed run, and the chain its next line continues (``None``
    for a trace whose header names no chain). ``events``: the run's events as its store
    holds them (without links), header first."""
    mode = events[0].get("integrity") if events else None
    if mode == SIGNED and key is None:
        raise ConfigError(
            f"run {run_id!r} has a signed trace: resume or review it with the runtime's "
            "trace_key (or the CLI's --key-env)"
        )
    use = key if mode == SIGNED else None

    def new_chain() -> Chain | None:
        return Chain(run_id, use) if mode in MODES else None

    chain = new_chain()
    path = folder / f"{run_id}.jsonl"
    if not path.exists():
        return _write_whole(path, events, chain), chain
    kept, why = _prefix_length(path, events, chain)
    if why is None:
        sink = JsonlTrace(path, append=True)
        _write(sink, events[kept:], chain)
        return sink, chain
    other = _free_path(folder, run_id)
    warnings.warn(
        f"{path}: {why}, so it is not continued; the whole of run {run_id!r} (as its store "
        f"holds it, and the rest of the run) is written to {other}",
        RuntimeWarning,
        stacklevel=4,
    )
    chain = new_chain()
    return _write_whole(other, events, chain), chain


def _write_whole(path: Path, events: list[dict[str, Any]], chain: Chain | None) -> JsonlTrace:
    sink = JsonlTrace(path)
    _write(sink, events, chain)
    return sink


def _write(sink: JsonlTrace, events: list[dict[str, Any]], chain: Chain | None) -> None:
    for event in events:
        sink.write_line(chain.encode(event) if chain is not None else dumps_event(event))


def _prefix_length(
    path: Path, events: list[dict[str, Any]], chain: Chain | None
) -> tuple[int, str | None]:
    """How many of ``events`` the file holds, and ``None``; or why it is not a prefix of
    them. Advances ``chain`` past the events the file holds."""
    last = _last_line(path)
    if last is None:
        return 0, "the file is empty"
    if not last.endswith(b"\n"):
        return 0, "its last line is cut short (was a process killed mid-write?)"
    try:
        event = json.loads(last)
    except ValueError:
        return 0, "its last line is not JSON"
    seq = event.get("seq") if isinstance(event, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < len(events):
        return 0, f"its last line is not one of the {len(events)} events the store holds"
    if chain is None:
        if event.get("type") != events[seq].get("type"):
            return 0, f"its event {seq} is not the store's"
        return seq + 1, None
    for stored in events[:seq]:
        chain.encode(stored)
    # The last line, byte for byte: it closes the chain over every line before it.
    if chain.encode(events[seq]).encode("utf-8") != last[:-1]:
        return 0, f"its last line (event {seq}) is not the store's event {seq}"
    return seq + 1, None


def _last_line(path: Path) -> bytes | None:
    """The file's last line (with its newline, if it has one), reading only its end."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        if end == 0:
            return None
        tail = b""
        pos = end
        while pos > 0:
            step = min(_BLOCK, pos)
            pos -= step
            handle.seek(pos)
            tail = handle.read(step) + tail
            # the newline that ends the line before the last one
            cut = tail.rfind(b"\n", 0, len(tail) - 1)
            if cut >= 0:
                return tail[cut + 1 :]
        return tail


def _free_path(folder: Path, run_id: str) -> Path:
    n = 2
    while (folder / f"{run_id}.{n}.jsonl").exists():
        n += 1
    return folder / f"{run_id}.{n}.jsonl"
