"""A stored run's trace checked against the store's own idempotency records
(``fsm-agent check --db runs.db RUN...``).

The trace and the idempotency records are written by different steps (events with each
checkpoint, records by the atomic intent operations), so each can vouch for the other:

* a write the trace shows executed (its tool's result, or a result stored before a
  crash) must have a committed record owned by that very call, bound to the digest of
  its arguments;
* a replay must match a committed record of the same tool and arguments, owned by
  another call, whose result is the one the trace says was replayed;
* a record owned by a call of this run that says the write committed must appear in the
  trace as executed, stored or reconciled — a trace that hides an execution does not
  pass; one still pending must not be shown as executed.

What the store cannot show either — that a tool without an idempotency key did not run,
a side effect outside both — only an external ledger can prove (README, "Traces").
"""

from __future__ import annotations

from typing import Any

from fsm_agent._trace.checker import Report, check_report

__all__ = ["audit_run"]


def audit_run(store: Any, run_id: str, *, key: bytes | None = None, name: str = "") -> Report:
    """Check run ``run_id`` of ``store`` (its trace, then the cross-check). Store errors
    (``RunNotFound``, ``CorruptRecord``...) propagate."""
    stored = store.load_run(run_id)
    body = stored.body
    if not stored.events and (body.get("state"), body.get("seq")) == ("deciding", 0):
        # Submitted and never driven: its trace starts with its first driver. Nothing
        # can have run, so no record of it may exist either (checked below).
        report = Report(name or f"run {run_id}", run_id=run_id, writes=[])
        report.notes.append("submitted and not driven yet: no trace to check")
    else:
        report = check_report(
            stored.events, key=key, name=name or f"run {run_id}", collect_writes=True
        )
    find = getattr(store, "find_intents", None)
    if find is None:
        report.notes.append(
            f"{type(store).__name__} cannot list idempotency records: not cross-checked"
        )
        return report
    shown = _writes_have_records(report, find, run_id)
    _records_have_writes(report, find, run_id, shown, last=len(stored.events))
    return report


def _writes_have_records(report: Report, find: Any, run_id: str) -> dict[str, str]:
    """Each write the trace shows executed has its committed record, bound to the same
    arguments; each replay names a committed result of another call. Returns how the
    trace shows each call id."""
    shown: dict[str, str] = {}
    for w in report.writes or []:
        shown.setdefault(w.call_id, w.how)
        if w.how in ("executed", "stored"):
            mine = [r for r in find(run_id=run_id, tool=w.tool) if r.call_id == w.call_id]
            if not mine or mine[0].status != "committed":
                state = "no record" if not mine else f"a {mine[0].status} record"
                report.fail(
                    w.line,
                    f"the trace shows write {w.tool!r} ({w.call_id}) executed, but the store "
                    f"holds {state} of it",
                )
            elif w.digest is not None and mine[0].args_digest != w.digest:
                report.fail(
                    w.line,
                    f"write {w.tool!r} ({w.call_id}): the store's record is bound to other "
                    "arguments than the trace's",
                )
        elif w.how == "replayed":
            records = find(tool=w.tool, args_digest=w.digest) if w.digest else []
            source = [
                r
                for r in records
                if r.status == "committed" and (r.run_id, r.call_id) != (run_id, w.call_id)
            ]
            if not source:
                report.fail(
                    w.line,
                    f"call {w.call_id!r} is answered as a replay of {w.tool!r}, but the store "
                    "holds no committed result with these arguments",
                )
            elif all(r.result != w.value for r in source):
                report.fail(
                    w.line,
                    f"call {w.call_id!r}: the replayed result is not the stored result",
                )
    return shown


def _records_have_writes(
    report: Report, find: Any, run_id: str, shown: dict[str, str], *, last: int
) -> None:
    """Each record the run holds in the store matches what the trace shows of its call:
    a committed result needs a write shown executed (or reconciled), a pending one must
    not be shown executed."""
    for record in find(run_id=run_id):
        how = shown.get(record.call_id)
        if record.status == "committed" and how not in ("executed", "stored", "reconciled"):
            report.fail(
                last,
                f"the store holds a committed result of {record.tool!r} from call "
                f"{record.call_id!r}, but the trace does not show that write executing",
            )
        elif record.status == "pending" and how in ("executed", "stored"):
            report.fail(
                last,
                f"the trace shows {record.tool!r} ({record.call_id}) executed, but its record "
                "is still pending in the store",
            )
