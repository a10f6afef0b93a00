"""Trace integrity: each event line carries its run id and a link of a hash chain.

A run's trace is written as JSON Lines by :class:`Chain` (the driver hands the same
line to the trace file and to a store that keeps JSON text, so both hold identical
bytes). Every line ends with two fields the encoder appends::

    {...the event...,"run":"<run id>","chain":"<32 hex digits>"}

The link of line *n* is ``MAC(link(n-1) + "\\n" + line n up to the link's first digit)``
truncated to 128 bits, with ``link(-1) = ""``: it covers everything on its line,
including the run id, and every line before it. ``MAC`` is SHA-256 for a trace written
without a key (header ``"integrity": "sha256"``) and HMAC-SHA256 under the runtime's
``trace_key`` (``"integrity": "hmac-sha256"``). The header names the mode, so a trace cannot
be passed off as unsigned without breaking its first link.

What that proves (the threat model is spelled out in the README):

* without a key, the chain detects deletions, insertions, reorders, splices of lines
  from other runs and any edit made without recomputing the links; someone who rewrites
  the file can recompute them, so what ``check`` then proves is that the trace is
  self-consistent (every recomputable guard, counter and pairing);
* with a key, no line can be changed, added or removed without the key, payloads
  included; a trace cut after a complete line still needs an outside record of the
  last link (``fsm-agent check --db`` compares it with the store's).

The in-memory path pays nothing: ``RunResult.events`` and ``MemoryStore`` keep plain
dicts and are chained only when written out (:func:`encode_events`).
"""

from __future__ import annotations

import hashlib
import json
from binascii import hexlify
from collections.abc import Callable, Iterable
from typing import Any

from fsm_agent._core.jsonsafe import c_dumps, clean_text, make_safe
from fsm_agent._errors import ConfigError

__all__ = [
    "CHAIN_FIELDS",
    "LINK_HEX",
    "MODES",
    "SIGNED",
    "UNSIGNED",
    "Chain",
    "Encoder",
    "continue_chain",
    "dumps_event",
    "encode_events",
    "link_bytes",
    "link_function",
    "mode_for",
    "split_line",
    "strip_links",
    "trace_key",
]

#: The chain modes a header may name: without a key, and with one.
UNSIGNED, SIGNED = "sha256", "hmac-sha256"
MODES = (UNSIGNED, SIGNED)
#: Hex digits of a link (128 bits).
LINK_HEX = 32
#: The fields the encoder appends to every event (and strips before re-encoding one).
CHAIN_FIELDS = ("run", "chain")
_LINK_FIELD = b',"chain":"'
#: ``,"chain":"`` + link + ``"}``: the fixed-width end of every chained line.
_TAIL = len(_LINK_FIELD) + LINK_HEX + 2

Link = Callable[[bytes], str]


def trace_key(key: Any) -> bytes | None:
    """A ``trace_key`` as bytes (a ``str`` is taken as UTF-8); ``None`` stays ``None``."""
    if key is None:
        return None
    if isinstance(key, str):
        key = key.encode("utf-8", "surrogatepass")
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise ConfigError("trace_key must be non-empty bytes or str")
    return bytes(key)


def mode_for(key: bytes | None) -> str:
    """The header's ``integrity`` value for a trace written with (or without) ``key``."""
    return UNSIGNED if key is None else SIGNED


def link_bytes(key: bytes | None) -> Callable[[bytes], bytes]:
    """:func:`link_function` giving the link as ASCII bytes (the checker compares it
    with the bytes of a line)."""
    if key is None:
        sha = hashlib.sha256

        def plain(data: bytes) -> bytes:
            return hexlify(sha(data).digest()[:16])

        return plain
    text = link_function(key)

    def mac(data: bytes) -> bytes:
        return text(data).encode("ascii")

    return mac


def link_function(key: bytes | None) -> Link:
    """``data -> link``: SHA-256 without a key, HMAC-SHA256 (RFC 2104) with one.

    The HMAC pads are hashed once here and copied per line: the same MAC as
    ``hmac.new(key, data, "sha256")``, at half the cost per call.
    """
    if key is None:
        sha = hashlib.sha256

        def plain(data: bytes) -> str:
            return sha(data).hexdigest()[:LINK_HEX]

        return plain
    block = hashlib.sha256(key).digest() if len(key) > 64 else key
    block = block.ljust(64, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def mac(data: bytes) -> str:
        i = inner.copy()
        i.update(data)
        o = outer.copy()
        o.update(i.digest())
        return o.hexdigest()[:LINK_HEX]

    return mac


def _plain_compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


#: Compact strict JSON by a C encoder built once (five to seven events a tool round).
_compact: Callable[[Any], str] = c_dumps(",", ":") or _plain_compact


def dumps_event(event: dict[str, Any]) -> str:
    """An event as compact, strict JSON text (what a chained line starts with). Events
    the loop wrote are JSON-safe already; what a ``redact`` hook returned may not be,
    and is made so (``core/jsonsafe.py``)."""
    try:
        text = _compact(event)
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(
            make_safe(event), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )
    if not text.startswith("{"):  # a hook that returned something else than a dict
        text = json.dumps({"type": "unknown", "value": json.loads(text)}, separators=(",", ":"))
    return text


def split_line(line: bytes) -> tuple[bytes, bytes] | None:
    """``(signed part, link)`` of a chained line (without its newline), or ``None`` if
    the line does not end with a link field."""
    if len(line) < _TAIL or not line.endswith(b'"}'):
        return None
    head = line[: -LINK_HEX - 2]
    if not head.endswith(_LINK_FIELD):
        return None
    return head, line[-LINK_HEX - 2 : -2]


class Chain:
    """Encodes the events of one run as chained lines, in order (see the module doc).

    ``link`` is the last link written so far: ``""`` for a new run, the link of the last
    stored event for a resumed one.
    """

    def __init__(self, run_id: str, key: bytes | None = None, link: str = "") -> None:
        self.run_id = run_id
        self.mode = mode_for(key)
        self.link = link
        self._mac = link_function(key)
        self._run = ',"run":' + json.dumps(clean_text(run_id), ensure_ascii=False)
        self._fields = self._run + ',"chain":"'

    def encode(self, event: dict[str, Any]) -> str:
        """The event's line (no newline); advances the chain."""
        if "run" in event or "chain" in event:  # re-encoding a line read back
            event = {k: v for k, v in event.items() if k not in CHAIN_FIELDS}
        text = dumps_event(event)
        head = (text[:-1] + self._fields) if len(text) > 2 else ("{" + self._fields[1:])
        link = self._mac((self.link + "\n" + head).encode("utf-8"))
        self.link = link
        return head + link + '"}'


def encode_events(
    events: Iterable[dict[str, Any]], run_id: str | None = None, key: bytes | None = None
) -> list[str]:
    """Chained lines of a whole run (``RunResult.events``, a ``MemoryStore`` run): the
    bytes its trace file would hold. ``run_id`` defaults to the header's."""
    events = list(events)
    if run_id is None:
        head = events[0] if events else {}
        run_id = str(head.get("run_id", ""))
    chain = Chain(run_id, key)
    return [chain.encode(e) for e in events]


class Encoder:
    """Encodes each event of one run once, for up to two consumers that take the run's
    events in order but at different moments (the trace file at every emit, a store at
    every checkpoint): whichever asks first encodes, the other gets the same line."""

    def __init__(self, chain: Chain, consumers: int) -> None:
        self.chain = chain
        self.consumers = consumers
        # id(event) -> [line, consumers still to take it] (events live in RunState.events
        # for the whole run, so their ids are stable while they are in here)
        self._pending: dict[int, list[Any]] = {}

    def lines(self, events: Iterable[dict[str, Any]]) -> list[str]:
        out: list[str] = []
        pending = self._pending
        for event in events:
            entry = pending.get(id(event))
            if entry is None:
                line = self.chain.encode(event)
                if self.consumers > 1:
                    pending[id(event)] = [line, self.consumers - 1]
            else:
                line = entry[0]
                entry[1] -= 1
                if entry[1] <= 0:
                    del pending[id(event)]
            out.append(line)
        return out


def strip_links(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events read back from chained lines, without the encoder's fields (what the loop
    recorded): a resumed run's ``RunResult.events`` look like a fresh run's."""
    return [
        {k: v for k, v in e.items() if k not in CHAIN_FIELDS} if ("chain" in e or "run" in e) else e
        for e in events
    ]


def continue_chain(
    run_id: str,
    header: dict[str, Any],
    tail: list[dict[str, Any]],
    key: bytes | None,
    consumers: int,
) -> Encoder | None:
    """The encoder of a run: a new run (``tail`` empty: nothing encoded yet) starts the
    chain; a resumed one continues it from the link of its last stored event (``tail``:
    the last two events as stored, links included), in the mode ``header`` names.
    ``None`` where there is no chain to continue (a header without a mode, events stored
    without links).

    Raises :class:`ConfigError` for a signed run resumed without its key, or with another
    key (the last stored link is verified: cheap, and it catches the mix-up before a
    single line is written that no auditor could verify)."""
    mode = header.get("integrity")
    if mode not in MODES:
        return None
    if mode == SIGNED and key is None:
        raise ConfigError(
            f"run {run_id!r} has a signed trace: resume or review it with the runtime's "
            "trace_key (or the CLI's --key-env)"
        )
    use = key if mode == SIGNED else None
    link: Any = ""
    if tail:
        last = tail[-1]
        link = last.get("chain")
        if not isinstance(link, str) or len(link) != LINK_HEX:
            return None
        if use is not None:
            before = tail[-2].get("chain", "") if len(tail) > 1 else ""
            again = Chain(run_id, use, before if isinstance(before, str) else "")
            again.encode(last)
            if again.link != link:
                raise ConfigError(
                    f"run {run_id!r}: this trace_key is not the key its trace was signed with"
                )
    return Encoder(Chain(run_id, use, link), consumers)
