"""What the API says about runs, read from the store (blocking: called in a thread)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from fsm_agent._core.actions import BLOCKING
from fsm_agent._core.canonical import digest, parse_arguments
from fsm_agent._durable.review import pending_calls
from fsm_agent._durable.store import RunSummary, StoredRun
from fsm_agent._errors import ArgumentsError
from fsm_agent._trace.chain import dumps_event, encode_events
from fsm_agent.server._errors import ApiError

__all__ = ["FINISHED", "detail_of", "label_of", "page_of_runs", "trace_lines"]

#: States a run never leaves (a paused run leaves review_required when resumed).
FINISHED = frozenset({"done", "budget_exhausted", "protocol_error", "cancelled"})
MAX_LIMIT = 200


def _cursor(summary: RunSummary) -> str:
    raw = json.dumps([summary.updated, summary.run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _parse_cursor(text: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        updated, run_id = json.loads(raw)
        return float(updated), str(run_id)
    except (ValueError, TypeError, binascii.Error):
        raise ApiError(
            400, "bad_request", f"cursor {text[:40]!r} is not one this API gave"
        ) from None


def _limit(text: str | None) -> int:
    if text is None:
        return 50
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ApiError(400, "bad_request", f"limit must be 1..{MAX_LIMIT}, got {text[:20]!r}")
    return int(text)


def label_of(state: str, reason: str, pending: list[dict[str, Any]]) -> str:
    """What a person needs to know: ``waiting for review``, or ``decided, waiting to be
    resumed`` once every blocking call has its decision (the run continues only when a
    worker, ``--app`` or ``Runtime.resume`` drives it), else the state."""
    if state != "review_required":
        return state + (f" ({reason})" if reason else "")
    blocking = [p for p in pending if p["waiting_for"] in BLOCKING]
    if blocking and all(p["review"] for p in blocking):
        return "decided, waiting to be resumed"
    return "waiting for review"


def page_of_runs(store: Any, query: Any) -> dict[str, Any]:
    status, reason = query.get("status") or None, query.get("reason") or None
    limit = _limit(query.get("limit"))
    rows = [r for r in store.list_runs(status) if reason is None or r.reason == reason]
    rows.sort(key=lambda r: (r.updated, r.run_id), reverse=True)
    cursor = query.get("cursor")
    if cursor:
        after = _parse_cursor(cursor)
        rows = [r for r in rows if (r.updated, r.run_id) < after]
    page = rows[:limit]
    items = [summary_json(store, r) for r in page]
    return {
        "runs": items,
        "next_cursor": _cursor(page[-1]) if len(rows) > limit and page else None,
    }


def summary_json(store: Any, r: RunSummary) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_id": r.run_id,
        "status": r.state,
        "reason": r.reason,
        "pending": r.pending,
        "created": r.created,
        "updated": r.updated,
    }
    if r.state == "review_required":  # the one state whose label needs the checkpoint
        out["label"] = label_of(r.state, r.reason, pending_calls(store.load_run(r.run_id)))
    else:
        out["label"] = label_of(r.state, r.reason, [])
    return out


def _digest(tool: Any, arguments: Any) -> str | None:
    try:
        return digest(str(tool), parse_arguments(arguments))
    except (ArgumentsError, TypeError, ValueError):
        return None


def detail_of(stored: StoredRun) -> dict[str, Any]:
    body = stored.body
    state, reason = str(body.get("state", "")), str(body.get("reason") or "")
    pending = pending_calls(stored)
    calls = [
        {
            "call_id": p["call_id"],
            "tool": p["tool"],
            "arguments": p["arguments"],
            "digest": _digest(p["tool"], p["arguments"]),
            "waiting_for": p["waiting_for"],
            "review": p["review"],
        }
        for p in pending
    ]
    return {
        "run_id": stored.run_id,
        "status": state,
        "reason": reason,
        "label": label_of(state, reason, pending),
        "seq": stored.events[-1]["seq"] if stored.events else -1,
        "events": len(stored.events),
        "pending": calls,
        # A cancel asked while a driver held the run, for that driver (or the next) to
        # honour at its next step; ``null`` where none was asked.
        "cancel_requested": (
            None if stored.cancel_request is None else stored.cancel_request.to_json()
        ),
    }


def trace_lines(stored: StoredRun) -> str:
    """The run's JSONL trace: the stored chained lines byte for byte (a store that keeps
    lines), or the events chained now (a memory store keeps plain events)."""
    events = stored.events
    if events and "chain" in events[0]:
        return "".join(dumps_event(e) + "\n" for e in events)
    return "".join(line + "\n" for line in encode_events(events, stored.run_id))
