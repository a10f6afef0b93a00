"""Strict JSON parsing and canonical forms shared by approvals, idempotency and traces.

A call's arguments are accepted only if they have exactly one reading, representable in
every place they go (history, trace, store, approval digest): one JSON object, no
duplicate keys, no ``NaN``/``Infinity`` (also not as ``1e400``), no integer past
:data:`~fsm_agent._core.jsonsafe.MAX_INT_DIGITS` digits, no lone surrogate, nesting at
most :data:`~fsm_agent._core.jsonsafe.MAX_DEPTH` deep (R3, R12).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from fsm_agent._core.jsonsafe import MAX_DEPTH, MAX_INT_DIGITS
from fsm_agent._errors import ArgumentsError

__all__ = ["ArgumentsError", "canonical_json", "digest", "parse_arguments"]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # Some parsers silently keep the last value; the audited payload and the
            # executed one must not be open to two readings.
            raise ArgumentsError(f"duplicate key {_short(key)}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ArgumentsError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ArgumentsError(f"number {_short(text)} is out of range (not a finite double)")
    return value


def _whole(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ArgumentsError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 40 else f"{shown[:30]}... ({len(text)} chars)"


#: What ``json.loads(text, **hooks)`` builds per call (a decoder and its C scanner), built
#: once: the decoder keeps no state between calls (its scanner's memo is cleared after
#: each), and parsing is once per call admitted, twice per call replayed.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates,
    parse_constant=_no_constant,
    parse_float=_finite,
    parse_int=_whole,
)


#: ``_DECODER.decode`` in two calls of its parts (whitespace, then one value, then
#: whitespace to the end), with the same errors: no two Python frames per call parsed.
_SPACE = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
_VALUE = _DECODER.scan_once  # type: ignore[attr-defined]


def parse_arguments(text: str) -> dict[str, Any]:
    """Parse a call's ``arguments`` string under the rules of the module docstring."""
    if not isinstance(text, str):
        raise ArgumentsError(f"arguments must be a JSON string, got {type(text).__name__}")
    try:
        if text.startswith("\ufeff"):  # what json.loads refuses before decoding
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        start = _SPACE(text, 0).end()
        try:
            value, end = _VALUE(text, start)
        except StopIteration as stop:
            raise json.JSONDecodeError("Expecting value", text, stop.value) from None
        end = _SPACE(text, end).end()
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    except ArgumentsError:
        raise
    except RecursionError:
        raise ArgumentsError(f"arguments are nested deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError
        raise ArgumentsError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(value).__name__}")
    # Cheap screens first (the normal case): a lone surrogate can only come from the
    # text itself or from a \\u escape, and nesting is bounded by the bracket count.
    try:
        text.encode("utf-8")
        if "\\u" in text:
            canonical_json(value).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ArgumentsError(
            f"arguments hold a lone surrogate ({exc.object[exc.start : exc.end]!a}): not "
            "representable as UTF-8"
        ) from None
    if (
        len(text) > MAX_DEPTH  # (shorter, it holds too few brackets to count them)
        and text.count("{") + text.count("[") > MAX_DEPTH
        and _depth(value) > MAX_DEPTH
    ):
        raise ArgumentsError(f"arguments are nested deeper than {MAX_DEPTH}")
    return value


def _depth(value: Any) -> int:
    """How deep ``value`` nests (iterative: no recursion limit to hit)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def digest(tool: str, arguments: dict[str, Any]) -> str:
    """The hash an approval or idempotency record binds to: tool name + canonical args."""
    text = tool + "\n" + canonical_json(arguments)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
