"""Strict JSON parsing and canonical forms shared by approvals, idempotency and traces."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fsm_agent.errors import ArgumentsError

__all__ = ["ArgumentsError", "canonical_json", "digest", "parse_arguments"]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # Some parsers silently keep the last value; the audited payload and the
            # executed one must not be open to two readings.
            raise ArgumentsError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ArgumentsError(f"{name} is not valid JSON")


def parse_arguments(text: str) -> dict[str, Any]:
    """Parse a call's ``arguments`` string: one JSON object, no duplicate keys, no NaN."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except ArgumentsError:
        raise
    except RecursionError:
        raise ArgumentsError("arguments are nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int strings past Python's digit limit
        raise ArgumentsError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def digest(tool: str, arguments: dict[str, Any]) -> str:
    """The hash an approval or idempotency record binds to: tool name + canonical args."""
    text = tool + "\n" + canonical_json(arguments)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
