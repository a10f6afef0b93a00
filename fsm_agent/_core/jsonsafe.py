"""One policy for bytes at the boundary (R12): what the model and the tools hand back is
made JSON-safe before it reaches the history, a trace or a store.

Traces, stores and the histories sent back to providers are strict UTF-8 JSON: no lone
surrogates, no bare ``NaN``/``Infinity``. The policy, everywhere the same:

====================================  ================================================
what comes in                         what is kept
====================================  ================================================
a lone UTF-16 surrogate in a string   U+FFFD in its place (outputs, model text); a
                                      call whose *arguments* hold one is refused as
                                      ``invalid_arguments``
``NaN``, ``Infinity``, ``-Infinity``  the strings ``"NaN"``, ``"Infinity"``,
                                      ``"-Infinity"`` (arguments: refused)
an int of more than 4,000 digits      ``"<int of about N digits>"`` (arguments: refused)
nesting deeper than :data:`MAX_DEPTH`  ``"<nested deeper than 100>"`` at that depth
                                      (arguments: refused)
bytes                                 text, undecodable bytes as ``\\xNN`` escapes
a dict key that is not a string       its ``str()``
any other object                      its ``str()``; ``"<unprintable T>"`` if that raises
a cycle                               ``"<cycle>"``
====================================  ================================================

Arguments are never repaired: a call whose arguments cannot be represented exactly is
refused, so what is approved, hashed and executed is one payload (``canonical.py``).
The fast path (already JSON-safe data, the normal case) costs one ``json.dumps`` and one
UTF-8 encode, both needed anyway.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from json.encoder import c_make_encoder  # type: ignore[attr-defined]
from json.scanner import c_make_scanner  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "MAX_DEPTH", "MAX_INT_DIGITS", "c_dumps", "clean_text", "copy_json", "dumps_safe",
    "make_safe",
]  # fmt: skip

#: Deepest nesting kept (and accepted in arguments). Deep enough for any real payload,
#: far from Python's recursion limit.
MAX_DEPTH = 100
#: Longest integer kept as a number (Python refuses ``str()`` past 4,300 digits).
MAX_INT_DIGITS = 4000
_MAX_INT = 10**MAX_INT_DIGITS


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (unchanged if there is none)."""
    if text.isascii():  # O(1) in CPython (a flag of the string): the common case
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _describe_int(value: int) -> str:
    return f"<int of about {int(value.bit_length() * 0.30103) + 1} digits>"


def _unprintable(value: object) -> str:
    try:
        return clean_text(str(value))
    except Exception:  # a __str__ that raises is data too: name what it was
        try:
            name = type(value).__name__
        except Exception:
            name = "object"
        return f"<unprintable {name}>"


def make_safe(value: Any, _depth: int = 0, _seen: set[int] | None = None) -> Any:
    """A JSON-safe copy of ``value`` under the module's policy."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value) if -_MAX_INT < value < _MAX_INT else _describe_int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else _non_finite(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if _depth >= MAX_DEPTH:
        return f"<nested deeper than {MAX_DEPTH}>"
    if isinstance(value, (dict, list, tuple)):
        seen = set() if _seen is None else _seen
        if id(value) in seen:
            return "<cycle>"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                return {_key(k): make_safe(v, _depth + 1, seen) for k, v in value.items()}
            return [make_safe(v, _depth + 1, seen) for v in value]
        except Exception:  # a container subclass whose iteration raises
            return _unprintable(value)
        finally:
            seen.discard(id(value))
    return _unprintable(value)


def _key(key: Any) -> str:
    return clean_text(key) if isinstance(key, str) else _unprintable(key)


def _non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _c_encoder(item: str, key: str, allow_nan: bool) -> Callable[[Any, int], Any] | None:
    """The C encoder ``json.dumps(ensure_ascii=False, allow_nan=..., separators=(item,
    key))`` builds per call, built once: ``encode(value, 0)`` gives the chunks of the
    text. No circular check (a cycle recurses to ``RecursionError``, which
    :func:`dumps_safe` handles as any value that is not JSON). ``None`` where the
    interpreter has no C accelerator."""
    if c_make_encoder is None:
        return None
    from json.encoder import c_encode_basestring  # type: ignore[attr-defined]

    encode: Callable[[Any, int], Any] = c_make_encoder(
        None, json.JSONEncoder().default, c_encode_basestring, None, key, item,
        False, False, allow_nan,
    )  # fmt: skip
    return encode


def c_dumps(
    item: str = ", ", key: str = ": ", *, allow_nan: bool = False
) -> Callable[[Any], str] | None:
    """``json.dumps(value, ensure_ascii=False, allow_nan=..., separators=(item, key))``
    without its per-call set-up (a new ``JSONEncoder`` and C encoder every call: half the
    cost of encoding a small reply, twice per tool round). The same C encoder
    ``json.dumps`` builds, built once (:func:`_c_encoder`). ``None`` where the
    interpreter has no C accelerator."""
    encode = _c_encoder(item, key, allow_nan)
    if encode is None:
        return None
    join = "".join

    def dumps(value: Any) -> str:
        return join(encode(value, 0))

    return dumps


def _plain_dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


#: The encoder :func:`dumps_safe` calls directly (no wrapper call: twice per tool round).
_encode = _c_encoder(", ", ": ", False)
#: Valid JSON nested n deep has n openers and n closers: a text this short cannot nest
#: too deep (most replies and results), so it is not scanned (:func:`_depth_ok`).
_SHORT = 2 * MAX_DEPTH + 1


def dumps_safe(value: Any) -> tuple[str, bytes, bool]:
    """``(text, utf8, changed)``: ``value`` as compact JSON text and its UTF-8 bytes, after
    :func:`make_safe` if it was not already JSON-safe (``changed`` says so)."""
    try:
        text = _plain_dumps(value) if _encode is None else "".join(_encode(value, 0))
        data = text.encode("utf-8")
        if len(text) <= _SHORT or _depth_ok(text):
            return text, data, False
    except Exception:  # not JSON as is (types, NaN, surrogates, huge ints, depth, ...)
        pass
    text = json.dumps(make_safe(value), ensure_ascii=False, allow_nan=False)
    return text, text.encode("utf-8"), True


_scan = None if c_make_scanner is None else c_make_scanner(json.JSONDecoder())


def copy_json(text: str) -> Any:
    """The value of JSON ``text`` that this module wrote (:func:`dumps_safe`): a fresh
    copy of what was encoded, as ``json.loads`` reads it, minus its per-call checks (the
    text is ours: no leading space, nothing after the value)."""
    if _scan is None:
        return json.loads(text)
    return _scan(text, 0)[0]


def _depth_ok(text: str) -> bool:
    """Whether JSON ``text`` nests at most :data:`MAX_DEPTH` deep (bracket count; strings
    may hold brackets, which only makes this stricter, never looser)."""
    if len(text) <= _SHORT:  # (a count of each bracket costs more than this test)
        return True
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return True
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest <= MAX_DEPTH
