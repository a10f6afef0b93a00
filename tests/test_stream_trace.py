"""What the trace keeps of a streamed reply (issue 20 item 7): per block by default, the
raw deltas with ``trace_deltas=True``, and ``check`` folding them to the message."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import call, calls, make_runtime, say
from stream_server import Play, StreamServer, body_of, recorded
from test_stream_recorded import APIS, USER, _adapter

from fsm_agent import Runtime, ToolRegistry
from fsm_agent._core.events import TextDelta, ToolArgsDelta
from fsm_agent._core.streamed import digest_of, fold_problems
from fsm_agent._errors import ConfigError, ModelError
from fsm_agent._runtime.context import reset_trace_deltas, set_trace_deltas
from fsm_agent._trace.checker import check_events
from fsm_agent.models import StreamingScriptedModel


@pytest.fixture(scope="module")
def server() -> Iterator[StreamServer]:
    with StreamServer() as s:
        yield s


def _script() -> list[Any]:
    return [
        calls(call("c1", "lookup", order_id="A17"), content="Let me look that up."),
        say("A17 is in transit, arriving Thursday."),
    ]


def _streamed_run(trace_deltas: bool) -> tuple[Any, list[Any]]:
    runtime = make_runtime(_script())
    runtime.model = StreamingScriptedModel(_script(), chunk=4)
    with runtime.stream("Where is A17?", capacity=10_000, trace_deltas=trace_deltas) as run:
        events = list(run)
    return run.result, events


def _decisions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "decision"]


def test_by_default_the_trace_keeps_each_block_coalesced() -> None:
    result, _ = _streamed_run(trace_deltas=False)
    first = _decisions(result.events)[0]["message"]
    text, args = first["streamed"]
    assert (text["kind"], text["chars"], text["deltas"]) == ("text", 20, 5)
    assert (args["kind"], args["call_id"], args["chars"]) == ("tool_args", "c1", 19)
    assert "pieces" not in text and "pieces" not in args
    assert check_events(result.events) == []


def test_trace_deltas_keeps_the_raw_deltas_the_consumer_saw() -> None:
    result, events = _streamed_run(trace_deltas=True)
    first, second = (d["message"] for d in _decisions(result.events))
    text, args = first["streamed"]
    seen_text = [e.text for e in events if isinstance(e, TextDelta)]
    seen_args = [e.fragment for e in events if isinstance(e, ToolArgsDelta)]
    assert text["pieces"] + second["streamed"][0]["pieces"] == seen_text
    assert args["pieces"] == seen_args
    assert "".join(text["pieces"]) == first["content"] == "Let me look that up."
    assert digest_of(text["pieces"]) == text["sha256"]
    assert check_events(result.events) == []


def _violations(events: list[dict[str, Any]]) -> str:
    return " | ".join(v.message for v in check_events(events))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda m: m["streamed"][0]["pieces"].__setitem__(1, " ME "), "a delta changed"),
        (lambda m: m["streamed"][0]["pieces"].pop(), "records 5 deltas but keeps 4"),
        (lambda m: m["streamed"][1]["pieces"].__setitem__(3, ' "B1'), "a delta changed"),
        (lambda m: m.__setitem__("content", "Let me look THAT up."), "do not join"),
        (lambda m: m["streamed"][1].__setitem__("call_id", "c9"), "which the message lacks"),
    ],
    ids=["edited-delta", "dropped-delta", "edited-argument-delta", "edited-message", "call"],
)
def test_check_finds_a_delta_or_message_that_no_longer_folds(mutate: Any, expected: str) -> None:
    result, _ = _streamed_run(trace_deltas=True)
    events = copy.deepcopy(result.events)
    mutate(_decisions(events)[0]["message"])
    assert expected in _violations(events)


def test_an_argument_delta_edited_with_its_digest_still_does_not_fold() -> None:
    result, _ = _streamed_run(trace_deltas=True)
    events = copy.deepcopy(result.events)
    args = _decisions(events)[0]["message"]["streamed"][1]
    assert args["pieces"][3] == ' "A1'
    args["pieces"][3] = ' "B1'
    args["sha256"] = digest_of(args["pieces"])  # a forger who recomputed the digest
    assert "do not fold to its arguments" in _violations(events)


def test_without_raw_deltas_check_still_compares_the_lengths() -> None:
    result, _ = _streamed_run(trace_deltas=False)
    events = copy.deepcopy(result.events)
    _decisions(events)[0]["message"]["content"] = "Let me look that up, please."
    assert "the text deltas are 20 characters" in _violations(events)


def test_trace_deltas_must_be_a_bool() -> None:
    runtime = Runtime(
        model=lambda m, t: {"role": "assistant", "content": "x"},
        tools=ToolRegistry(),
        allowed_tools=(),
    )
    with pytest.raises(ConfigError, match="trace_deltas must be True or False"):
        runtime.stream("x", trace_deltas="yes")  # type: ignore[arg-type]


ALL = [pytest.param(e, id=e["file"].split("/")[1][:60]) for api in APIS for e in recorded(api)]


@pytest.mark.parametrize("entry", ALL)
@pytest.mark.parametrize("keep", [False, True], ids=["coalesced", "raw"])
def test_every_recorded_stream_folds_to_its_reply(
    server: StreamServer, entry: dict[str, Any], keep: bool
) -> None:
    model = _adapter(entry["api"], server.url)
    server.queue(Play(body_of(entry), splits=range(11, 1_000_000, 53)))
    token = set_trace_deltas(keep)
    try:
        reply = model(list(USER), [])
    except ModelError:
        pytest.skip("a stream our adapter refuses (server tools): no reply to fold")
    finally:
        reset_trace_deltas(token)
    assert "streamed" in reply
    assert all(("pieces" in b) is keep for b in reply["streamed"])
    assert fold_problems(reply) == []
    if keep:  # and a reply whose deltas were edited does not fold
        edited = copy.deepcopy(reply)
        if edited["streamed"]:  # (a reply of one empty tool call streams no delta)
            block = edited["streamed"][-1]
            block["pieces"][-1] = block["pieces"][-1][:-1] + "\u2603"
            assert fold_problems(edited) != []


def test_a_recorded_stream_through_runtime_stream_keeps_its_deltas(server: StreamServer) -> None:
    (entry,) = [e for e in recorded("chat") if e["file"].endswith("agent_run_stream-0-6acc6a.sse")]
    runtime = Runtime(model=_adapter("chat", server.url), tools=ToolRegistry(), allowed_tools=())
    server.queue(Play(body_of(entry)))
    with runtime.stream("hi", capacity=10_000, trace_deltas=True) as run:
        seen = [e.text for e in run if isinstance(e, TextDelta)]
    (decision,) = _decisions(run.result.events)
    assert decision["message"]["streamed"][0]["pieces"] == seen
    assert check_events(run.result.events) == []


def test_a_redacted_message_whose_deltas_no_longer_fold_is_a_note_not_a_violation() -> None:
    def redact(event: dict[str, Any]) -> dict[str, Any]:
        message = event.get("message")
        if event["type"] == "decision" and isinstance(message, dict) and message.get("content"):
            return {**event, "message": {**message, "content": "[redacted]"}}
        return event

    script = _script()
    runtime = make_runtime(script, redact=redact)
    runtime.model = StreamingScriptedModel(script, chunk=4)
    with runtime.stream("Where is A17?", trace_deltas=True) as run:
        list(run)
    events = run.result.events
    assert events[0]["redacted"] is True
    assert check_events(events) == []  # the hook changed it: said in the report's note
    strict = copy.deepcopy(events)
    del strict[0]["redacted"]
    assert "the text deltas are 20 characters" in _violations(strict)


def test_reasoning_deltas_fold_to_the_message_reasoning() -> None:
    thought = {"role": "assistant", "content": "Thursday.", "reasoning_content": "A17 left."}
    runtime = make_runtime([thought])
    runtime.model = StreamingScriptedModel([thought], chunk=3)
    with runtime.stream("When?", trace_deltas=True) as run:
        list(run)
    events = copy.deepcopy(run.result.events)
    assert check_events(events) == []
    (decision,) = _decisions(events)
    (reasoning,) = [b for b in decision["message"]["streamed"] if b["kind"] == "reasoning"]
    assert reasoning["pieces"] == ["A17", " le", "ft."]
    reasoning["pieces"][0] = "B17"
    reasoning["sha256"] = digest_of(reasoning["pieces"])
    assert "the reasoning deltas do not join" in _violations(events)
    decision["message"]["reasoning_content"] = "A17 left!!"
    assert "the reasoning deltas are 9 characters" in _violations(events)
