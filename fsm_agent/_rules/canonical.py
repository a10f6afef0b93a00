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
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_text", "digest", "digest_spliced"]


#: Built once: ``json.dumps`` with these options builds an encoder at every call, and a
#: digest is taken at every judgement.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_text(value: Any) -> str:
    """Sorted keys, no spaces, strict JSON; the ``!`` form for anything strict JSON refuses."""
    try:
        text = _ENCODER.encode(value)
        text.encode("utf-8")  # a lone surrogate passes dumps but not UTF-8
        return text
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return "!" + _robust(value)


def digest(value: Any) -> str:
    """``sha256:`` and the hex digest of :func:`canonical_text`."""
    text = canonical_text(value)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def digest_spliced(value: Any, mark: str, text: str) -> str | None:
    """:func:`digest` of ``value`` with the one string ``mark`` in it standing for a
    value whose canonical text is ``text`` (known already: a long list kept with a run,
    not encoded again at every judgement); ``None`` where that cannot be told apart
    (``mark`` met elsewhere in ``value``'s text, or the ``!`` form), for the caller to
    digest the value itself."""
    whole = canonical_text(value)
    marked = json.dumps(mark)
    if whole.startswith("!") or whole.count(marked) != 1:
        return None
    whole = whole.replace(marked, text)
    return "sha256:" + hashlib.sha256(whole.encode("utf-8", "surrogatepass")).hexdigest()


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
