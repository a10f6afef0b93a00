"""A model that asks again for calls a run already made, under the same ids.

Call ids pair results with calls (R1), so a reply that repeats a call of an earlier
round — same id, same tool, same arguments — is a replayed decision the machine cannot
see: the call is admitted as new (a batch's ids are checked against each other only) and
runs again (a keyed write replays its stored result, an approval is asked for again). The
usual cause is a scripted model rebuilt in a new process, which starts its script again
on a resumed run. The runtime warns once per driving, after it, at the cost of one pass
over the history, and only when an id came back: the loop notes each call id it parses
against :func:`call_ids` of the history it began the driving with
(``RunState.call_ids``), so a driving whose ids were all new skips that pass.

A reused id with *another* call is not warned about: the testing kit's ``decide()``
numbers each decision's calls ``c1``, ``c2``, ... on purpose, and the provider validators
judge what their API accepts (Responses refuses a ``call_id`` used twice; Chat and
Messages pair turn by turn).
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["call_ids", "repeated_calls", "warn_repeated_calls"]


def call_ids(messages: list[dict[str, Any]]) -> set[Any]:
    """The ids of every call the history holds, of any role (only an assistant's are
    calls: more ids can only send a driving to :func:`repeated_calls`, never keep one
    from it); what the loop checks each parsed call against (``RunState.call_ids``)."""
    return {
        raw.get("id")
        for message in messages
        if isinstance(calls := message.get("tool_calls"), list)
        for raw in calls
        if isinstance(raw, dict)
    }


def repeated_calls(messages: list[dict[str, Any]], since: int) -> list[tuple[str, str]]:
    """``(call id, tool)`` of the calls asked for in ``messages[since:]`` that repeat a
    call of an earlier assistant message (same id, tool and arguments), in order."""
    # One pass over the history, run after every driving: id -> (its ``function``
    # object, the index of the message that first asked for it; a batch is not compared
    # with itself). A call without a string id or a ``function`` object is not a call.
    # The name and arguments are read only when an id comes back: most never do, and
    # this pass costs every run one step per message.
    if _ids_distinct(messages):
        return []  # a repeat needs an id asked for twice: the common case, settled at once
    earlier: dict[str, tuple[dict[str, Any], int]] = {}
    repeated: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        for raw in calls:
            if not isinstance(raw, dict):
                continue
            call_id, function = raw.get("id"), raw.get("function")
            if not isinstance(call_id, str) or not isinstance(function, dict):
                continue
            first = earlier.get(call_id)
            if first is None:
                earlier[call_id] = (function, index)
                continue
            name = function.get("name")
            if (
                index >= since
                and first[1] < index
                and (first[0].get("name"), first[0].get("arguments"))
                == (name, function.get("arguments"))
                and (call_id, name) not in repeated
            ):
                repeated.append((call_id, str(name)))
    return repeated


def _ids_distinct(messages: list[dict[str, Any]]) -> bool:
    """Whether no two calls of the assistant messages share an id: one comprehension and
    a set, about half the pass below, which then only runs when an id comes back (an
    unhashable id, which that pass skips, sends it there too)."""
    ids = [
        raw.get("id")
        for message in messages
        if message.get("role") == "assistant"
        and isinstance(calls := message.get("tool_calls"), list)
        for raw in calls
        if isinstance(raw, dict)
    ]
    try:
        return len(set(ids)) == len(ids)
    except TypeError:
        return False


def warn_repeated_calls(run_id: str, messages: list[dict[str, Any]], since: int) -> list[str]:
    """Warn if this driving's replies (``messages[since:]``) repeated earlier calls; the
    warnings given, for ``RunResult.warnings``."""
    repeated = repeated_calls(messages, since)
    if not repeated:
        return []
    which = ", ".join(f"{call_id!r} ({tool})" for call_id, tool in repeated)
    message = (
        f"run {run_id!r}: the model asked again for call(s) {which} with the id, tool "
        "and arguments of an earlier round of this run; each was handled as a new call. "
        "A ScriptedModel counts its steps in the process that made it, so one rebuilt "
        "in a new process starts its script again: script runs that resume with "
        "KeyedScriptedModel, which picks its decisions from the history"
    )
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    return [message]
