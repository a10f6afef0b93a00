"""fsm-agent's ``chat`` span next to ``opentelemetry-instrumentation-openai-v2``'s, on the
same exchange (issue 21): every recorded Chat Completions exchange with api.openai.com
(``tests/data/providers/openai_chat.jsonl``), served by a loopback server (a real
socket), is asked once through fsm-agent's ``OpenAIChatModel`` over the official OpenAI
client, with fsm-agent's interceptor on one tracer provider and the contrib
instrumentation (default mode) on another. The spans are compared attribute by
attribute; the table of docs/guides/opentelemetry.md ("Next to the OpenAI
instrumentation") is :data:`SAME`, :data:`ONLY_FSM_AGENT` and :data:`ONLY_OPENAI_V2`,
and a test holds the guide to them.

Needs the ``otel-compare`` extra (``make venv`` installs it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_provider import Answer, FakeProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.attributes import openai_attributes as oa
from opentelemetry.semconv.attributes import error_attributes, server_attributes
from opentelemetry.trace import SpanKind, StatusCode
from provider_shapes import ChatApi

from fsm_agent import Budget, Runtime, ToolRegistry
from fsm_agent.otel import OpenTelemetry

openai_v2 = pytest.importorskip(
    "opentelemetry.instrumentation.openai_v2",
    reason="needs the otel-compare extra: pip install -e '.[otel-compare]'",
)
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parent.parent
EXCHANGES = ROOT / "tests" / "data" / "providers" / "openai_chat.jsonl"
GUIDE = ROOT / "docs" / "guides" / "opentelemetry.md"

#: Recorded by both, with the same value on every exchange.
SAME = (
    ga.GEN_AI_OPERATION_NAME,
    ga.GEN_AI_PROVIDER_NAME,
    ga.GEN_AI_REQUEST_MODEL,
    ga.GEN_AI_RESPONSE_MODEL,
    ga.GEN_AI_RESPONSE_ID,
    ga.GEN_AI_RESPONSE_FINISH_REASONS,
    ga.GEN_AI_USAGE_INPUT_TOKENS,
    ga.GEN_AI_USAGE_OUTPUT_TOKENS,
)
#: Recorded by fsm-agent alone (where the exchange has the fact), and why.
ONLY_FSM_AGENT = {
    server_attributes.SERVER_ADDRESS: "openai-v2 reads the client's base URL as an "
    "`httpx.URL`; openai 3 clients hold an `httpx2.URL`, so it records none",
    server_attributes.SERVER_PORT: "the same",
    ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: "openai-v2 does not read "
    "`prompt_tokens_details.cached_tokens`",
}
SERVER = {server_attributes.SERVER_ADDRESS, server_attributes.SERVER_PORT}
#: Recorded by openai-v2 alone (where the response has the fact), and why.
ONLY_OPENAI_V2 = {
    oa.OPENAI_RESPONSE_SERVICE_TIER: "fsm-agent's reply keeps id, model and finish "
    "reason of the provider's fields, not the service tier",
    oa.OPENAI_RESPONSE_SYSTEM_FINGERPRINT: "the same",
}


def exchanges() -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in EXCHANGES.read_text(encoding="utf-8").splitlines()]
    return [x for x in lines if x["host"] == "api.openai.com"]


def exporter() -> tuple[InMemorySpanExporter, TracerProvider]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory, provider


class Pair:
    """One exchange's two ``chat`` spans."""

    def __init__(self, exchange: dict[str, Any], ours: ReadableSpan, theirs: ReadableSpan,
                 httpx_url: bool) -> None:  # fmt: skip
        self.exchange, self.ours, self.theirs = exchange, ours, theirs
        #: Whether the OpenAI client's base URL is an ``httpx.URL`` (openai < 3).
        self.httpx_url = httpx_url
        self.a: dict[str, Any] = dict(ours.attributes or {})
        self.b: dict[str, Any] = dict(theirs.attributes or {})


@pytest.fixture(scope="module")
def pairs() -> Iterator[list[Pair]]:
    ours, ours_provider = exporter()
    theirs, theirs_provider = exporter()
    instrumentor = openai_v2.OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=theirs_provider)
    out: list[Pair] = []
    try:
        with FakeProvider() as server:
            for exchange in exchanges():
                server.queue(Answer(exchange["status"], exchange["response"]))
                model = exchange["request"]["model"]
                adapter = ChatApi().adapter(server.url, model=model)
                # One model call (a tool call's round is not asked for); the response
                # is what is compared, so the task is the same for every exchange.
                rt = Runtime(model=adapter, tools=ToolRegistry(), allowed_tools=[],
                             budget=Budget(max_model_calls=1),
                             interceptors=[OpenTelemetry(ours_provider)])  # fmt: skip
                result = rt.run("Hi")
                (mine,) = [s for s in ours.get_finished_spans() if s.name.startswith("chat")]
                spans = theirs.get_finished_spans()
                assert len(spans) == 1, (exchange["source"], result.status, result.reason)
                other = spans[0]
                url = adapter.client.base_url
                out.append(Pair(exchange, mine, other, isinstance(url, httpx.URL)))
                ours.clear()
                theirs.clear()
        yield out
    finally:
        instrumentor.uninstrument()
        ours_provider.shutdown()
        theirs_provider.shutdown()


def test_the_corpus_has_answers_tool_calls_cached_input_and_errors(pairs: list[Pair]) -> None:
    answers = [p for p in pairs if p.exchange["status"] == 200]
    finishes = {p.exchange["response"]["choices"][0]["finish_reason"] for p in answers}
    assert len(answers) > 100 and finishes == {"stop", "tool_calls"}
    assert any(p.a.get(ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS) for p in answers)
    assert len(pairs) - len(answers) >= 3


def test_one_span_each_same_name_and_kind_theirs_inside_ours(pairs: list[Pair]) -> None:
    for p in pairs:
        assert p.ours.name == p.theirs.name == f"chat {p.exchange['request']['model']}"
        assert p.ours.kind == p.theirs.kind == SpanKind.CLIENT
        # fsm-agent's chat span is the current span while the client is called: an
        # instrumentation of the client nests under it, in the same trace.
        assert p.theirs.parent is not None
        assert p.theirs.parent.span_id == p.ours.context.span_id
        assert p.theirs.context.trace_id == p.ours.context.trace_id


def test_the_shared_attributes_have_the_same_values(pairs: list[Pair]) -> None:
    for p in pairs:
        if p.exchange["status"] != 200:
            continue
        for key in SAME:
            assert key in p.a and p.a[key] == p.b.get(key), (key, p.exchange["source"])


def test_every_other_attribute_is_one_the_table_names(pairs: list[Pair]) -> None:
    seen_ours: set[str] = set()
    seen_theirs: set[str] = set()
    for p in pairs:
        if p.exchange["status"] != 200:
            continue
        # openai-v2 sees the server only through an httpx URL (openai < 3): then both
        # record it, with the same value.
        assert (server_attributes.SERVER_ADDRESS in p.b) is p.httpx_url
        shared = set(SAME) | (SERVER if p.httpx_url else set())
        for key in set(p.a) & set(p.b):
            assert key in shared and p.a[key] == p.b[key], (key, p.exchange["source"])
        ours_only, theirs_only = set(p.a) - set(p.b), set(p.b) - set(p.a)
        assert ours_only <= set(ONLY_FSM_AGENT), (ours_only, p.exchange["source"])
        assert theirs_only <= set(ONLY_OPENAI_V2), (theirs_only, p.exchange["source"])
        seen_ours |= ours_only
        seen_theirs |= theirs_only
    assert seen_theirs == set(ONLY_OPENAI_V2)
    assert seen_ours | (SERVER if pairs[0].httpx_url else set()) == set(ONLY_FSM_AGENT)


def test_a_failed_call_is_an_error_in_both_with_each_its_own_error_type(
    pairs: list[Pair],
) -> None:
    failed = [p for p in pairs if p.exchange["status"] != 200]
    for p in failed:
        for span in (p.ours, p.theirs):
            assert span.status.status_code == StatusCode.ERROR
        assert p.a[ga.GEN_AI_PROVIDER_NAME] == p.b[ga.GEN_AI_PROVIDER_NAME] == "openai"
        assert p.a[ga.GEN_AI_REQUEST_MODEL] == p.b[ga.GEN_AI_REQUEST_MODEL]
        # fsm-agent: its own error class (what the run records); openai-v2: the client's
        # exception class, as a str() of the class.
        assert p.a[error_attributes.ERROR_TYPE] in {"ModelUnavailableError", "ModelRequestError"}
        assert re.fullmatch(r"<class 'openai\.\w+'>", p.b[error_attributes.ERROR_TYPE])


def test_the_guide_shows_this_comparison() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("## Next to the OpenAI instrumentation", 1)[1].split("\n## ", 1)[0]
    rows = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([a-z_.]+)` \| ([^|]+) \|", section, re.MULTILINE)
    }
    assert {k: v for k, v in rows.items() if v == "both, same value"} == dict.fromkeys(
        SAME, "both, same value"
    )
    assert {k for k, v in rows.items() if v == "fsm-agent only"} == set(ONLY_FSM_AGENT)
    assert {k for k, v in rows.items() if v == "openai-v2 only"} == set(ONLY_OPENAI_V2)
