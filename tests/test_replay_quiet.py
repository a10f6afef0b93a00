"""Check by replay at the walker's speed (issue 18, performance): a run without rules is
replayed without an emit after every edge (``Replay.quiet``) and without its checkpoints
(kept only when a resume needs one: the trace is then replayed again). Neither may change
what ``check`` reports: every test here compares with the replay that emits after every
edge and keeps every checkpoint, or shows the case each safeguard is there for."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import mutation_suite
import pytest
from conftest import Backend, Budget, call, calls, make_runtime, say

from fsm_agent._core.events import Transitioned
from fsm_agent._runtime.interceptors import Interceptor
from fsm_agent._trace import checker, replay
from fsm_agent._trace.chain import dumps_event, encode_events, link_function, strip_links
from fsm_agent._trace.checker import check_bytes, check_trace
from fsm_agent.testing._faults import InjectedInterrupt
from fsm_agent.testing._suite import SUITE

TICKET = {"request_id": "R-1", "title": "Damaged parcel"}


def _bytes(events: list[dict[str, Any]]) -> bytes:
    return ("\n".join(encode_events(events)) + "\n").encode()


def _reference(data: bytes) -> list[str]:
    """What the replay that emits after every edge and keeps every checkpoint reports."""
    quiet = replay.QUIET
    replay.QUIET = False
    try:
        report = checker._check_stream("<bytes>", io.BytesIO(data), None, False, saving=True)
    finally:
        replay.QUIET = quiet
    return [f"{v.line}: {v.message}" for v in report.violations]


def _found(data: bytes) -> list[str]:
    return [f"{v.line}: {v.message}" for v in check_bytes(data).violations]


class _CtrlC(Interceptor):
    """Ctrl-C at the emit after the n-th dispatch (a driver stopping the run there)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def on_event(self, event: Any) -> None:
        if isinstance(event, Transitioned) and event.trigger == "dispatch":
            self.seen += 1
            if self.seen == self.n:
                raise InjectedInterrupt(f"Ctrl-C after dispatch {self.n}")


def test_a_cancel_deep_in_a_batch_of_refused_calls_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 calls of an unknown tool are refused one after another by pure edges (dispatch,
    observe), more than the quiet lookahead holds; the run is stopped at the emit after
    the 35th. The batch's size makes the replay emit after every edge, so it stops the
    loop where the driver did."""
    batch = calls(*[call(f"c{i}", "nope", q=i) for i in range(40)])
    rt = make_runtime(
        [batch, say("done")],
        budget=Budget(max_calls_per_round=50, max_total_calls=100),
        interceptors=[_CtrlC(35)],
    )
    path = tmp_path / "big.jsonl"
    with pytest.raises(InjectedInterrupt):
        rt.run("go", run_id="big", trace=path)
    data = path.read_bytes()
    cancel = [e for e in map(json.loads, data.splitlines()) if e.get("trigger") == "cancel"]
    assert [e["call_id"] for e in cancel] == ["c34"]
    assert _found(data) == [] == _reference(data)
    # Without the batch's guard the loop would run past the cancel in one go:
    monkeypatch.setattr(replay, "_QUIET_BATCH", 1000)
    assert "the trace records transition cancel" in " ".join(_found(data))


def _suite_traces() -> list[list[dict[str, Any]]]:
    traces = [scenario.run().result.events for scenario in SUITE]
    store_run = make_runtime(
        [calls(call("w1", "write", **TICKET)), say("done")],
        Backend(),
        store=__import__("fsm_agent").MemoryStore(),
        approval=True,
    )
    store_run.run("go", run_id="r1")
    traces.append(store_run.approve("r1", "w1", resume=True).events)
    return traces


def test_every_suite_trace_and_its_deletions_report_what_the_reference_replay_does() -> None:
    """The edge suite's runs (cancels and resumes among them) and every trace with one
    event deleted: the same violations, word for word, as emitting after every edge and
    keeping every checkpoint."""
    compared = 0
    for events in _suite_traces():
        data = _bytes(events)
        assert _found(data) == _reference(data) == []
        for index in range(1, len(events)):
            mutated = _bytes(events[:index] + events[index + 1 :])
            assert _found(mutated) == _reference(mutated), index
            compared += 1
    assert compared > 400


def test_a_resume_from_a_checkpoint_not_kept_replays_the_trace_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A trace whose resume names a checkpoint before the state replayed so far: the
    first pass keeps none, so it starts again keeping them, and reports what the
    reference does (a file, bytes in memory, and a stream that cannot be read twice)."""
    rewinds: list[int] = []
    restart = replay.Replay._restart

    def counted(self: replay.Replay, line: int, nxt: dict[str, Any]) -> None:
        try:
            restart(self, line, nxt)
        except replay.Rewind:
            rewinds.append(line)
            raise

    monkeypatch.setattr(replay.Replay, "_restart", counted)
    events = _suite_traces()[-1]  # paused, reviewed, resumed from the review's checkpoint
    resume = next(i for i, e in enumerate(events) if e.get("trigger") == "resume")
    mutated = _bytes(events[: resume - 1] + events[resume:])  # the review's edge deleted
    expected = _reference(mutated)
    assert expected and "resumed from its checkpoint" in " ".join(expected)
    rewinds.clear()
    assert _found(mutated) == expected
    assert rewinds, "the first pass did not rewind"
    path = tmp_path / "t.jsonl"
    path.write_bytes(mutated)
    assert [f"{v.line}: {v.message}" for v in check_trace(path).violations] == expected
    if hasattr(os, "mkfifo"):  # a pipe: read once, keeping the checkpoints from the start
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        writer = threading.Thread(target=fifo.write_bytes, args=(mutated,))
        writer.start()
        rewinds.clear()
        report = check_trace(fifo)
        writer.join()
        assert [f"{v.line}: {v.message}" for v in report.violations] == expected
        assert not rewinds


def test_the_mutation_suite_reports_what_the_reference_replay_does() -> None:
    """Every single-event mutation of the suite's traces (deletions, insertions, swaps,
    changed edges, flipped and dropped guards, payload edits, splices, forged headers),
    re-linked: the same violations as the reference replay."""
    traces = [strip_links(events) for events in _suite_traces()]
    checked = 0
    for t, events in enumerate(traces):
        other = traces[(t + 1) % len(traces)]
        for _, mutated in mutation_suite.mutations(events, other):
            data = mutation_suite.unsigned_attack(mutated)
            assert _found(data) == _reference(data)
            checked += 1
    assert checked > 1000


def test_a_line_parsed_whole_reports_what_one_parsed_without_its_chain_fields_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The line loop reads a line that ends as its run's lines do (``Chain.encode``'s
    fields, a link, ``"}``) without the chain's fields, and any other line whole; events
    reach the replay in chunks either way. Forced to read every line whole, every
    mutation of the suite's traces reports the same, word for word: signed (checked with
    the key and without it: the links then go unverified) and unsigned, re-linked."""
    cases: list[tuple[bytes, bytes | None]] = []
    traces = [strip_links(events) for events in _suite_traces()]
    for t, plain in enumerate(traces):
        head = {**plain[0], "integrity": "hmac-sha256"}
        key = mutation_suite.KEY
        signed = [json.loads(x) for x in encode_events([head, *plain[1:]], key=key)]
        other = strip_links(traces[(t + 1) % len(traces)])
        for kind, mutated in mutation_suite.mutations(signed, other):
            attacked = mutation_suite.signed_attack([], mutated, kind)
            cases += [(attacked, key), (attacked, None)]
        for _, mutated in mutation_suite.mutations(plain, other):
            cases.append((mutation_suite.unsigned_attack(mutated), None))

    def reports() -> list[list[str]]:
        return [
            [f"{v.line}: {v.message}" for v in check_bytes(data, key=key).violations]
            for data, key in cases
        ]

    read_without_fields = reports()
    monkeypatch.setattr(checker, "_chain_fields", lambda run: None)
    assert reports() == read_without_fields
    assert len(cases) > 3000
    assert sum(map(bool, read_without_fields)) > len(cases) // 2  # most are caught


def _linked(bodies: list[str], run: str) -> bytes:
    """Lines of run ``run`` as ``Chain.encode`` closes them, around any ``bodies`` (an
    event's JSON without its closing brace, or text that is none), linked with SHA-256."""
    mac, link, out = link_function(None), "", []
    for body in bodies:
        head = body + ',"run":' + json.dumps(run) + ',"chain":"'
        link = mac((link + "\n" + head).encode())
        out.append(head + link + '"}\n')
    return "".join(out).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("{", "not JSON"),  # {,"run":...}: the event read without the fields would be {}
        ("[1", "not JSON"),
        ('{"a":1} ', "not JSON"),
        ('{"a":1}}', "not JSON"),
        # The run id written twice: the last one counts (this run's), as in any parse.
        ('<event>,"run":"another","chain":"0"', None),
    ],
)
def test_a_line_closed_as_its_runs_lines_but_no_event_reads_as_parsed_whole(
    monkeypatch: pytest.MonkeyPatch, body: str, expected: str | None
) -> None:
    """What the fields' shortcut must not accept: a line that ends as its run's lines do
    but is no JSON object, or an empty one, once they are taken off. Reported as the
    whole line's parse reports it, at its line."""
    events = strip_links(_suite_traces()[0])
    run = events[0]["run_id"]
    bodies = [dumps_event(e)[:-1] for e in events]
    assert check_bytes(_linked(bodies, run)).ok
    bodies[2] = body.replace("<event>", bodies[2])
    data = _linked(bodies, run)
    found = _found(data)
    if expected is None:
        assert found == []
    else:
        assert any(f.startswith("3: ") and expected in f for f in found), found
    monkeypatch.setattr(checker, "_chain_fields", lambda run: None)
    assert _found(data) == found
