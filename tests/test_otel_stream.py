"""A streamed model call as OpenTelemetry sees it (issue 21 item 7): one ``chat`` span
with ``gen_ai.request.stream`` and the time to its first chunk (an attribute and one
event), never an event per delta; the conventions' chunk-timing metrics. Real recorded
streams played to the real SDK clients, spans from the SDK's in-memory exporter."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from stream_server import Play, StreamServer, body_of
from test_otel import Otel
from test_stream_recorded import APIS, _adapter, _text_only

from fsm_agent import Runtime, ToolRegistry
from fsm_agent._core.events import TextDelta
from fsm_agent._runtime.context import reset_delta_sink, set_delta_sink
from fsm_agent.models import ModelRetry, OpenAIChatModel


@pytest.fixture(scope="module")
def server() -> Iterator[StreamServer]:
    with StreamServer() as s:
        yield s


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.tracer_provider.shutdown()


def _note(into: list[str], kind: str, fields: dict[str, Any]) -> None:
    into.append(kind)


def _text_stream(api: str) -> dict[str, Any]:
    """A recorded stream of ``api`` whose reply is text only, in several deltas."""
    for entry in _text_only(api):
        deltas: list[str] = []
        token = set_delta_sink(functools.partial(_note, deltas))
        try:
            with StreamServer() as s:
                s.queue(Play(body_of(entry)))
                _adapter(api, s.url)([{"role": "user", "content": "hi"}], [])
        finally:
            reset_delta_sink(token)
        if len(deltas) >= 3:
            return entry
    raise AssertionError(f"no text-only {api} stream")


def _chat_spans(otel: Otel) -> list[Any]:
    return [s for s in otel.spans() if (s.attributes or {}).get(ga.GEN_AI_OPERATION_NAME) == "chat"]


@pytest.mark.parametrize("api", APIS)
def test_a_streamed_call_is_one_chat_span_with_its_first_chunk_time(
    server: StreamServer, otel: Otel, api: str
) -> None:
    runtime = Runtime(
        model=_adapter(api, server.url),
        tools=ToolRegistry(),
        allowed_tools=(),
        interceptors=[otel.interceptor()],
    )
    server.queue(Play(body_of(_text_stream(api)), splits=range(40, 1_000_000, 211)))
    with runtime.stream("hi") as run:
        deltas = [e for e in run if isinstance(e, TextDelta)]
    assert run.result.status == "done" and len(deltas) >= 3
    (chat,) = _chat_spans(otel)
    attrs = chat.attributes
    assert attrs[ga.GEN_AI_REQUEST_STREAM] is True
    first = attrs[ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    assert chat.end_time is not None and chat.start_time is not None
    assert 0 < first <= (chat.end_time - chat.start_time) / 1e9
    # one event for the first chunk, at that moment; no delta is an event
    (event,) = chat.events
    assert event.name == ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK
    assert chat.start_time <= event.timestamp <= chat.end_time
    (run_span,) = [s for s in otel.spans() if s.name.startswith("invoke_agent")]
    transitions = [e for e in run.result.events if e["type"] == "transition"]
    assert len(run_span.events) == len(transitions)  # the run's events: its transitions only
    assert not any("delta" in e.name for s in otel.spans() for e in s.events)
    assert attrs[ga.GEN_AI_USAGE_OUTPUT_TOKENS] > 0  # these streams report usage
    metrics = otel.metrics()
    (to_first,) = metrics[gm.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK]
    assert to_first.count == 1 and to_first.sum == pytest.approx(first)
    (per_chunk,) = metrics[gm.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK]
    assert per_chunk.count == 1 and per_chunk.sum >= 0


def test_an_unstreamed_call_has_no_stream_attributes(server: StreamServer, otel: Otel) -> None:
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    model = OpenAIChatModel("gpt-x", client=client, retry=ModelRetry(max_attempts=1))
    reply = (
        b'{"id":"x","object":"chat.completion","created":1,"model":"gpt-x","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"Hi."},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
    )
    server.queue(Play(reply))
    runtime = Runtime(
        model=model, tools=ToolRegistry(), allowed_tools=(), interceptors=[otel.interceptor()]
    )
    assert runtime.run("hi").status == "done"
    (chat,) = _chat_spans(otel)
    assert ga.GEN_AI_REQUEST_STREAM not in chat.attributes
    assert ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK not in chat.attributes
    assert not chat.events
    assert gm.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK not in otel.metrics()


def test_a_stream_without_usage_leaves_the_span_without_usage(
    server: StreamServer, otel: Otel
) -> None:
    entry = _text_stream("chat")
    events = body_of(entry).split(b"\n\n")
    without = b"\n\n".join(e for e in events if b'"choices":[],"usage":{' not in e)
    assert without != body_of(entry)
    runtime = Runtime(
        model=_adapter("chat", server.url),
        tools=ToolRegistry(),
        allowed_tools=(),
        interceptors=[otel.interceptor()],
    )
    server.queue(Play(without))
    assert runtime.run("hi").usage_unknown
    (chat,) = _chat_spans(otel)
    assert chat.attributes[ga.GEN_AI_REQUEST_STREAM] is True
    usage = [k for k in chat.attributes or {} if str(k).startswith("gen_ai.usage.")]
    assert usage == []  # absent, never 0
    (run_span,) = [s for s in otel.spans() if s.name.startswith("invoke_agent")]
    assert not [k for k in run_span.attributes or {} if str(k).startswith("gen_ai.usage.")]
