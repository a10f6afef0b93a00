"""The JSON Schema formats a tool's arguments are checked against: one format checker
for the tools' validators (``tools/registry.py``) and for ``fsm-agent check``, which
validates recorded arguments again against the schemas its trace header records."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

__all__ = ["CHECKED_FORMATS", "FORMATS", "arguments_validator"]

#: The JSON Schema ``format`` values whose arguments are checked, each by a checker
#: that refuses only what its standard refuses (date-time and time: RFC 3339; date:
#: ISO 8601 full-date; uri and uri-reference: RFC 3986; hostname: RFC 1123; email:
#: lenient, an ``@`` is required; uuid; ipv4; ipv6; json-pointer: RFC 6901; duration:
#: ISO 8601). Other formats (``regex``, whose dialect differs between Python and
#: ECMA-262; ``idn-*``; ``uri-template``; custom ones) are annotations only, as the JSON
#: Schema specification makes every format by default.
CHECKED_FORMATS = (
    "date-time",
    "date",
    "time",
    "uri",
    "uri-reference",
    "hostname",
    "email",
    "uuid",
    "ipv4",
    "ipv6",
    "json-pointer",
    "duration",
)


def _format_checker() -> FormatChecker:
    # Draft 2020-12's own checkers: the class-wide registry holds other drafts' meaning of
    # some names too (draft 3's "time" takes no offset).
    known = Draft202012Validator.FORMAT_CHECKER.checkers
    missing = [f for f in CHECKED_FORMATS if f not in known]
    if missing:  # a checker's package is not installed
        raise ImportError(
            f"jsonschema cannot check the {', '.join(missing)} format(s): "
            "reinstall fsm-agent (it depends on their checker packages)"
        )
    checker = FormatChecker(formats=())
    checker.checkers = {f: known[f] for f in CHECKED_FORMATS}
    return checker


FORMATS = _format_checker()


def arguments_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """The validator of a registered tool's final schema (as ``ToolRegistry`` builds it)."""
    return Draft202012Validator(schema, format_checker=FORMATS)
