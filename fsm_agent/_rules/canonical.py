"""One canonical text, and its digest, for any value a rule may see: never raises.

A rule's inputs come from the run (tool arguments, tool results, the caller's context), so
they may hold what strict JSON refuses: a lone surrogate, an integer of 10 000 digits, a
``NaN``, a list nested 50 000 deep. The trace's digest of a judgement must exist for those
too (the judgement itself fails closed), so :func:`canonical_text` falls back to an
iterative encoder of its own when the strict one refuses. The fallback's text starts with
``!``, which strict JSON never does, so the two forms cannot collide.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "EARLIER_DIGESTS",
    "INPUTS_DIGEST",
    "canonical_text",
    "digest",
    "digest_of_text",
    "inputs_digest",
]

#: How a judgement's inputs digest starts (:func:`inputs_digest`, form 3). Earlier
#: development builds wrote ``sha256:`` (form 1: the inputs as one JSON document) and
#: ``v2:sha256:`` (form 2: ``calls`` as a chain of its entries' digests).
INPUTS_DIGEST = "v3:sha256:"
#: The forms earlier development builds wrote (no release wrote them).
EARLIER_DIGESTS = ("sha256:", "v2:sha256:")

#: Built once: ``json.dumps`` with these options builds an encoder at every call, and a
#: digest is taken at every judgement.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _c_encoder() -> Callable[[Any, int], Any] | None:
    """``_ENCODER``'s C encoder, built once: ``encode`` builds one (and a closure) at
    every call, which costs more than encoding a small value. Used only where it gives
    exactly ``_ENCODER``'s text on a probe (its signature is CPython's, not public)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    probe = {"b": [1, 2.5, None, True, "\u00e9\n"], "a": {"z": -3, "y": ""}}
    try:
        # No markers: a cycle recurses to RecursionError, which canonical_text catches.
        encoder = make(None, _ENCODER.default, json.encoder.encode_basestring, None,
                       ":", ",", True, False, False)  # fmt: skip
        if "".join(encoder(probe, 0)) != _ENCODER.encode(probe):
            return None
    except Exception:  # another interpreter's signature: the public way it is
        return None
    return encoder  # type: ignore[no-any-return]


_C_ENCODER = _c_encoder()
_encode_str = json.encoder.encode_basestring
_sha256 = hashlib.sha256


def canonical_text(value: Any) -> str:
    """Sorted keys, no spaces, strict JSON; the ``!`` form for anything strict JSON refuses."""
    try:
        kind = type(value)
        if kind is str:
            text = _encode_str(value)
        elif _C_ENCODER is not None and (kind is dict or kind is list):
            text = "".join(_C_ENCODER(value, 0))
        else:
            text = _ENCODER.encode(value)
        text.encode("utf-8")  # a lone surrogate passes dumps but not UTF-8
        return text
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return "!" + _robust(value)


def digest(value: Any) -> str:
    """``sha256:`` and the hex digest of :func:`canonical_text`."""
    return digest_of_text(canonical_text(value))


def digest_of_text(text: str) -> str:
    """:func:`digest` of the value whose canonical text is ``text``."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def inputs_digest(phase: str, call_id: Any, parts: Iterable[str]) -> str:
    """A judgement's inputs digest: :data:`INPUTS_DIGEST` and the hex SHA-256 of lines
    ``fsm-agent rule inputs 3``, the phase, the call id's canonical text, then one
    ``name=component`` per variable read, by name (each component a canonical text, a
    ``sha256:`` digest or a ``count:``, none holding a line break)."""
    # (An ASCII id, the model's: its canonical text without the general function.)
    ascii_id = type(call_id) is str and call_id.isascii()
    of_id = _encode_str(call_id) if ascii_id else canonical_text(call_id)
    text = "\n".join(("fsm-agent rule inputs 3", phase, of_id, *parts))
    return INPUTS_DIGEST + _sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _robust(value: Any) -> str:
    """An injective text for any value, built with an explicit stack (no recursion limit)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Token):
            out.append(item.text)
        elif item is None or isinstance(item, bool):
            out.append(json.dumps(item))
        elif isinstance(item, int):
            # hex() has no digit limit (decimal str() refuses past 4300 digits).
            out.append(f"i{hex(item)};")
        elif isinstance(item, float):
            out.append(f"f{item.hex()};" if math.isfinite(item) else f"f{item!r};")
        elif isinstance(item, str):
            out.append(json.dumps(item, ensure_ascii=True))  # escapes lone surrogates
        elif isinstance(item, Mapping):
            keys = sorted(item, key=lambda k: (type(k).__name__, repr(k)))
            stack.append(_Token("}"))
            for key in reversed(keys):
                stack.extend((item[key], _Token(":"), key, _Token(",")))
            out.append("{")
        elif isinstance(item, list | tuple):
            stack.append(_Token("]"))
            for element in reversed(item):
                stack.extend((element, _Token(",")))
            out.append("[")
        else:
            out.append(f"<{type(item).__qualname__}>")
    return "".join(out)


class _Token:
    """Punctuation pushed on the stack between values."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text
