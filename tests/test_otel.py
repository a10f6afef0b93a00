"""OpenTelemetry: every run as GenAI spans (issue 21), read back from the SDK's own
``InMemorySpanExporter`` and ``InMemoryMetricReader``.

What is proven here: the span tree, kinds, names and required attributes of runs through
each terminal state (done, protocol_error, budget_exhausted, review_required, cancelled,
a crash), retries (a span per attempt), approvals and review with resume; usage summed
exactly (chat spans -> run span -> the trace's counters) and left absent when not
reported; errors as span status and ``error.type``; every span ended on a cancelled or
crashed run; no content unless asked, and then only as the run recorded it (redacted);
rule verdicts as guardrail events; the metrics.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_provider import Answer, FakeProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from opentelemetry.semconv.attributes import error_attributes, server_attributes
from opentelemetry.trace import SpanKind, StatusCode
from provider_shapes import APIS

from fsm_agent import Runtime, ToolRegistry
from fsm_agent._core.events import RuleJudged
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._runtime.interceptors import observing
from fsm_agent.otel import GUARDRAIL_EVENT, OpenTelemetry
from fsm_agent.otel import _interceptor as otel_names
from fsm_agent.testing import FaultyTools, ProcessDied, answer, call, decide
from fsm_agent.testing._scenarios import Mortal, scripted_runtime
from fsm_agent.testing._suite import SUITE

USAGE = {"input_tokens": 7, "output_tokens": 3, "cached_tokens": 2, "cost": 0.001}


class Otel:
    """A tracer and meter provider of the SDK, exporting to memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def interceptor(self, **options: Any) -> OpenTelemetry:
        return OpenTelemetry(self.tracer_provider, self.meter_provider, **options)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.tracer_provider.shutdown()


def by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def the_run(spans: list[ReadableSpan]) -> ReadableSpan:
    (run,) = by_name(spans, "invoke_agent")
    return run


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


def events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


# ── the span tree ─────────────────────────────────────────────────────────────────


def test_a_run_is_an_invoke_agent_span_over_its_chat_and_tool_spans(otel: Otel) -> None:
    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "A"}), usage=USAGE), answer("found", usage=USAGE)]
    rt = scripted_runtime(kit, script, interceptors=[otel.interceptor(agent_name="desk")])
    result = rt.run("find A", run_id="run-1")
    assert result.status == "done"
    spans = otel.spans()
    run = the_run(spans)
    assert run.name == "invoke_agent desk" and run.kind == SpanKind.INTERNAL
    assert run.parent is None
    assert attr(run, ga.GEN_AI_OPERATION_NAME) == "invoke_agent"
    assert attr(run, ga.GEN_AI_AGENT_NAME) == "desk"
    assert attr(run, ga.GEN_AI_CONVERSATION_ID) == "run-1"
    assert attr(run, ga.GEN_AI_AGENT_ID) == result.events[0]["machine_hash"]
    assert attr(run, ga.GEN_AI_RESPONSE_FINISH_REASONS) == ("done/answered",) or attr(
        run, ga.GEN_AI_RESPONSE_FINISH_REASONS
    ) == (f"done/{result.reason}",)
    assert run.status.status_code == StatusCode.UNSET

    chats = by_name(spans, "chat")
    tools = by_name(spans, "execute_tool")
    assert len(chats) == 2 and len(tools) == 1 and len(spans) == 4
    for child in chats + tools:
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    assert all(c.kind == SpanKind.CLIENT and attr(c, ga.GEN_AI_OPERATION_NAME) == "chat"
               for c in chats)  # fmt: skip
    (tool,) = tools
    assert tool.name == "execute_tool lookup" and tool.kind == SpanKind.INTERNAL
    assert attr(tool, ga.GEN_AI_OPERATION_NAME) == "execute_tool"
    assert attr(tool, ga.GEN_AI_TOOL_NAME) == "lookup"
    assert attr(tool, ga.GEN_AI_TOOL_CALL_ID) == "c1"
    assert attr(tool, ga.GEN_AI_TOOL_TYPE) == "function"
    assert attr(tool, otel_names.A_EFFECT) == "read"
    assert attr(tool, otel_names.A_OUTCOME) == "ok"
    assert attr(tool, otel_names.A_ATTEMPT) == 1
    # Children start and end inside their run, in order.
    assert run.start_time and run.end_time and tool.start_time and tool.end_time
    assert chats[0].start_time and chats[0].end_time and chats[1].start_time and chats[1].end_time
    assert run.start_time <= chats[0].start_time <= chats[0].end_time <= tool.start_time
    assert tool.end_time <= chats[1].start_time <= chats[1].end_time <= run.end_time

    # Transitions are events of the run span, one per recorded transition, in order.
    moves = events(run, otel_names.TRANSITION_EVENT)
    recorded = [e for e in result.events if e["type"] == "transition"]
    got = [(m[otel_names.A_TRIGGER], m[otel_names.A_SOURCE], m[otel_names.A_DEST]) for m in moves]
    assert got == [(e["trigger"], e["source"], e["dest"]) for e in recorded]
    guarded = next(m for m, e in zip(moves, recorded, strict=True) if e["guards"])
    expected = " ".join(f"{k}={str(v).lower()}" for k, v in next(
        e for e in recorded if e["guards"])["guards"].items())  # fmt: skip
    assert guarded[otel_names.A_GUARDS] == expected


def test_usage_sums_exactly_from_chat_spans_to_the_run_span_and_the_counters(
    otel: Otel,
) -> None:
    kit = FaultyTools()
    kit.read("lookup")
    first = {"input_tokens": 11, "output_tokens": 5, "cached_tokens": 4, "cost": 0.5}
    second = {"input_tokens": 20, "output_tokens": 9, "cached_tokens": 0, "cost": 0.25}
    script = [decide(call("lookup", {"q": "A"}), usage=first), answer("ok", usage=second)]
    result = scripted_runtime(kit, script, interceptors=[otel.interceptor()]).run("go")
    spans = otel.spans()
    run, chats = the_run(spans), by_name(spans, "chat")
    for key in (ga.GEN_AI_USAGE_INPUT_TOKENS, ga.GEN_AI_USAGE_OUTPUT_TOKENS,
                ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS):  # fmt: skip
        assert attr(run, key) == sum(attr(c, key) or 0 for c in chats)
    counters = result.counters
    assert attr(run, ga.GEN_AI_USAGE_OUTPUT_TOKENS) == counters["output_tokens"] == 14
    # Input tokens count cached input, in the counters as in the conventions.
    assert attr(run, ga.GEN_AI_USAGE_INPUT_TOKENS) == counters["input_tokens"] == 31
    assert [attr(c, ga.GEN_AI_USAGE_INPUT_TOKENS) for c in chats] == [11, 20]
    assert attr(run, ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS) == 4


def test_usage_a_provider_did_not_report_is_absent_never_zero(otel: Otel) -> None:
    unreported = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cost": None}
    rt = scripted_runtime(FaultyTools(), [answer("no usage")], interceptors=[otel.interceptor()])
    rt.run("go")
    rt2 = scripted_runtime(FaultyTools(), [answer("adapter said none", usage=unreported)],
                           interceptors=[otel.interceptor()])  # fmt: skip
    rt2.run("go")
    rt3 = scripted_runtime(FaultyTools(), [answer("only output", usage={"output_tokens": 4})],
                           interceptors=[otel.interceptor()])  # fmt: skip
    rt3.run("go")
    spans = otel.spans()
    usage_keys = (ga.GEN_AI_USAGE_INPUT_TOKENS, ga.GEN_AI_USAGE_OUTPUT_TOKENS,
                  ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)  # fmt: skip
    assert len(by_name(spans, "invoke_agent")) == 3
    for span in spans[:4]:  # the first two runs: nothing reported
        assert all(attr(span, k) is None for k in usage_keys), span.name
    chat3 = by_name(spans[4:], "chat")[0]
    assert attr(chat3, ga.GEN_AI_USAGE_OUTPUT_TOKENS) == 4
    assert attr(chat3, ga.GEN_AI_USAGE_INPUT_TOKENS) is None


def test_a_retry_is_a_new_execute_tool_span_per_attempt(otel: Otel) -> None:
    kit = FaultyTools()
    kit.read("lookup", faults=["transient", "ok"])
    script = [decide(call("lookup", {"q": "A"})), answer("ok")]
    result = scripted_runtime(kit, script, interceptors=[otel.interceptor()]).run("go")
    assert result.status == "done" and result.counters["retries"] == 1
    tools = by_name(otel.spans(), "execute_tool")
    assert [attr(t, otel_names.A_ATTEMPT) for t in tools] == [1, 2]
    assert [attr(t, otel_names.A_OUTCOME) for t in tools] == ["transient", "ok"]
    assert tools[0].status.status_code == StatusCode.ERROR
    assert attr(tools[0], error_attributes.ERROR_TYPE) == "transient"
    assert tools[1].status.status_code == StatusCode.UNSET
    assert tools[0].context.span_id != tools[1].context.span_id


def test_a_model_error_is_an_error_chat_span_and_a_failed_run(otel: Otel) -> None:
    script: list[Any] = [ConnectionError("the provider hung up")]
    result = scripted_runtime(FaultyTools(), script, interceptors=[otel.interceptor()]).run("go")
    assert result.status == "protocol_error"
    spans = otel.spans()
    (chat,) = by_name(spans, "chat")
    assert chat.status.status_code == StatusCode.ERROR
    assert attr(chat, error_attributes.ERROR_TYPE) == "ConnectionError"
    run = the_run(spans)
    assert run.status.status_code == StatusCode.ERROR
    assert attr(run, error_attributes.ERROR_TYPE) == result.reason
    assert attr(run, otel_names.A_STATUS) == "protocol_error"


def test_a_budget_stop_is_not_an_error_but_its_finish_reason(otel: Otel) -> None:
    from fsm_agent import Budget

    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": str(i)})) for i in range(5)]
    rt = scripted_runtime(kit, script, interceptors=[otel.interceptor()],
                          budget=Budget(max_model_calls=2))  # fmt: skip
    result = rt.run("go")
    assert result.status == "budget_exhausted"
    run = the_run(otel.spans())
    assert attr(run, ga.GEN_AI_RESPONSE_FINISH_REASONS) == (f"budget_exhausted/{result.reason}",)
    assert run.status.status_code == StatusCode.UNSET


def test_a_cancelled_run_ends_every_open_span(otel: Otel) -> None:
    kit = FaultyTools()
    kit.read("lookup", faults=["interrupt"])
    rt = scripted_runtime(kit, [decide(call("lookup", {"q": "A"})), answer("ok")],
                          interceptors=[otel.interceptor()])  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        rt.run("go", run_id="cx")
    spans = otel.spans()
    assert {s.name for s in spans} == {"invoke_agent fsm-agent", "chat", "execute_tool lookup"}
    (tool,) = by_name(spans, "execute_tool")
    assert tool.status.status_code == StatusCode.ERROR
    assert attr(tool, error_attributes.ERROR_TYPE) == "KeyboardInterrupt"
    run = the_run(spans)
    assert run.status.status_code == StatusCode.ERROR
    assert attr(run, otel_names.A_STATUS) == "cancelled"
    assert all(s.end_time is not None for s in spans)


def test_a_crashed_run_ends_every_open_span(otel: Otel) -> None:
    """The process "dies" in a tool with its store killed first: nothing more is
    written, and still no span is left open."""
    store = Mortal(MemoryStore())
    kit = FaultyTools()

    def dies(q: str) -> str:
        store.kill()
        raise ProcessDied("killed while the tool ran")

    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    kit.registry.register(dies, name="dies", effect="read", schema=schema)
    rt = scripted_runtime(kit, [decide(call("dies", {"q": "A"})), answer("ok")],
                          store=store.store, interceptors=[otel.interceptor()],
                          allowed_tools=["dies"])  # fmt: skip
    with pytest.raises(ProcessDied):
        rt.run("go", run_id="crash")
    spans = otel.spans()
    assert len(spans) == 3 and all(s.end_time is not None for s in spans)
    (tool,) = by_name(spans, "execute_tool")
    assert attr(tool, error_attributes.ERROR_TYPE) == "ProcessDied"
    assert the_run(spans).status.status_code == StatusCode.ERROR


def test_a_driving_that_never_recorded_its_end_is_closed_by_the_next_run(otel: Otel) -> None:
    ot = otel.interceptor()
    script = [answer("a")]
    # A synthetic driving: events of a run whose run_end never comes (a killed process).
    from fsm_agent._core.events import Transitioned
    from fsm_agent._runtime.context import reset_trace_context, set_trace_context

    token = set_trace_context({})  # as the driver of a run does
    ot.on_event(Transitioned(seq=1, run_id="ghost", trigger="resume", source="deciding",
                             dest="deciding", guards={}, t=0.0))  # fmt: skip
    reset_trace_context(token)
    scripted_runtime(FaultyTools(), script, interceptors=[ot]).run("go")
    spans = otel.spans()
    ghost = next(s for s in spans if attr(s, ga.GEN_AI_CONVERSATION_ID) == "ghost")
    assert ghost.status.status_code == StatusCode.ERROR
    assert attr(ghost, otel_names.A_RESUMED) is True
    assert len(by_name(spans, "invoke_agent")) == 2


# ── approvals, review, resume ─────────────────────────────────────────────────────


def test_a_replayed_call_is_a_replay_event_and_no_tool_span(otel: Otel) -> None:
    (scenario,) = [s for s in SUITE if s.name == "idempotent_replay"]
    with observing(otel.interceptor()):
        results = scenario.run().results
    replayed = [(r.run_id, e["call_id"]) for r in results for e in r.events
                if e["type"] == "observation" and isinstance(e["result"], dict)
                and e["result"].get("replayed")]  # fmt: skip
    assert replayed
    runs = {attr(s, ga.GEN_AI_CONVERSATION_ID): s for s in by_name(otel.spans(), "invoke_agent")}
    for run_id, call_id in replayed:
        (replay,) = events(runs[run_id], otel_names.REPLAY_EVENT)
        assert replay[otel_names.A_CALL] == call_id and replay[otel_names.A_TOOL]
        tools = [attr(s, ga.GEN_AI_TOOL_CALL_ID) for s in by_name(otel.spans(), "execute_tool")
                 if s.parent and s.parent.span_id == runs[run_id].context.span_id]  # fmt: skip
        assert tools and call_id not in tools  # the first call ran; the replayed one did not


def test_a_review_pause_and_an_approved_resume_are_two_drivings_of_one_run(otel: Otel) -> None:
    kit = FaultyTools()
    kit.write("file", requires_approval=True)
    store = MemoryStore()
    script = [decide(call("file", {"title": "refund"})), answer("Filed.")]
    rt = scripted_runtime(kit, script, store=store, interceptors=[otel.interceptor()])
    first = rt.run("file it", run_id="r1")
    assert (first.status, first.reason) == ("review_required", "approval_required")
    paused = the_run(otel.spans())
    assert events(paused, otel_names.PAUSE_EVENT) == [{otel_names.A_REASON: "approval_required"}]
    assert paused.status.status_code == StatusCode.UNSET
    otel.exporter.clear()
    tracer = otel.tracer_provider.get_tracer("review-server")
    with tracer.start_as_current_span("POST /approve") as request:
        done = rt.approve("r1", "c1", by="ana", note="ok", resume=True)
    assert done.status == "done"
    spans = otel.spans()
    runs = by_name(spans, "invoke_agent")
    assert all(attr(r, ga.GEN_AI_CONVERSATION_ID) == "r1" for r in runs)
    reviewed = [e for r in runs for e in events(r, otel_names.REVIEW_EVENT)]
    assert reviewed == [{otel_names.A_ACTION: "approve", otel_names.A_CALL: "c1",
                         otel_names.A_TOOL: "file", otel_names.A_REVIEWER: "ana"}]  # fmt: skip
    resumed = [r for r in runs if by_name(spans, "execute_tool")
               and any(t.parent and t.parent.span_id == r.context.span_id
                       for t in by_name(spans, "execute_tool"))]  # fmt: skip
    assert len(resumed) == 1 and attr(resumed[0], otel_names.A_RESUMED) is True
    # It continues the run's trace, and links the request that approved it.
    assert resumed[0].parent is not None
    assert resumed[0].parent.span_id == paused.context.span_id
    assert [link.context.span_id for link in resumed[0].links] == [
        request.get_span_context().span_id
    ]
    (tool,) = by_name(spans, "execute_tool")
    assert attr(tool, otel_names.A_EFFECT) is None or attr(tool, otel_names.A_EFFECT) == "write"


# ── rules, content ────────────────────────────────────────────────────────────────


def test_a_rule_verdict_is_a_guardrail_event_with_the_machine_as_policy_version(
    otel: Otel,
) -> None:
    ot = otel.interceptor()

    kit = FaultyTools()
    kit.read("lookup")
    seen: list[Any] = []

    class Judge:
        """Hands the interceptor a rule verdict right after the run's header (what a
        rule of issue 19 will record)."""

        def on_event(self, event: Any) -> None:
            seen.append(event)
            if event.type == "run_start":
                ot.on_event(RuleJudged(seq=1, run_id=event.run_id, rule="refund-cap",
                                       phase="before_tool", verdict="deny", call_id="c1",
                                       inputs_digest="sha256:0"))  # fmt: skip

    rt = scripted_runtime(kit, [answer("ok")], interceptors=[ot, Judge()])
    rt.run("go")
    run = the_run(otel.spans())
    (verdict,) = events(run, GUARDRAIL_EVENT)
    assert verdict[otel_names.A_POLICY_ID] == "refund-cap"
    assert verdict[otel_names.A_POLICY_VERSION] == seen[0].machine_hash
    assert verdict[otel_names.A_VERDICT] == "deny"
    assert verdict[ga.GEN_AI_TOOL_CALL_ID] == "c1"


CONTENT = (ga.GEN_AI_INPUT_MESSAGES, ga.GEN_AI_OUTPUT_MESSAGES, ga.GEN_AI_TOOL_CALL_ARGUMENTS,
           ga.GEN_AI_TOOL_CALL_RESULT)  # fmt: skip


def content_run(otel: Otel, **options: Any) -> list[ReadableSpan]:
    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "secret-A"})), answer("the secret-A answer")]

    def redact(event: dict[str, Any]) -> dict[str, Any]:
        redacted: dict[str, Any] = json.loads(json.dumps(event).replace("secret-A", "[redacted]"))
        return redacted

    rt = scripted_runtime(kit, script, interceptors=[otel.interceptor(**options)], redact=redact)
    rt.run("tell me secret-A")
    return otel.spans()


def test_no_content_is_recorded_unless_asked(otel: Otel) -> None:
    spans = content_run(otel)
    for span in spans:
        assert not set(span.attributes or {}) & set(CONTENT), span.name
        assert "secret" not in json.dumps(dict(span.attributes or {}))
        for e in span.events:
            assert "secret" not in json.dumps(dict(e.attributes or {}))


def test_captured_content_is_the_redacted_record_in_the_conventions_shapes(otel: Otel) -> None:
    spans = content_run(otel, capture_content=True)
    dump = json.dumps([dict(s.attributes or {}) for s in spans])
    assert "secret" not in dump and "[redacted]" in dump
    chats = by_name(spans, "chat")
    inputs = json.loads(attr(chats[0], ga.GEN_AI_INPUT_MESSAGES))
    assert inputs[0]["role"] == "user"
    assert inputs[0]["parts"] == [{"type": "text", "content": "tell me [redacted]"}]
    output = json.loads(attr(chats[0], ga.GEN_AI_OUTPUT_MESSAGES))
    (part,) = output[0]["parts"]
    assert part["type"] == "tool_call" and part["name"] == "lookup"
    assert part["arguments"] == {"q": "[redacted]"}
    second = json.loads(attr(chats[1], ga.GEN_AI_INPUT_MESSAGES))
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert second[2]["parts"][0]["type"] == "tool_call_response"
    (tool,) = by_name(spans, "execute_tool")
    assert json.loads(attr(tool, ga.GEN_AI_TOOL_CALL_ARGUMENTS)) == {"q": "[redacted]"}
    assert attr(tool, ga.GEN_AI_TOOL_CALL_RESULT) is not None


def test_no_tool_result_reaches_a_span_over_every_edge_unless_captured(otel: Otel) -> None:
    # Every edge of the machine (the per-edge suite): a tool's result is nowhere in the
    # spans, neither as an observation's nor inside an intent record (which a
    # transition's replay inputs carry: a deduplicated call's stored result).
    results: set[str] = set()
    with observing(otel.interceptor()):
        for scenario in SUITE:
            for result in scenario.run().results:
                results.update(
                    json.dumps(e["result"]["value"], sort_keys=True)
                    for e in result.events
                    if e["type"] == "observation" and isinstance(e["result"], dict)
                    and isinstance(e["result"].get("value"), dict)
                )  # fmt: skip
    spans = otel.spans()
    every = [s.attributes or {} for s in spans] + [
        e.attributes or {} for s in spans for e in s.events
    ]
    dump = "\n".join(str(value) for attrs in every for value in attrs.values())
    assert results and len(spans) > len(SUITE)
    leaked = sorted(r for r in results if r in dump)
    assert not leaked
    kinds = {e.attributes.get(otel_names.A_INPUTS) for s in spans for e in s.events if e.attributes}
    assert "begin_intent" in kinds  # which answers, not what they held
    assert "UNSET" not in dump  # a transition with no inputs has no such attribute


def test_capture_content_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="capture_content must be True or False"):
        OpenTelemetry(capture_content="yes")  # type: ignore[arg-type]


# ── async, metrics ────────────────────────────────────────────────────────────────


def test_async_runs_in_parallel_each_get_their_own_tree(otel: Otel) -> None:
    ot = otel.interceptor()

    async def both() -> None:
        kit = FaultyTools()
        kit.read("lookup")
        runs = [
            scripted_runtime(
                kit, [decide(call("lookup", {"q": n})), answer(n, usage=USAGE)], interceptors=[ot]
            ).arun("go", run_id=n)
            for n in ("a", "b")
        ]
        await asyncio.gather(*runs)

    asyncio.run(both())
    spans = otel.spans()
    runs = by_name(spans, "invoke_agent")
    assert sorted(attr(r, ga.GEN_AI_CONVERSATION_ID) for r in runs) == ["a", "b"]
    for run in runs:
        kids = [s for s in spans if s.parent and s.parent.span_id == run.context.span_id]
        assert sorted(k.name for k in kids) == ["chat", "chat", "execute_tool lookup"]
        assert attr(run, ga.GEN_AI_USAGE_OUTPUT_TOKENS) == 3


def test_metrics_token_usage_duration_and_runs_by_status(otel: Otel) -> None:
    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "A"}), usage=USAGE), answer("ok", usage=USAGE)]
    scripted_runtime(kit, script, interceptors=[otel.interceptor()]).run("go")
    found = otel.metrics()
    usage = found["gen_ai.client.token.usage"]
    by_type = {p.attributes[ga.GEN_AI_TOKEN_TYPE]: p.sum for p in usage}
    assert by_type == {"input": 14, "output": 6}  # input: cached input included, as recorded
    (duration,) = found["gen_ai.client.operation.duration"]
    assert duration.count == 2 and duration.attributes[ga.GEN_AI_OPERATION_NAME] == "chat"
    (runs,) = found[otel_names.RUNS_METRIC]
    assert runs.value == 1 and runs.attributes[otel_names.A_STATUS] == "done"


# ── the wire: OTLP over HTTP to a receiver in the test ────────────────────────────


class Receiver:
    """A tiny OTLP/HTTP trace receiver on loopback, decoding with opentelemetry-proto."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.requests: list[Any] = []
        received = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.append((self.path, self.headers["Content-Type"], request))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def decoded_spans(requests: list[Any]) -> list[Any]:
    return [span for _, _, r in requests for rs in r.resource_spans
            for ss in rs.scope_spans for span in ss.spans]  # fmt: skip


def tree(spans: list[Any]) -> str:
    """The decoded spans as an indented tree (what docs/guides/opentelemetry.md shows)."""
    kinds = {1: "INTERNAL", 3: "CLIENT"}
    children: dict[bytes, list[Any]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    lines: list[str] = []

    def walk(parent: bytes, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_time_unix_nano):
            lines.append(f"{'  ' * depth}{span.name} [{kinds.get(span.kind, span.kind)}]")
            walk(span.span_id, depth + 1)

    walk(b"", 0)
    return "\n".join(lines)


def test_a_run_goes_over_the_real_otlp_http_exporter_to_a_collector() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    receiver = Receiver()
    try:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(receiver.endpoint)))
        kit = FaultyTools()
        kit.read("lookup", faults=["transient", "ok"])
        script = [decide(call("lookup", {"q": "A"}), usage=USAGE), answer("ok", usage=USAGE)]
        rt = scripted_runtime(kit, script, interceptors=[OpenTelemetry(provider)])
        result = rt.run("go", run_id="wire-1")
        provider.shutdown()  # flushes the batch
    finally:
        receiver.close()
    assert receiver.requests and all(
        path == "/v1/traces" and kind == "application/x-protobuf"
        for path, kind, _ in receiver.requests
    )
    spans = decoded_spans(receiver.requests)
    assert tree(spans) == "\n".join([
        "invoke_agent fsm-agent [INTERNAL]",
        "  chat [CLIENT]",
        "  execute_tool lookup [INTERNAL]",
        "  execute_tool lookup [INTERNAL]",
        "  chat [CLIENT]",
    ])  # fmt: skip
    run = next(s for s in spans if s.name.startswith("invoke_agent"))
    values = {a.key: a.value for a in run.attributes}
    assert values[ga.GEN_AI_CONVERSATION_ID].string_value == "wire-1"
    assert values[ga.GEN_AI_USAGE_OUTPUT_TOKENS].int_value == result.counters["output_tokens"]
    assert len([e for e in run.events if e.name == otel_names.TRANSITION_EVENT]) == len(
        [e for e in result.events if e["type"] == "transition"]
    )


# ── the real adapters, against a loopback provider ────────────────────────────────


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_the_chat_span_of_a_real_adapter_names_provider_model_server_and_usage(
    api: Any, otel: Otel
) -> None:
    with FakeProvider() as server:
        server.queue(api.text("Hello.", usage=(1000, 200)))
        rt = Runtime(model=api.adapter(server.url), tools=ToolRegistry(), allowed_tools=[],
                     interceptors=[otel.interceptor()])  # fmt: skip
        result = rt.run("Hi")
    assert result.status == "done"
    (chat,) = by_name(otel.spans(), "chat")
    body = api.text("Hello.")
    assert chat.name == f"chat {api.model}" and chat.kind == SpanKind.CLIENT
    assert attr(chat, ga.GEN_AI_REQUEST_MODEL) == api.model
    assert attr(chat, ga.GEN_AI_RESPONSE_MODEL) == body["model"]
    assert attr(chat, ga.GEN_AI_RESPONSE_ID) == body["id"]
    assert attr(chat, ga.GEN_AI_PROVIDER_NAME) == api.name.split("-")[0]
    assert attr(chat, server_attributes.SERVER_ADDRESS) == "127.0.0.1"
    assert attr(chat, server_attributes.SERVER_PORT) == int(server.url.rsplit(":", 1)[1])
    (finish,) = attr(chat, ga.GEN_AI_RESPONSE_FINISH_REASONS)
    assert isinstance(finish, str) and finish
    assert attr(chat, ga.GEN_AI_USAGE_OUTPUT_TOKENS) == result.counters["output_tokens"] == 200
    assert attr(chat, ga.GEN_AI_USAGE_INPUT_TOKENS) == result.counters["input_tokens"] == 1000


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_a_failed_call_of_a_real_adapter_still_names_its_provider_model_and_server(
    api: Any, otel: Otel
) -> None:
    with FakeProvider() as server:
        server.queue(Answer(404, {"error": {"message": "no such model", "type": "not_found"}}))
        rt = Runtime(model=api.adapter(server.url), tools=ToolRegistry(), allowed_tools=[],
                     interceptors=[otel.interceptor()])  # fmt: skip
        rt.run("Hi")
    (chat,) = by_name(otel.spans(), "chat")
    assert chat.status.status_code == StatusCode.ERROR and attr(chat, error_attributes.ERROR_TYPE)
    assert chat.name == f"chat {api.model}"
    assert attr(chat, ga.GEN_AI_PROVIDER_NAME) == api.name.split("-")[0]
    assert attr(chat, server_attributes.SERVER_PORT) == int(server.url.rsplit(":", 1)[1])
    (point,) = otel.metrics()[gm.GEN_AI_CLIENT_OPERATION_DURATION]
    assert point.attributes[ga.GEN_AI_PROVIDER_NAME] == api.name.split("-")[0]


# ── durable runs: the trace continues in another process, and from a submitter ────

RESUME_ELSEWHERE = """
import json, sys
sys.path.insert(0, sys.argv[2])
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent.otel import OpenTelemetry
from fsm_agent.testing import FaultyTools, answer
from fsm_agent.testing._scenarios import scripted_runtime

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
kit = FaultyTools()
kit.write("file", requires_approval=True)
rt = scripted_runtime(kit, [answer("Filed.")], store=SqliteStore(sys.argv[1]),
                      interceptors=[OpenTelemetry(provider)])
result = rt.approve("r1", "c1", by="ana", resume=True)
print(json.dumps({"status": result.status, "spans": [
    {"name": s.name, "trace": s.context.trace_id, "span": s.context.span_id,
     "parent": s.parent.span_id if s.parent else None} for s in exporter.get_finished_spans()]}))
"""


def test_a_run_resumed_by_another_process_continues_its_trace(otel: Otel, tmp_path: Path) -> None:
    from fsm_agent._durable.sqlite import SqliteStore

    db = tmp_path / "runs.db"
    kit = FaultyTools()
    kit.write("file", requires_approval=True)
    script = [decide(call("file", {"title": "refund"}))]
    rt = scripted_runtime(kit, script, store=SqliteStore(db), interceptors=[otel.interceptor()])
    assert rt.run("file it", run_id="r1").status == "review_required"
    first = the_run(otel.spans())
    stored = SqliteStore(db).load_run("r1").snapshot
    assert stored["trace_context"]["traceparent"].split("-")[1] == format(
        first.context.trace_id, "032x"
    )
    out = subprocess.run(
        [sys.executable, "-c", RESUME_ELSEWHERE, str(db), str(Path(__file__).parent.parent)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["status"] == "done"
    runs = [s for s in seen["spans"] if s["name"].startswith("invoke_agent")]
    assert runs and all(r["trace"] == first.context.trace_id for r in runs)
    resumed = next(r for r in runs if r["parent"] == first.context.span_id)
    tools = [s for s in seen["spans"] if s["name"] == "execute_tool file"]
    assert [t["parent"] for t in tools] == [resumed["span"]]
    assert all(s["trace"] == first.context.trace_id for s in seen["spans"])


def test_submit_takes_the_callers_context_and_the_worker_continues_it(otel: Otel) -> None:
    import fleet_app

    store = MemoryStore()
    tracer = otel.tracer_provider.get_tracer("caller")

    def fleet(**options: Any) -> Runtime:
        tools, allowed = fleet_app.tools(), fleet_app.TOOLS
        return Runtime(model=fleet_app.model, tools=tools, allowed_tools=allowed, store=store,
                       **options)  # fmt: skip

    submitter = fleet(interceptors=[otel.interceptor()])
    with tracer.start_as_current_span("POST /refunds") as caller:
        submitter.submit(fleet_app.plan("r1", "read"), run_id="r1")
    carried = store.load_run("r1").snapshot["trace_context"]
    assert carried["traceparent"].split("-")[2] == format(caller.get_span_context().span_id, "016x")
    driver = fleet(interceptors=[otel.interceptor()])
    assert asyncio.run(driver.aresume("r1")).status == "done"  # outside the caller's span
    run = the_run(otel.spans())
    assert run.context.trace_id == caller.get_span_context().trace_id
    assert run.parent is not None and run.parent.span_id == caller.get_span_context().span_id


def test_two_tracers_on_one_runtime_each_see_the_whole_run() -> None:
    first, second = Otel(), Otel()
    kit = FaultyTools()
    kit.read("lookup")
    script = [decide(call("lookup", {"q": "A"})), answer("ok")]
    rt = scripted_runtime(kit, script, interceptors=[first.interceptor(), second.interceptor()])
    rt.run("go")
    for o in (first, second):
        names = sorted(s.name for s in o.spans())
        assert names == ["chat", "chat", "execute_tool lookup", "invoke_agent fsm-agent"]


def test_a_runtime_without_the_interceptor_loads_nothing_of_opentelemetry() -> None:
    # The "with no interceptor, zero cost": a run (a tool round, a review, a
    # submitted run) never imports the extra, so its cost is the same without it.
    code = """
import sys
from fsm_agent.testing import FaultyTools, answer, call, decide
from fsm_agent.testing._scenarios import scripted_runtime
kit = FaultyTools()
kit.read("lookup")
kit.write("file", requires_approval=True)
rt = scripted_runtime(kit, [decide(call("lookup", {"q": "A"})), decide(call("file", {})),
                            answer("ok")])
assert rt.run("go", run_id="r1").status == "review_required"
assert rt.approve("r1", "c1", by="ana", resume=True).status == "done"
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
