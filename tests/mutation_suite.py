"""The trace mutation suite (issue 12): every kind of single-event tampering, applied to
real traces (the demo scenarios, the per-edge scenario suite, durable runs), against two
attackers:

* **with a key** — the trace was signed (``Runtime(trace_key=...)``); the attacker edits
  the file but does not have the key: unchanged lines keep their bytes, changed ones keep
  the link they had (or the attacker relinks them with plain SHA-256 and says so in the
  header: the "integrity downgrade" forgery);
* **without a key** — the trace is unsigned, and the attacker re-links the whole file
  after the edit (anyone can recompute SHA-256 links): what is left to catch it is what
  the trace itself implies (``trace/walk.py``).

Each kind is applied at up to :data:`PER_KIND` positions of each trace.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from fsm_agent._core.table import STATES
from fsm_agent._trace.chain import dumps_event, encode_events, strip_links
from fsm_agent._trace.checker import check_bytes

KEY = b"mutation-suite-key"
PER_KIND = 6
KINDS = (
    "delete",
    "insert",
    "swap",
    "swap+renumber",
    "change dest",
    "change reason",
    "change trigger",
    "flip a guard",
    "drop a guard",
    "edit a payload",
    "splice two runs",
    "splice, re-linked",
    "forge the header",
)
#: How the documentation names each kind (README and docs/concepts/traces.md).
LABELS = {
    "delete": "delete an event (renumbered)",
    "insert": "insert a copy of an event (renumbered)",
    "swap": "swap two events",
    "swap+renumber": "swap two events and renumber",
    "change dest": "change a transition's destination",
    "change reason": "change a transition's reason",
    "change trigger": "change a transition's trigger",
    "flip a guard": "flip a guard outcome",
    "drop a guard": "drop a guard outcome",
    "edit a payload": "edit a payload (same length)",
    "splice two runs": "splice another run's lines in",
    "splice, re-linked": "splice another run in, rewritten as this run's",
    "forge the header": "forge a header setting the run depended on",
}
_TRIGGERS = (
    "model_replied",
    "validate",
    "dispatch",
    "tool_returned",
    "observe",
    "retry",
    "cancel",
    "resume",
    "model_failed",
)

Events = list[dict[str, Any]]


def _spread(n: int, k: int = PER_KIND) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _renumber(events: Events) -> Events:
    for n, e in enumerate(events):
        e["seq"] = n
    return events


def _edit_text(value: str) -> str:
    return value[:-1] + ("X" if not value.endswith("X") else "Y") if value else "X"


def _edit_payload(e: dict[str, Any]) -> bool:
    """A same-length edit of the event's payload (a careful forger keeps sizes)."""
    kind = e.get("type")
    if kind == "observation" and isinstance(e.get("result"), dict):
        result = e["result"]
        for k in ("value", "detail"):
            v = result.get(k)
            if isinstance(v, str) and v:
                result[k] = _edit_text(v)
                return True
            if isinstance(v, dict):
                for kk, vv in v.items():
                    if isinstance(vv, str) and vv:
                        v[kk] = _edit_text(vv)
                        return True
        return False
    if kind == "decision" and isinstance(e.get("message"), dict):
        content = e["message"].get("content")
        if isinstance(content, str) and content.strip():
            e["message"]["content"] = _edit_text(content)
            return True
        return False
    if kind == "transition" and e.get("detail"):
        e["detail"] = _edit_text(e["detail"])
        return True
    if kind == "review" and e.get("reason"):
        e["reason"] = _edit_text(e["reason"])
        return True
    return False


def _header_forgeries(events: Events) -> Iterator[Events]:
    """Forged settings the run depended on (a limit it reached, a tool it called)."""
    head = events[0]
    transitions = [e for e in events if e["type"] == "transition"]
    started = [e for e in transitions if e["trigger"] == "dispatch" and e["dest"] == "executing"]
    called = {e.get("tool") for e in started} - {None}

    def forged(**fields: Any) -> Events:
        out = copy.deepcopy(events)
        out[0].update(fields)
        return out

    if any("strict_policy" in e.get("guards", {}) for e in transitions):
        yield forged(policy="default" if head["policy"] == "strict" else "strict")
    if called:
        yield forged(allowed_tools=sorted(set(head["allowed_tools"]) - called))
        tools = copy.deepcopy(head["tools"])
        for name in called & set(tools):
            tools[name]["effect"] = "read" if tools[name]["effect"] == "write" else "write"
        yield forged(tools=tools)
    if any(e.get("guards", {}).get("attempts_left") for e in transitions):
        yield forged(retry={**head["retry"], "max_attempts": 1})
    if any(str(e.get("approval", "")).startswith("config:") for e in started):
        yield forged(approvals=[])
    used = events[-1].get("counters", {}) if events[-1]["type"] == "run_end" else {}
    budget = dict(head["budget"])
    for limit, counter in (
        ("max_model_calls", "model_calls"),
        ("max_tool_rounds", "tool_rounds"),
        ("max_total_calls", "tool_calls"),
    ):
        if used.get(counter, 0) >= 2:
            yield forged(budget={**budget, limit: used[counter] - 1})


def mutations(events: Events, other: Events) -> Iterator[tuple[str, Events]]:
    """``(kind, mutated events)`` for each single-event mutation of ``events``
    (``other``: a second run to splice with)."""
    n = len(events)
    inner = list(range(1, n))
    for i in (inner[j] for j in _spread(len(inner))):
        yield "delete", _renumber(copy.deepcopy(events[:i] + events[i + 1 :]))
        yield "insert", _renumber(copy.deepcopy([*events[: i + 1], events[i], *events[i + 1 :]]))
    pairs = [i for i in range(1, n - 1) if strip_links([events[i]]) != strip_links([events[i + 1]])]
    for i in (pairs[j] for j in _spread(len(pairs))):
        swapped = copy.deepcopy(events)
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
        yield "swap", swapped
        yield "swap+renumber", _renumber(copy.deepcopy(swapped))
    transitions = [i for i, e in enumerate(events) if e["type"] == "transition"]
    for i in (transitions[j] for j in _spread(len(transitions))):
        e = events[i]
        for kind, field, value in (
            ("change dest", "dest", next(s for s in STATES if s != e["dest"])),
            (
                "change reason",
                "reason",
                "cancelled" if e.get("reason") != "cancelled" else "tokens",
            ),
            ("change trigger", "trigger", next(t for t in _TRIGGERS if t != e["trigger"])),
        ):
            changed = copy.deepcopy(events)
            changed[i][field] = value
            yield kind, changed
    guards = [(i, g) for i in transitions for g in events[i].get("guards") or {}]
    for i, g in (guards[j] for j in _spread(len(guards))):
        flipped = copy.deepcopy(events)
        flipped[i]["guards"][g] = not flipped[i]["guards"][g]
        yield "flip a guard", flipped
        dropped = copy.deepcopy(events)
        del dropped[i]["guards"][g]
        yield "drop a guard", dropped
    payloads = [i for i in range(1, n) if _edit_payload(copy.deepcopy(events[i]))]
    for i in (payloads[j] for j in _spread(len(payloads))):
        edited = copy.deepcopy(events)
        _edit_payload(edited[i])
        yield "edit a payload", edited
    cuts = [i for i in range(2, min(n, len(other)))]
    for i in (cuts[j] for j in _spread(len(cuts))):
        # Lines of another run's file pasted in as they are...
        pasted = copy.deepcopy(events[:i] + other[i:])
        if strip_links(pasted) == strip_links(events):
            continue
        yield "splice two runs", pasted
        # ...or rewritten as this run's (its run id, renumbered; re-linked by the attacker
        # where there is no key).
        spliced = copy.deepcopy(pasted)
        for e in spliced[i:]:
            e["run"] = events[0].get("run", e.get("run"))
        yield "splice, re-linked", _renumber(spliced)
    for forged in _header_forgeries(events):
        yield "forge the header", forged


def signed_attack(lines: list[str], mutated: Events, kind: str) -> bytes:
    """The attacker without the key: every event written back as it now is (lines the
    attacker did not touch are byte for byte the same); a forged header may also claim
    the trace is unsigned and relink everything with SHA-256."""
    if kind == "forge the header":
        mutated = copy.deepcopy(mutated)
        mutated[0]["integrity"] = "sha256"
        relinked = encode_events(strip_links(mutated), run_id=mutated[0]["run_id"])
        return "".join(line + "\n" for line in relinked).encode()
    return "".join(dumps_event(e) + "\n" for e in mutated).encode()


def unsigned_attack(mutated: Events) -> bytes:
    """The attacker of an unsigned trace: relinks the whole file after the edit."""
    events = strip_links(mutated)
    return "".join(
        line + "\n" for line in encode_events(events, run_id=events[0]["run_id"])
    ).encode()


def run(traces: list[Events]) -> dict[str, dict[str, int]]:
    """Counts per kind: generated, caught with a key, caught without one."""
    table: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    for t, events in enumerate(traces):
        plain = strip_links(events)
        signed_head = {**plain[0], "integrity": "hmac-sha256"}
        signed = [json.loads(x) for x in encode_events([signed_head, *plain[1:]], key=KEY)]
        unsigned = [json.loads(x) for x in encode_events(plain)]
        assert check_bytes(unsigned_attack(unsigned)).ok, "a real trace must check clean"
        assert check_bytes(signed_attack([], signed, ""), key=KEY).ok
        other = traces[(t + 1) % len(traces)]
        other_signed = [
            json.loads(x)
            for x in encode_events(
                [{**strip_links(other)[0], "integrity": "hmac-sha256"}, *strip_links(other)[1:]],
                key=KEY,
            )
        ]
        other_unsigned = [json.loads(x) for x in encode_events(strip_links(other))]
        for (kind, mutated), (_, plain_mutated) in zip(
            mutations(signed, other_signed),
            mutations(unsigned, other_unsigned),
            strict=True,
        ):
            table[kind]["generated"] += 1
            if not check_bytes(signed_attack([], mutated, kind), key=KEY).ok:
                table[kind]["with key"] += 1
            mutated = plain_mutated
            # Pasted lines keep their own run id and links; everything else is re-linked.
            if kind == "splice two runs":
                tampered = "".join(dumps_event(e) + "\n" for e in mutated).encode()
            else:
                tampered = unsigned_attack(mutated)
            if not check_bytes(tampered).ok:
                table[kind]["without key"] += 1
    return {k: dict(v) for k, v in table.items()}


def format_table(table: dict[str, dict[str, int]]) -> str:
    rows = [
        "| mutation | generated | caught with a key | caught without a key |",
        "|---|---|---|---|",
    ]
    for kind, c in table.items():
        g = c.get("generated", 0)
        rows.append(
            f"| {LABELS[kind]} | {g} | {c.get('with key', 0)} | {c.get('without key', 0)} |"
        )
    return "\n".join(rows)
