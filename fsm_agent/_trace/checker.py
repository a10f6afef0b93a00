"""Conformance of recorded traces to the run machine (``fsm-agent check``).

The checker reads a trace line by line, in constant memory whatever its size:

1. **Integrity** (``trace/chain.py``): every line of a chained trace must carry the
   run's id and a chain link that follows from the previous line's link and its own
   bytes — SHA-256, or HMAC-SHA256 when the header says the run was signed and the
   caller gives the key. A deleted, inserted, reordered or spliced line breaks the chain
   where it happened; with the key, so does any edit.
2. **Conformance by replay** (``trace/replay.py``, ``fsm-agent.trace/3``): the recorded
   inputs are fed to the engine's own loop, and every event it writes must be the
   recorded one, field by field; outside the engine, no idempotent write executes twice
   under one key (and ``check --db`` compares the writes with the store's records).

Nothing a trace holds makes the checker raise: each problem is a :class:`Violation`
(``FILE:LINE: message``), and a file that cannot be checked at all (missing, empty, no
``run_start`` header, another schema or machine) raises
:class:`~fsm_agent._errors.TraceError`. Older traces lack the inputs replay needs: a
``fsm-agent.trace/2`` trace is checked by the v2 walker (``trace/walk.py``, which
recomputes the guards it knows and takes the others as recorded), a
``fsm-agent.trace/1`` trace (0.1) too, without integrity (it carries none) and with the
guards as recorded; the report notes either.
"""

from __future__ import annotations

import gc
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from fsm_agent._core.jsonsafe import MAX_DEPTH, clean_text, make_safe
from fsm_agent._core.loop import SCHEMA
from fsm_agent._core.select import select_recorded
from fsm_agent._core.table import LEGACY_MACHINE_HASHES, MACHINE_HASH, Transition, edges_from
from fsm_agent._errors import ConfigError, TraceError
from fsm_agent._trace.chain import (
    CHAIN_FIELDS,
    LINK_HEX,
    MODES,
    SIGNED,
    Chain,
    link_bytes,
)
from fsm_agent._trace.io import MAX_LINE
from fsm_agent._trace.replay import Rebuilt, Replay, Rewind
from fsm_agent._trace.walk import Walk, Write

__all__ = [
    "LEGACY_SCHEMA",
    "MAX_LINE",
    "SCHEMAS",
    "V2_SCHEMA",
    "Report",
    "Violation",
    "check_bytes",
    "check_events",
    "check_file",
    "check_paths",
    "check_report",
    "check_trace",
    "load_trace",
    "parse_line",
    "select_edge",
]

#: The 0.1 trace format: no integrity data, guards recorded positive-first.
LEGACY_SCHEMA = "fsm-agent.trace/1"
#: The engine v2 format: chained, but without the store's answers, the approval uses and
#: exact clock readings that replay needs.
V2_SCHEMA = "fsm-agent.trace/2"
#: The trace format this fsm-agent writes, and the older ones it still reads.
SCHEMAS = (SCHEMA, V2_SCHEMA, LEGACY_SCHEMA)
# MAX_LINE (trace/io.py): the longest line the checker parses (memory is bounded by
# it); a longer one is a violation and is skipped without being read into memory.
#: Violations kept per trace; past that they are only counted.
MAX_KEPT = 1000

_LINK_FIELD = b',"chain":"'
_TAIL = len(_LINK_FIELD) + LINK_HEX + 2
#: Events handed to the replay (or the walker) at once by the line loop: a power of two
#: (the loop hands them over at every line number whose low bits are all zero).
_CHUNK = 32
_BROKEN = (
    "the chain breaks here: this line, or one before it, was changed, removed, inserted or moved"
)


@dataclass(frozen=True)
class Violation:
    """One broken rule, at the 1-based line of the trace file where it shows."""

    line: int
    message: str

    def format(self, path: str) -> str:
        return f"{path}:{self.line}: {message_line(self.message)}"


def message_line(text: str) -> str:
    """One printable line (trace content must not reach a terminal raw)."""
    return "".join(ch if ch.isprintable() else "\N{REPLACEMENT CHARACTER}" for ch in text)


@dataclass
class Report:
    """What checking one trace found."""

    path: str
    violations: list[Violation] = field(default_factory=list)
    #: Violations past :data:`MAX_KEPT`, counted but not kept.
    omitted: int = 0
    #: What was not verified and why (no key for a signed trace, a 0.1 trace...).
    notes: list[str] = field(default_factory=list)
    run_id: str | None = None
    lines: int = 0
    #: The link of the last line (what an outside record of the run should match).
    last_link: str | None = None
    #: The writes of idempotent tools the trace reports, when collected (``check --db``).
    writes: list[Write] | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def fail(self, line: int, message: str) -> None:
        if len(self.violations) < MAX_KEPT:
            self.violations.append(Violation(line, message))
        else:
            self.omitted += 1


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    # Parsing allocates many small dicts and no cycles; the cyclic collector would rescan
    # them over and over for nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


# The stdlib's C scanner, without json.loads' wrappers (detect_encoding, whitespace).
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def parse_line(raw: bytes) -> Any:
    """One line (without its newline) as one JSON value: the checker's parser, and the
    benchmark's parse-only baseline. ``ValueError`` for anything else."""
    text = raw.decode("utf-8")
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("not a JSON value") from None
    if end != len(text):
        raise ValueError(f"extra data at column {end + 1}")
    return value


def _loads(raw: bytes | str) -> Any:
    """Parse one line; ``ValueError`` for anything that is not one JSON value."""
    try:
        return parse_line(raw.rstrip(b"\r\n") if isinstance(raw, bytes) else raw.encode())
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason})") from None


class _Header:
    """The ``run_start`` header: what kind of trace this is, or a :class:`TraceError`."""

    def __init__(self, name: str, event: Any, machine_hash: str = MACHINE_HASH) -> None:
        if not isinstance(event, dict):
            raise TraceError(name, 1, "not a trace: the first line is not a JSON object")
        if event.get("type") != "run_start":
            raise TraceError(name, 1, f"the first event is {event.get('type')!r}, not run_start")
        schema = event.get("schema")
        if schema not in SCHEMAS:
            raise TraceError(
                name,
                1,
                f"schema {schema!r} is not one this fsm-agent reads ({', '.join(SCHEMAS)}); "
                "written by another version",
            )
        self.legacy = schema == LEGACY_SCHEMA
        self.replayed = schema == SCHEMA
        hashes = {machine_hash} | (set(LEGACY_MACHINE_HASHES) if self.legacy else set())
        #: The header's rules rebuilt, for the replay to judge with (built once).
        self.rebuilt: Rebuilt | None = None
        if event.get("rules") is not None and self.replayed:
            # A run with the application's rules fires the default machine plus their
            # rows: the machine the recorded rules build is the one it must name.
            try:
                self.rebuilt = Rebuilt.of(event)
                hashes.add(self.rebuilt.machine.hash)
            except (ConfigError, ValueError, TypeError, KeyError) as exc:
                raise TraceError(name, 1, f"the header's rules cannot be rebuilt: {exc}") from None
        if event.get("machine_hash") not in hashes:
            raise TraceError(
                name,
                1,
                f"machine hash {event.get('machine_hash')!r} is not this machine's "
                f"{machine_hash} (the trace was recorded with another transition table)",
            )
        run_id = event.get("run_id")
        self.run_id = run_id if isinstance(run_id, str) else None
        self.mode = event.get("integrity")
        self.event = event


def _conformance(
    head: _Header, report: Report, collect_writes: bool, saving: bool = True
) -> Replay | Walk:
    """What checks the events: replay through the engine (``trace/replay.py``) for the
    format this fsm-agent writes; the v2 walker (``trace/walk.py``) for older traces,
    which lack the inputs replay needs. ``saving``: whether the replay keeps the run's
    checkpoints (else a resume from an earlier one raises :class:`Rewind`)."""
    writes: list[Write] | None = [] if collect_writes else None
    report.writes = writes
    if head.replayed:
        return Replay(
            head.event,
            report.fail,
            writes=writes,
            note=report.notes.append,
            rebuilt=head.rebuilt,
            saving=saving,
        )
    if not head.legacy:
        report.notes.append(
            f"a {V2_SCHEMA} trace records neither the store's answers nor the approval uses "
            "nor exact clock readings, so it is not replayed: the v2 walker checked it, "
            "which recomputes the guards it knows and takes the others as recorded"
        )
    walk = Walk(head.event, report.fail, legacy=head.legacy)
    walk.writes = writes
    return walk


def _integrity(head: _Header, key: bytes | None, report: Report, *, lines: bool) -> Any:
    """The link function to verify the trace with, or ``None`` (with the reason noted
    or reported)."""
    if head.legacy:
        report.notes.append(
            "a fsm-agent.trace/1 trace carries no run ids or chain links: integrity is "
            "unavailable, and guards are checked as recorded"
        )
        return None
    if head.mode not in MODES:
        if lines:
            report.fail(
                1, f"the header names no integrity mode ({head.mode!r}): links unverifiable"
            )
        return None
    if head.mode == SIGNED:
        if key is None:
            report.notes.append(
                "signed trace (hmac-sha256): its links were not verified without the key "
                "(--key-env); only its conformance was checked"
            )
            return None
        return link_bytes(key)
    if key is not None:
        report.fail(1, "a key was given, but the trace is not signed (integrity sha256)")
    return link_bytes(None)


def check_trace(
    path: str | os.PathLike[str],
    *,
    key: bytes | None = None,
    collect_writes: bool = False,
) -> Report:
    """Check the trace file at ``path`` (see the module docstring); :class:`TraceError`
    only if it cannot be checked at all."""
    name = str(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TraceError(name, 0, f"cannot open: {exc.strerror or exc}") from None
    with handle, _no_cyclic_gc():
        return _rewinding(name, handle, key, collect_writes)


def check_bytes(data: bytes, *, key: bytes | None = None, name: str = "<bytes>") -> Report:
    """:func:`check_trace` of a trace held in memory (tests, fuzzing)."""
    with _no_cyclic_gc():
        return _rewinding(name, io.BytesIO(data), key, False)


def _rewinding(name: str, handle: IO[bytes], key: bytes | None, collect_writes: bool) -> Report:
    """Check a stream, first without keeping the run's checkpoints (a snapshot of the
    whole state at each: a tenth of the work), and again from the start, keeping them, if
    a resume from one turns up (:class:`Rewind`). A stream that cannot be read twice
    keeps them from the start."""
    if handle.seekable():
        start = handle.tell()
        try:
            return _check_stream(name, handle, key, collect_writes, saving=False)
        except Rewind:
            handle.seek(start)
    return _check_stream(name, handle, key, collect_writes)


def _read_line(handle: IO[bytes]) -> tuple[bytes, bool]:
    """The next line (``b""`` at the end) and whether it was cut at :data:`MAX_LINE`
    (the rest of it is skipped, never held in memory)."""
    raw = handle.readline(MAX_LINE + 1)
    if len(raw) <= MAX_LINE or raw.endswith(b"\n"):
        return raw, False
    while True:
        more = handle.readline(1 << 20)
        if not more or more.endswith(b"\n"):
            return raw[:MAX_LINE], True


def _check_stream(  # noqa: C901 - the per-line loop, kept in one function for speed
    name: str, handle: IO[bytes], key: bytes | None, collect_writes: bool, saving: bool = True
) -> Report:
    report = Report(name)
    first, cut = _read_line(handle)
    if not first:
        raise TraceError(name, 1, "empty trace: no run_start header")
    if cut:
        raise TraceError(name, 1, f"the header is longer than {MAX_LINE} bytes")
    if not first.endswith(b"\n"):
        raise TraceError(name, 1, "truncated: the header line has no newline")
    try:
        parsed = _loads(first)
    except ValueError as exc:
        raise TraceError(name, 1, f"not JSON: {exc}") from None
    head = _Header(name, parsed)
    report.run_id = head.run_id
    fail = report.fail
    walk = _conformance(head, report, collect_writes, saving)
    mac = _integrity(head, key, report, lines=True)
    # The last link and a newline: what the next line's link is computed over first
    # (None: unknown, after a line without one).
    prev = _link(1, first, b"\n", mac, fail) if mac is not None else b"\n"
    run = head.run_id
    # Events go to the replay (or the walker) without the chain's fields, in chunks:
    # one call per _CHUNK lines, not one per line.
    chunk: list[tuple[int, dict[str, Any]]] = []
    add, feed, scan = chunk.append, walk.feed_many, _scan
    readline = handle.readline
    # (Locals for the per-line loop: slice bounds, the read limit; the bounds are of a
    # line read with its newline.)
    link_at, limit, newline, every = -LINK_HEX - 3, MAX_LINE + 1, b"\n", _CHUNK - 1
    # How ``Chain.encode`` closes every line of this run: its fields (the run id, then
    # the link's key), the link, ``"}``. A line that ends so is parsed without them:
    # the same event as parsing the whole line and dropping them, for less (two fields
    # fewer to read, to hash and to pop).
    fields = _chain_fields(run)
    closing = b'"}\n'
    run_at = -(len(fields) + LINK_HEX + 3) if fields is not None else 0
    line_no = 1
    raw = readline(limit)
    event: Any = None
    while raw:
        line_no += 1
        if raw.endswith(closing) and raw[run_at:link_at] == fields:  # ends as this run's
            own = True  # (the link is read as it stands; a line it breaks is parsed whole)
            if mac is not None:
                link = raw[link_at:-3]
                if prev is None or mac(prev + raw[:link_at]) != link:
                    if prev is not None:
                        fail(line_no, _BROKEN)
                    own = link.isalnum()
                prev = link + newline
            else:
                own = raw[link_at:-3].isalnum()
            if own:
                try:  # (parse_line, inlined, on the line without the fields)
                    text = (raw[:run_at] + b"}").decode("utf-8")
                    event, end = scan(text, 0)
                except (ValueError, RecursionError, StopIteration):
                    own = False
                else:
                    # (A value that ends at the "}" put there is an object; ``{}`` is
                    # a line that was ``{,"run":...``, no JSON.)
                    if end != len(text) or not event:
                        own = False
                    elif "run" in event or "chain" in event:  # twice: the last counts
                        event.pop("run", None)
                        event.pop("chain", None)
            if own:
                add((line_no, event))  # of this run: its id is in the bytes compared
                if not line_no & every:
                    feed(chunk)
                    chunk.clear()
                raw = readline(limit)
                continue
            event = _event(line_no, raw, mac, run, fail)  # its link breaks the JSON
        elif raw.endswith(newline):
            if mac is not None:
                prev = _link(line_no, raw, prev, mac, fail)
            event = _event(line_no, raw, mac, run, fail)
        elif len(raw) <= MAX_LINE:
            fail(line_no, "truncated: the last line has no newline (was the run killed mid-write?)")
            break
        else:
            while True:  # skip the rest of an over-long line without holding it
                more = readline(1 << 20)
                if not more or more.endswith(b"\n"):
                    break
            fail(line_no, f"a line longer than {MAX_LINE} bytes: not checked")
            raw = readline(limit)
            continue
        if type(event) is dict:
            add((line_no, event))
            if len(chunk) >= _CHUNK:
                feed(chunk)
                chunk.clear()
        else:
            if chunk:
                feed(chunk)
                chunk.clear()
            walk.skip(line_no, numbered=event is not None)
        raw = readline(limit)
    if chunk:
        feed(chunk)
    report.lines = line_no
    report.last_link = prev[:-1].decode("ascii", "replace") if prev and prev != newline else None
    walk.finish(line_no)
    return report


def _chain_fields(run: str | None) -> bytes | None:
    """``,"run":<id>,"chain":"``: how ``Chain.encode`` ends a line of run ``run`` before
    its link (None if it cannot end one: a run id that is no clean text)."""
    if run is None or clean_text(run) is not run:
        return None
    try:
        return (',"run":' + json.dumps(run, ensure_ascii=False)).encode("utf-8") + _LINK_FIELD
    except UnicodeEncodeError:  # pragma: no cover - clean text encodes
        return None


def _link(line_no: int, raw: bytes, prev: bytes | None, mac: Any, fail: Any) -> bytes | None:
    """Verify the link of a line read with its newline (the header, or a line that does
    not end as its run's lines do); what the next line's link is computed over first."""
    if raw[-_TAIL - 1 : -LINK_HEX - 3] != _LINK_FIELD:
        fail(line_no, "no chain link at the end of the line")
        return None  # the next line's link cannot be verified either
    link = raw[-LINK_HEX - 3 : -3]
    if prev is not None and mac(prev + raw[: -LINK_HEX - 3]) != link:
        fail(line_no, _BROKEN)
    return link + b"\n"


def _event(line_no: int, raw: bytes, mac: Any, run: str | None, fail: Any) -> Any:
    """The event of a line (read with its newline) parsed whole, the chain's fields
    dropped, its run compared with the trace's; None if it is not JSON, a value that is
    not an object as it is (both reported)."""
    try:
        event = parse_line(raw[:-1])
    except (ValueError, RecursionError) as exc:
        fail(line_no, f"not JSON: {_reason(exc)}")
        return None
    if type(event) is not dict:
        fail(line_no, f"not a trace event: a JSON {type(event).__name__}")
        return event
    of = event.pop("run", None)
    event.pop("chain", None)
    if mac is not None and of != run:
        fail(line_no, f"an event of run {of!r} in run {run!r}'s trace")
    return event


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 ({exc.reason})"
    return str(exc)


def check_file(path: str | os.PathLike[str], *, key: bytes | None = None) -> list[Violation]:
    """Violations in the trace at ``path``; :class:`TraceError` if it cannot be checked."""
    return check_trace(path, key=key).violations


def check_events(
    events: Iterable[Mapping[str, Any]], *, key: bytes | None = None
) -> list[Violation]:
    """Violations in a trace already read into dicts (``events[0]`` is its
    ``run_start``): a run's ``RunResult.events``, or events read back from a file or a
    store. Links are verified where the events carry them (re-encoded: a line read back
    and encoded again is the same bytes); a run's in-memory events carry none."""
    with _no_cyclic_gc():
        return check_report(list(events), key=key).violations


def check_report(
    events: list[Mapping[str, Any]],
    *,
    key: bytes | None = None,
    name: str = "<events>",
    collect_writes: bool = False,
) -> Report:
    """:func:`check_events` with the whole :class:`Report` (a stored run's check)."""
    report = Report(name)
    if not events:
        report.fail(1, "empty trace: no run_start header")
        return report
    try:
        head = _Header(name, dict(events[0]))
    except TraceError as exc:
        report.fail(1, exc.message)
        return report
    report.run_id = head.run_id
    walk = _conformance(head, report, collect_writes)
    linked = "chain" in events[0]
    mac = _integrity(head, key, report, lines=False) if linked else None
    chain = Chain(head.run_id or "", key if head.mode == SIGNED else None)
    for line_no, event in enumerate(events, 1):
        if not isinstance(event, Mapping):
            report.fail(line_no, f"not a trace event: {type(event).__name__}")
            walk.skip(line_no, numbered=False)
            continue
        if mac is not None:
            stored = event.get("chain")
            chain.encode({k: v for k, v in event.items() if k not in CHAIN_FIELDS})
            if stored != chain.link:
                report.fail(line_no, "the chain breaks here (or the event carries no link)")
            chain.link = stored if isinstance(stored, str) else chain.link
            if event.get("run") != head.run_id:
                report.fail(line_no, f"an event of run {event.get('run')!r}")
        if line_no > 1:
            walk.feed(line_no, dict(event))
    walk.finish(len(events))
    report.lines = len(events)
    report.last_link = chain.link if mac is not None else None
    return report


def check_paths(
    paths: Iterable[str], *, key: bytes | None = None
) -> dict[str, Report | TraceError]:
    """Check several traces, keeping going past unreadable ones."""
    out: dict[str, Report | TraceError] = {}
    for path in paths:
        try:
            out[path] = check_trace(path, key=key)
        except TraceError as exc:
            out[path] = exc
    return out


def load_trace(
    path: str | os.PathLike[str], machine_hash: str = MACHINE_HASH
) -> list[dict[str, Any]]:
    """Every event of a trace file, read leniently for display (replay, the viewer):
    the header must be readable and name ``machine_hash`` (else :class:`TraceError`); a
    later line that is not an event object stands as ``{"type": "unreadable", ...}`` so
    every step still shows."""
    name = str(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TraceError(name, 0, f"cannot open: {exc.strerror or exc}") from None
    events: list[dict[str, Any]] = []
    with handle, _no_cyclic_gc():
        raw, cut = _read_line(handle)
        if not raw:
            raise TraceError(name, 1, "empty trace: no run_start header")
        try:
            parsed = _loads(raw) if not cut else None
        except ValueError as exc:
            raise TraceError(name, 1, f"not JSON: {exc}") from None
        head = _Header(name, parsed, machine_hash)
        events.append(head.event)
        line_no = 1
        while True:
            raw, cut = _read_line(handle)
            if not raw:
                break
            line_no += 1
            try:
                event = None if cut else _loads(raw)
                problem = "" if cut else "not an event object"
            except ValueError as exc:
                event, problem = None, f"not JSON: {exc}"
            if cut:
                problem = f"longer than {MAX_LINE} bytes"
            if not (isinstance(event, dict) and isinstance(event.get("type"), str)):
                event = {"type": "unreadable", "seq": line_no - 1, "line": line_no,
                         "problem": problem}  # fmt: skip
            elif raw.count(b"{") + raw.count(b"[") > MAX_DEPTH or b"\\ud" in raw.lower():
                # What displays it may recurse (cut at MAX_DEPTH) or encode it as UTF-8
                # (a lone surrogate escape becomes U+FFFD).
                event = make_safe(event)
            events.append(event)
    return events


def select_edge(
    source: str,
    trigger: str,
    dest: Any,
    reason: Any,
    guards: Mapping[str, Any],
    *,
    legacy: bool = False,
) -> Transition | None:
    """The edge of ``trigger`` in ``source`` that a transition event took, or None, as
    far as its recorded outcomes tell (replay and the viewer draw with it): the one
    selector over the recorded outcomes, or, where they cannot decide (redacted, or an
    outcome missing), the first edge with the event's destination and reason."""
    if not isinstance(source, str) or not isinstance(trigger, str):
        return None
    try:
        found = select_recorded(source, trigger, guards, legacy=legacy)
    except LookupError:
        found = None
    if found is not None and found.dest == dest and found.reason == reason:
        return found
    return next(
        (t for t in edges_from(source, trigger) if t.dest == dest and t.reason == reason), found
    )
