"""Fuzzing the trace reader and checker (issue 12): whatever the bytes, ``check``
answers with violations or one ``TraceError`` — never another exception — and so do
``replay`` and the viewer's loader."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from conftest import Backend, TransientToolError, call, calls, make_runtime, say
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fsm_agent._errors import TraceError
from fsm_agent._render.replay import Replay, describe_step
from fsm_agent._trace import checker
from fsm_agent._trace.chain import LINK_HEX, encode_events, link_bytes
from fsm_agent._trace.checker import check_bytes, check_events, load_trace

CORRUPTIONS = 3000


def _trace() -> bytes:
    b = Backend()
    b.fail_reads = [TransientToolError("flaky")]
    events = (
        make_runtime(
            [
                calls(
                    call("c1", "lookup", order_id="A17"),
                    call("w1", "write", request_id="R", title="t"),
                ),
                say("done"),
            ],
            b,
        )
        .run("go", run_id="fuzzed-run")  # the same bytes, so the same corruptions, every time
        .events
    )
    return "".join(line + "\n" for line in encode_events(events)).encode()


TRACE = _trace()


def _checks(data: bytes) -> None:
    try:
        report = check_bytes(data)
    except TraceError:
        return
    for v in report.violations:
        assert isinstance(v.line, int) and isinstance(v.message, str)


def test_random_byte_corruptions_never_escape() -> None:
    rng = random.Random(12)
    caught = 0
    for _ in range(CORRUPTIONS):
        data = bytearray(TRACE)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            op = rng.randrange(4)
            if op == 0:  # a byte changed (never to itself: that is no corruption)
                data[at] = (data[at] + rng.randrange(1, 256)) % 256
            elif op == 1:
                del data[at : at + rng.randint(1, 40)]
            elif op == 2:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                data[at:at] = rng.choice([b"\n", b"[" * 3000, b'{"a":', b"\xff\xfe", b"\x00"])
        try:
            report = check_bytes(bytes(data))
            caught += not report.ok
        except TraceError:
            caught += 1
    # A corruption that leaves the bytes valid is vanishingly rare; every one is caught.
    assert caught == CORRUPTIONS


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
event_like = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            ["transition", "decision", "observation", "review", "run_end", "run_start", "x"]
        )
        | json_values,
        "seq": st.integers(-2, 40) | json_values,
        "trigger": st.sampled_from(["validate", "dispatch", "observe", "resume"]) | json_values,
        "source": st.sampled_from(["deciding", "executing", "observing"]) | json_values,
        "dest": st.sampled_from(["validating", "executing", "done"]) | json_values,
        "guards": st.dictionaries(
            st.sampled_from(["has_answer", "call_admitted", "is_write"]),
            st.booleans() | json_values,
        )
        | json_values,
        "call_id": st.sampled_from(["c1", "w1"]) | json_values,
        "message": json_values,
        "result": json_values,
        "counters": json_values,
        "outcome": st.sampled_from(["ok", "transient"]) | json_values,
        "action": st.sampled_from(["approve", "deny"]) | json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event_like, max_size=6), st.integers(0, 30))
# Found by this test: a transition whose trigger is a list, in the run's state, once
# escaped the checker's fast path as a TypeError.
@example(
    [{"type": "transition", "source": "executing", "trigger": [], "dest": "validating",
      "guards": {}, "call_id": "c1"}],
    4,
)  # fmt: skip
def test_hypothesis_events_never_escape_the_checker(extra: list[Any], at: int) -> None:
    lines = TRACE.decode().splitlines()
    events = [json.loads(x) for x in lines]
    mixed = events[:at] + extra + events[at:]
    check_events(mixed)  # dicts through the Python API
    data = "".join(json.dumps(e) + "\n" for e in mixed).encode()
    _checks(data)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2000))
def test_hypothesis_bytes_never_escape_check_replay_or_the_loader(
    tmp_path_factory: Any, junk: bytes, at: int
) -> None:
    data = TRACE[:at] + junk + TRACE[at:]
    _checks(data)
    path: Path = tmp_path_factory.mktemp("fz") / "t.jsonl"
    path.write_bytes(data)
    try:
        replay = Replay(path)
    except TraceError:
        return
    for n in range(len(replay)):
        describe_step(replay, n)
    replay.overlay()
    load_trace(path)


_TOKENS = [b'"', b"}", b"{", b"[", b",", b"\\", b"\\ud800", b"\xff", b"\xed\xa0\x80", b"1e400",
           b"NaN", b"9" * 400, b"[" * 120, b'"run":"x",', b',"run":"fuzzed-run"', b',"chain":"',
           b" ", b"\n", b"\x00"]  # fmt: skip


def _relinked(heads: list[bytes]) -> bytes:
    """Lines of ``heads`` (each up to its link), linked with SHA-256 as an honest writer
    would: the check then reads what the edit made of them, not a broken chain only."""
    mac, link, out = link_bytes(None), b"", []
    for head in heads:
        link = mac(link + b"\n" + head)
        out.append(head + link + b'"}\n')
    return b"".join(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.data(),
    st.lists(st.one_of(st.sampled_from(_TOKENS), st.binary(max_size=6)), min_size=1, max_size=4),
    st.sampled_from(["before the fields", "anywhere", "the whole event", "the link"]),
    st.booleans(),
)
def test_hostile_bytes_read_the_same_with_and_without_the_chain_fields_shortcut(
    data: st.DataObject, inserted: list[bytes], where: str, relink: bool
) -> None:
    """Bytes edited into a line: next to the chain's fields the line loop reads it by,
    anywhere, in place of the whole event, or into its link (re-linked, where the link is
    not what was edited, or not). What check reports is what it reports reading every
    line whole, and nothing but violations or a TraceError comes out."""
    lines = TRACE.splitlines(keepends=True)
    at = data.draw(st.integers(0, len(lines) - 1))
    heads = [line[: -LINK_HEX - 3] for line in lines]
    tails = [line[-LINK_HEX - 3 :] for line in lines]
    head, edit = heads[at], b"".join(inserted)
    fields = head.rfind(b',"run":')
    cut = data.draw(st.integers(0, 3))
    if where == "the link":
        start = data.draw(st.integers(0, len(tails[at])))
        tails[at] = tails[at][:start] + edit + tails[at][start + cut :]
        relink = False
    elif where == "the whole event":
        heads[at] = edit + head[fields:]
    else:
        low = max(fields - 40, 0) if where == "before the fields" else 0
        start = data.draw(st.integers(low, fields if where != "anywhere" else len(head)))
        heads[at] = head[:start] + edit + head[start + cut :]
    mutated = _relinked(heads) if relink else b"".join(
        h + t for h, t in zip(heads, tails, strict=True))  # fmt: skip

    def report() -> Any:
        try:
            return [f"{v.line}: {v.message}" for v in check_bytes(mutated).violations]
        except TraceError as exc:
            return ("refused", str(exc))

    shortcut = report()
    chain_fields = checker._chain_fields
    checker._chain_fields = lambda run: None
    try:
        assert report() == shortcut
    finally:
        checker._chain_fields = chain_fields
