"""The :class:`OpenTelemetry` interceptor (see the package docstring for the conventions).

How a run is followed. The interceptor is shared by every run of a runtime, and requests
carry no run id, so the run being driven is a context variable: the driver performs the
requests and hands out the events of one run in one thread (``run``) or one task
(``arun``). ``run_start`` (or, for a resumed driving, the first event of a run not
followed yet) opens the run span; ``run_end`` closes it. A model or tool span ends when
its request returns (that is its end time) but is finished by the events the loop records
right after it (the reply as recorded, the tool's outcome and result), which are what
``capture_content`` reads: they have been through the runtime's ``redact`` hook.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from opentelemetry.semconv.attributes import error_attributes, server_attributes
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fsm_agent._core.events import (
    UNSET,
    Decided,
    Event,
    Observed,
    Reviewed,
    RuleJudged,
    RunEnded,
    RunStarted,
    Transitioned,
)
from fsm_agent._core.requests import AskModel, CallTool, Request, ToolOutcome
from fsm_agent._runtime.context import (
    collect_call_facts,
    driving_trace_context,
    stop_collecting,
)
from fsm_agent._runtime.interceptors import AsyncCallNext, CallNext, Interceptor
from fsm_agent._version import __version__

__all__ = ["GUARDRAIL_EVENT", "OpenTelemetry"]

# The conventions' own names, imported (never spelled here).
_OP = ga.GenAiOperationNameValues
_INVOKE = _OP.INVOKE_AGENT.value
_CHAT = _OP.CHAT.value
_TOOL = _OP.EXECUTE_TOOL.value

#: The event a rule verdict becomes: the GenAI guardrail event proposed upstream, which
#: this version of the conventions does not name yet (so it is spelled here, once).
GUARDRAIL_EVENT = "gen_ai.guardrail.result"

# fsm-agent's own facts, which the conventions do not name.
_NS = "fsm_agent."
TRANSITION_EVENT = _NS + "transition"
REVIEW_EVENT = _NS + "review"
PAUSE_EVENT = _NS + "review_required"
#: A call answered with its stored result (an idempotent write done before): no tool ran.
REPLAY_EVENT = _NS + "replay"
A_TRIGGER, A_SOURCE, A_DEST, A_GUARDS = (_NS + n for n in ("trigger", "source", "dest", "guards"))
A_CALL, A_TOOL, A_ATTEMPT, A_APPROVAL = (
    _NS + n for n in ("call_id", "tool", "attempt", "approval")
)
A_APPROVAL_USE, A_OUTCOME, A_REASON = (_NS + n for n in ("approval_use", "outcome", "reason"))
A_INPUTS, A_STATUS, A_DETAIL, A_EFFECT = (_NS + n for n in ("inputs", "status", "detail", "effect"))
A_RESUMED, A_MACHINE, A_ACTION, A_REVIEWER = (
    _NS + n for n in ("resumed", "machine_hash", "review.action", "review.reviewer")
)
A_POLICY_ID, A_POLICY_VERSION, A_VERDICT, A_PHASE = (
    "gen_ai.guardrail.policy.id",
    "gen_ai.guardrail.policy.version",
    "gen_ai.guardrail.decision",
    _NS + "rule.phase",
)
#: The W3C propagator: what a run's checkpoint carries is a ``traceparent``/``tracestate``
#: whatever propagators the application configured globally.
_W3C = TraceContextTextMapPropagator()
#: In the carrier: whose context it holds (``submit``: the submitter's; ``run``: the run
#: span of the run's first driving, which every later driving continues).
_ORIGIN = "origin"

#: The counter of finished drivings by status and reason.
RUNS_METRIC = _NS + "runs"

#: Run statuses that are failures of the run (span status ERROR, ``error.type`` = reason).
_FAILED = frozenset({"protocol_error", "cancelled"})

#: The usage keys of a reply -> the conventions' attribute. ``input_tokens`` counts
#: cached input too, as the conventions' does (``models/_adapter.py``); the cache keys
#: are a model's own report, or what an SDK adapter reported of the call.
_USAGE = (
    ("input_tokens", ga.GEN_AI_USAGE_INPUT_TOKENS),
    ("output_tokens", ga.GEN_AI_USAGE_OUTPUT_TOKENS),
    ("cached_tokens", ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
    ("cache_write_tokens", ga.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS),
)
#: What adapters recorded for unreported usage before they left it absent (a reply of a
#: model of your own may still say it this way): absent as well.
_NO_USAGE = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cost": None}

#: How many runs' held events are kept (a review never resumed here is dropped).
_HELD_RUNS = 1024

_FINISH_KEYS = ("finish_reason", "stop_reason", "status")

_PROVIDERS = {
    "openai": ga.GenAiProviderNameValues.OPENAI.value,
    "anthropic": ga.GenAiProviderNameValues.ANTHROPIC.value,
}


@dataclass
class _Child:
    """A model or tool span whose request returned: the events after it finish it."""

    span: Span
    kind: str
    call_id: str = ""
    ended_ns: int | None = None
    started: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)
    #: What the model adapter reported of the call (``runtime/context.py``).
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Run:
    run_id: str
    span: Span
    ctx: otel_context.Context
    usage: dict[str, int] = field(default_factory=dict)
    open: list[_Child] = field(default_factory=list)
    history: list[Any] = field(default_factory=list)
    arguments: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    machine: str | None = None
    attempts: dict[str, int] = field(default_factory=dict)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


class OpenTelemetry(Interceptor):
    """Every run as GenAI spans, on ``tracer_provider`` (default: the global one).

    ``meter_provider`` (default: the global one) gets ``gen_ai.client.token.usage`` and
    ``gen_ai.client.operation.duration`` per model call and ``fsm_agent.runs`` per
    finished driving. ``capture_content=True`` records messages, tool arguments and
    results as the run recorded them (after ``Runtime(redact=...)``); by default none.
    ``agent_name`` names the ``invoke_agent`` span (``gen_ai.agent.name``).
    """

    #: Spans are of model and tool calls: the chain passes every other request by.
    requests = (AskModel, CallTool)

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool = False,
        *,
        agent_name: str = "fsm-agent",
    ) -> None:
        if not isinstance(capture_content, bool):
            raise TypeError(f"capture_content must be True or False, got {capture_content!r}")
        if not isinstance(agent_name, str) or not agent_name:
            raise TypeError(f"agent_name must be a non-empty string, got {agent_name!r}")
        self.tracer = trace.get_tracer("fsm_agent", __version__, tracer_provider)
        meter = metrics.get_meter("fsm_agent", __version__, meter_provider)
        self.token_usage = gm.create_gen_ai_client_token_usage(meter)
        self.duration = gm.create_gen_ai_client_operation_duration(meter)
        self.first_chunk = gm.create_gen_ai_client_operation_time_to_first_chunk(meter)
        self.per_chunk = gm.create_gen_ai_client_operation_time_per_output_chunk(meter)
        self.runs = meter.create_counter(RUNS_METRIC, unit="{run}", description="finished drivings")
        self.capture_content = capture_content
        self.agent_name = agent_name
        #: The run this context (thread or task) drives, for this interceptor: a
        #: context variable of its own, so two tracers on one runtime never mix runs.
        self._current: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
            f"fsm_agent_otel_run_{id(self):x}", default=None
        )
        self._lock = threading.Lock()
        #: Events recorded outside a driving, by run, until the run's next driving.
        self._held: dict[str, list[Event]] = {}

    def inject_context(self, carrier: dict[str, str]) -> None:
        """The caller's current trace context into ``carrier`` (``Runtime.submit`` stores
        it with the run, so the worker that drives it continues the caller's trace)."""
        _W3C.inject(carrier)
        if "traceparent" in carrier:
            carrier[_ORIGIN] = "submit"

    # ── requests ─────────────────────────────────────────────────────────────────

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        child = self._open(request)
        if child is None:
            return call_next(request)
        token = otel_context.attach(trace.set_span_in_context(child.span))
        facts = collect_call_facts(child.facts)
        try:
            answer = call_next(request)
        except BaseException as exc:
            self._raised(child, exc)
            raise
        finally:
            stop_collecting(facts)
            otel_context.detach(token)
        self._returned(child, answer)
        return answer

    async def aintercept(self, request: Request, call_next: AsyncCallNext) -> Any:
        child = self._open(request)
        if child is None:
            return await call_next(request)
        token = otel_context.attach(trace.set_span_in_context(child.span))
        facts = collect_call_facts(child.facts)
        try:
            answer = await call_next(request)
        except BaseException as exc:
            self._raised(child, exc)
            raise
        finally:
            stop_collecting(facts)
            otel_context.detach(token)
        self._returned(child, answer)
        return answer

    def _open(self, request: Request) -> _Child | None:
        """The span of a model or tool request of the run being followed, started."""
        if not isinstance(request, (AskModel, CallTool)):
            return None  # most requests (emit, clock, store) are not spans: asked first
        run = self._current.get()
        if run is None:
            return None
        self._settle(run)
        if isinstance(request, AskModel):
            attrs: dict[str, Any] = {ga.GEN_AI_OPERATION_NAME: _CHAT}
            if self.capture_content:
                attrs[ga.GEN_AI_INPUT_MESSAGES] = _json(_messages(run.history))
            span = self.tracer.start_span(_CHAT, run.ctx, SpanKind.CLIENT, attrs)
            child = _Child(span, _CHAT, started=time.monotonic())
        else:
            facts = run.tools.get(request.tool)
            attrs = {
                ga.GEN_AI_OPERATION_NAME: _TOOL,
                ga.GEN_AI_TOOL_NAME: request.tool,
                ga.GEN_AI_TOOL_CALL_ID: request.call_id,
                ga.GEN_AI_TOOL_TYPE: "function",
            }
            if request.call_id in run.attempts:
                attrs[A_ATTEMPT] = run.attempts[request.call_id]
            if isinstance(facts, Mapping) and isinstance(facts.get("effect"), str):
                attrs[A_EFFECT] = facts["effect"]
            if self.capture_content and request.call_id in run.arguments:
                attrs[ga.GEN_AI_TOOL_CALL_ARGUMENTS] = _json(run.arguments[request.call_id])
            name = f"{_TOOL} {request.tool}"
            span = self.tracer.start_span(name, run.ctx, SpanKind.INTERNAL, attrs)
            child = _Child(span, _TOOL, call_id=request.call_id, started=time.monotonic())
        run.open.append(child)
        return child

    def _raised(self, child: _Child, exc: BaseException) -> None:
        """The request raised (a crash, Ctrl-C, a cancelled task): its span ends now."""
        child.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        child.span.set_attribute(error_attributes.ERROR_TYPE, type(exc).__qualname__)
        self._end(child, time.time_ns())

    def _returned(self, child: _Child, answer: Any) -> None:
        child.ended_ns = time.time_ns()
        if child.kind == _CHAT:
            self._model_answer(child, answer)
        elif isinstance(answer, ToolOutcome):
            child.span.set_attribute(A_OUTCOME, answer.kind)
            if answer.kind != "ok":
                child.span.set_status(Status(StatusCode.ERROR, answer.error or answer.kind))
                child.span.set_attribute(error_attributes.ERROR_TYPE, answer.kind)

    def _model_answer(self, child: _Child, answer: Any) -> None:
        span, seconds = child.span, time.monotonic() - child.started
        metric: dict[str, Any] = {ga.GEN_AI_OPERATION_NAME: _CHAT}
        if isinstance(answer, BaseException):
            error = type(answer).__qualname__
            span.set_status(Status(StatusCode.ERROR, f"{error}: {answer}"))
            span.set_attribute(error_attributes.ERROR_TYPE, error)
            metric[error_attributes.ERROR_TYPE] = error
        # Every fact in one set_attributes and one rename (each SDK call takes the
        # span's lock and checks it is not ended).
        facts: dict[str, Any] = {}
        if isinstance(answer, Mapping):
            _reply_facts(facts, answer, metric, child.attrs)
        _call_facts(facts, child.facts, metric, child.attrs)
        if facts:
            span.set_attributes(facts)
        model = facts.get(ga.GEN_AI_REQUEST_MODEL) or facts.get(ga.GEN_AI_RESPONSE_MODEL)
        if isinstance(model, str) and model:
            span.update_name(f"{_CHAT} {model}")
        self.duration.record(seconds, metric)
        timing = _stream_facts(span, child.facts, child.started)
        if "to_first" in timing:
            self.first_chunk.record(timing["to_first"], metric)
        if "per_chunk" in timing:
            self.per_chunk.record(timing["per_chunk"], metric)
        for token_type, key in (("input", ga.GEN_AI_USAGE_INPUT_TOKENS),
                                ("output", ga.GEN_AI_USAGE_OUTPUT_TOKENS)):  # fmt: skip
            if key in child.attrs:
                self.token_usage.record(
                    child.attrs[key], {**metric, ga.GEN_AI_TOKEN_TYPE: token_type}
                )

    def _settle(self, run: _Run) -> None:
        """End every span whose request returned (its end time is when it returned)."""
        for child in [c for c in run.open if c.ended_ns is not None]:
            self._end(child, child.ended_ns)

    def _end(self, child: _Child, at: int | None) -> None:
        run = self._current.get()
        if run is not None and child in run.open:
            run.open.remove(child)
            if child.kind == _CHAT:
                for key, value in child.attrs.items():
                    if key.startswith("gen_ai.usage."):
                        run.usage[key] = run.usage.get(key, 0) + value
        child.span.end(end_time=at)

    # ── events ───────────────────────────────────────────────────────────────────

    def on_event(self, event: Event) -> None:
        run = self._current.get()
        if driving_trace_context() is None and not isinstance(event, RunStarted):
            # Recorded outside any driving (``Runtime.approve``: the review and its edge):
            # events of the run's next driving here (``resume=True``), not a span.
            with self._lock:
                self._held.setdefault(event.run_id, []).append(event)
                while len(self._held) > _HELD_RUNS:
                    self._held.pop(next(iter(self._held)))
            return
        if isinstance(event, RunStarted) or run is None or run.run_id != event.run_id:
            if run is not None:  # a driving that never recorded its end (a crash)
                self._close(run, None)
            run = self._start(event)
            with self._lock:
                held = self._held.pop(event.run_id, [])
            for earlier in held:
                self._record(run, earlier)
        self._record(run, event)

    def _record(self, run: _Run, event: Event) -> None:
        if isinstance(event, Transitioned):
            self._transition(run, event)
        elif isinstance(event, Decided):
            self._decided(run, event)
        elif isinstance(event, Observed):
            self._observed(run, event)
        elif isinstance(event, Reviewed):
            run.span.add_event(REVIEW_EVENT, _review_attrs(event))
        elif isinstance(event, RuleJudged):
            run.span.add_event(GUARDRAIL_EVENT, _present({
                A_POLICY_ID: event.rule, A_POLICY_VERSION: run.machine,
                A_VERDICT: event.verdict, A_PHASE: event.phase,
                ga.GEN_AI_TOOL_CALL_ID: event.call_id}))  # fmt: skip
        elif isinstance(event, RunEnded):
            self._close(run, event)

    def _start(self, event: Event) -> _Run:
        attrs: dict[str, Any] = {
            ga.GEN_AI_OPERATION_NAME: _INVOKE,
            ga.GEN_AI_AGENT_NAME: self.agent_name,
            ga.GEN_AI_CONVERSATION_ID: event.run_id,
        }
        if isinstance(event, RunStarted):
            attrs[ga.GEN_AI_AGENT_ID] = attrs[A_MACHINE] = event.machine_hash
        else:
            attrs[A_RESUMED] = True
        name = f"{_INVOKE} {self.agent_name}"
        carrier = driving_trace_context()
        # A stored context (the submitter's, or the run's first driving's) is the parent:
        # a run resumed in another process continues its trace.
        parent = _W3C.extract(carrier) if carrier and "traceparent" in carrier else None
        # The caller's own span (the request that approved or resumed it) is linked.
        caller = trace.get_current_span().get_span_context()
        links = [trace.Link(caller)] if parent is not None and caller.is_valid else None
        span = self.tracer.start_span(name, parent, SpanKind.INTERNAL, attrs, links=links)
        run = _Run(event.run_id, span, trace.set_span_in_context(span))
        if carrier is not None and carrier.get(_ORIGIN) != "run":
            carrier.clear()
            _W3C.inject(carrier, run.ctx)
            carrier[_ORIGIN] = "run"
        if isinstance(event, RunStarted):
            run.machine = event.machine_hash
            run.tools = dict(event.tools or {})
            if self.capture_content:
                run.history = list(event.messages)
        self._current.set(run)
        return run

    def _transition(self, run: _Run, event: Transitioned) -> None:
        attrs: dict[str, Any] = {A_TRIGGER: event.trigger, A_SOURCE: event.source,
                                 A_DEST: event.dest}  # fmt: skip
        if event.guards:
            attrs[A_GUARDS] = _guards_text(event.guards)
        facts = vars(event)  # the optional facts an edge has (most have few)
        for name, key in _TRANSITION_FACTS:
            value = facts[name]
            if value is not None:
                attrs[key] = value
        inputs = event.inputs
        if inputs is not UNSET and inputs is not None:
            # What the world answered: an intent record holds the tool's result, so only
            # which answers they were, unless content is captured.
            attrs[A_INPUTS] = _json(inputs) if self.capture_content else _input_kinds(inputs)
        run.span.add_event(TRANSITION_EVENT, attrs)
        if event.call_id is not None and event.attempt is not None:
            # The edge that starts an attempt is recorded before its CallTool.
            run.attempts[event.call_id] = event.attempt

    def _decided(self, run: _Run, event: Decided) -> None:
        chat = self._pending(run, _CHAT, "")
        message = event.message
        if self.capture_content and isinstance(message, Mapping):
            # The conversation is kept only to be captured (input messages, arguments).
            for call in message.get("tool_calls") or []:
                if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                    function = call.get("function")
                    if isinstance(function, Mapping):
                        run.arguments[call["id"]] = _arguments(function.get("arguments"))
            run.history.append(message)
        if chat is None:
            return
        if event.malformed is not None:
            chat.span.set_attribute(error_attributes.ERROR_TYPE, "malformed_reply")
        if self.capture_content and isinstance(message, Mapping):
            finish = chat.attrs.get("finish_reason")
            chat.span.set_attribute(ga.GEN_AI_OUTPUT_MESSAGES, _json(_messages([message], finish)))

    def _observed(self, run: _Run, event: Observed) -> None:
        result = event.result
        if isinstance(result, dict) and result.get("replayed") is True:
            run.span.add_event(REPLAY_EVENT, {A_CALL: event.call_id, A_TOOL: event.tool})
        if not self.capture_content:
            return
        run.history.append({"role": "tool", "tool_call_id": event.call_id, "content": event.result})
        tool = self._pending(run, _TOOL, event.call_id)
        if tool is not None:
            tool.span.set_attribute(ga.GEN_AI_TOOL_CALL_RESULT, _json(event.result))

    @staticmethod
    def _pending(run: _Run, kind: str, call_id: str | None) -> _Child | None:
        """The last span of ``kind`` (and call) whose request returned, still open."""
        for child in reversed(run.open):
            if child.kind == kind and (kind == _CHAT or child.call_id == call_id):
                return child
        return None

    def _close(self, run: _Run, end: RunEnded | None) -> None:
        """End the run's span (and every span still open under it)."""
        now = time.time_ns()
        for child in list(run.open):
            if child.ended_ns is None:  # its request never returned: the run stopped
                child.span.set_status(Status(StatusCode.ERROR, "the run stopped"))
                child.span.set_attribute(error_attributes.ERROR_TYPE, "run_stopped")
            self._end(child, child.ended_ns or now)
        span = run.span
        for key, value in run.usage.items():
            span.set_attribute(key, value)
        if end is None:
            status, reason = "crashed", "no_run_end"
        else:
            status, reason = end.status, end.reason
            span.set_attributes(_present({A_STATUS: status, A_REASON: reason,
                                          A_DETAIL: end.detail or None}))  # fmt: skip
            if self.capture_content and isinstance(end.answer, str):
                span.set_attribute(ga.GEN_AI_OUTPUT_MESSAGES, _json(_messages(
                    [{"role": "assistant", "content": end.answer}], reason)))  # fmt: skip
        span.set_attribute(ga.GEN_AI_RESPONSE_FINISH_REASONS, [f"{status}/{reason}"])
        if end is None or status in _FAILED:
            span.set_status(Status(StatusCode.ERROR, f"{status}/{reason}"))
            span.set_attribute(error_attributes.ERROR_TYPE, reason)
        elif status == "review_required":
            span.add_event(PAUSE_EVENT, {A_REASON: reason})
        self.runs.add(1, {A_STATUS: status, A_REASON: reason})
        span.end(end_time=now)
        self._current.set(None)


#: A transition's optional facts -> their attribute (absent ones are left absent).
_TRANSITION_FACTS = (
    ("call_id", A_CALL), ("tool", A_TOOL), ("attempt", A_ATTEMPT), ("approval", A_APPROVAL),
    ("approval_use", A_APPROVAL_USE), ("outcome", A_OUTCOME), ("reason", A_REASON),
)  # fmt: skip

#: Guard outcomes -> their text, for the combinations seen (a table has few): one
#: string, not a list, as the SDK checks a list item by item.
_GUARD_TEXTS: dict[tuple[tuple[str, bool], ...], str] = {}


def _guards_text(guards: Mapping[str, bool]) -> str:
    key = tuple(guards.items())
    text = _GUARD_TEXTS.get(key)
    if text is None:
        text = " ".join(f"{name}={'true' if ok else 'false'}" for name, ok in key)
        if len(_GUARD_TEXTS) < 4096:
            _GUARD_TEXTS[key] = text
    return text


def _input_kinds(inputs: Any) -> str:
    """Which answers a transition's ``inputs`` are (``begin_intent idempotency_key``)."""
    if not isinstance(inputs, list):
        return type(inputs).__name__
    return " ".join(str(next(iter(i), "")) if isinstance(i, Mapping) else "?" for i in inputs)


def _review_attrs(event: Reviewed) -> dict[str, Any]:
    return _present({A_ACTION: event.action, A_CALL: event.call_id, A_TOOL: event.tool,
                     A_REVIEWER: event.reviewer or None, A_REASON: event.reason})  # fmt: skip


def _present(attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes that have a value (an absent fact is left absent, never 0 or "")."""
    return {k: v for k, v in attrs.items() if v is not None}


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _reply_facts(facts: dict[str, Any], reply: Mapping[str, Any], metric: dict[str, Any],
                 attrs: dict[str, Any]) -> None:  # fmt: skip
    """The reply's provider facts and usage into ``facts`` (the ``chat`` span's) and its
    metric's attributes; usage the provider did not report is left absent."""
    provider = reply.get("provider")
    if isinstance(provider, Mapping):
        api = provider.get("api")
        if isinstance(api, str):
            facts[ga.GEN_AI_PROVIDER_NAME] = _provider_name(api)
        for key, attr in (("model", ga.GEN_AI_RESPONSE_MODEL), ("id", ga.GEN_AI_RESPONSE_ID)):
            if isinstance(provider.get(key), (str, int)) and provider.get(key) != "":
                facts[attr] = provider[key]
        # Each API names it its own way (Chat: finish_reason, Responses: status,
        # Messages: stop_reason); the span carries the provider's own value.
        finish = next((provider[k] for k in _FINISH_KEYS if isinstance(provider.get(k), str)), None)
        if isinstance(finish, str):
            facts[ga.GEN_AI_RESPONSE_FINISH_REASONS] = [finish]
            attrs["finish_reason"] = finish
    usage = reply.get("usage")
    if isinstance(usage, Mapping) and dict(usage) != _NO_USAGE:
        tokens = {attr: usage[key] for key, attr in _USAGE if _count(usage.get(key))}
        facts.update(tokens)
        attrs.update(tokens)
    for key in (ga.GEN_AI_PROVIDER_NAME, ga.GEN_AI_REQUEST_MODEL, ga.GEN_AI_RESPONSE_MODEL,
                server_attributes.SERVER_ADDRESS, server_attributes.SERVER_PORT):  # fmt: skip
        if key in facts:
            metric[key] = facts[key]


#: What an adapter reports of a call -> the conventions' attribute.
_REPORTED = (
    ("request_model", ga.GEN_AI_REQUEST_MODEL),
    ("server_address", server_attributes.SERVER_ADDRESS),
    ("server_port", server_attributes.SERVER_PORT),
)


def _provider_name(api: str) -> str:
    """The conventions' provider name of an adapter's API (``openai-chat`` -> ``openai``)."""
    return _PROVIDERS.get(api.split(".")[0].split("-")[0].split("_")[0], api)


def _call_facts(out: dict[str, Any], facts: Mapping[str, Any], metric: dict[str, Any],
                attrs: dict[str, Any]) -> None:  # fmt: skip
    """The adapter's facts (API, model asked for, server) into ``out`` (the ``chat``
    span's) and the metric's; the span is named after the model asked for (the
    conventions' ``chat {model}``). A failed call has no reply: its provider is the
    adapter's API."""
    if not facts:
        return
    api = facts.get("provider")
    if isinstance(api, str) and api and ga.GEN_AI_PROVIDER_NAME not in metric:
        metric[ga.GEN_AI_PROVIDER_NAME] = out[ga.GEN_AI_PROVIDER_NAME] = _provider_name(api)
    if ga.GEN_AI_USAGE_INPUT_TOKENS in attrs:  # a reply with usage: its cache figures
        for key, attr in _USAGE[2:]:
            if attr not in attrs and _count(facts.get(key)):
                attrs[attr] = out[attr] = facts[key]
    for key, attr in _REPORTED:
        value = facts.get(key)
        if isinstance(value, (str, int)) and value != "":
            out[attr] = metric[attr] = value
    if facts.get("stream") is True:
        out[ga.GEN_AI_REQUEST_STREAM] = True


def _stream_facts(span: Span, facts: Mapping[str, Any], started: float) -> dict[str, float]:
    """A streamed reply's timing on its one ``chat`` span: the time to its first chunk as
    an attribute and as one event at that moment (the deltas themselves never become
    events); the seconds per chunk after it, for the metric (empty if nothing streamed)."""
    first, last, count = (facts.get(k) for k in ("first_delta_at", "last_delta_at", "deltas"))
    if not isinstance(first, float) or not isinstance(last, float) or not isinstance(count, int):
        return {}
    to_first = max(first - started, 0.0)
    span.set_attribute(ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, to_first)
    at_ns = time.time_ns() - int(max(time.monotonic() - first, 0.0) * 1e9)
    span.add_event(
        ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
        {ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: to_first},
        timestamp=at_ns,
    )
    out = {"to_first": to_first}
    if count > 1:
        out["per_chunk"] = (last - first) / (count - 1)
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _messages(history: list[Any], finish: str | None = None) -> list[dict[str, Any]]:
    """Recorded messages in the conventions' JSON shape (role and typed parts)."""
    out: list[dict[str, Any]] = []
    for message in history:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        parts: list[dict[str, Any]] = []
        content = message.get("content")
        if role == "tool":
            parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                          "response": content})  # fmt: skip
        elif isinstance(content, str) and content:
            parts.append({"type": "text", "content": content})
        elif isinstance(content, list):
            parts.extend(p if isinstance(p, dict) else {"type": "text", "content": str(p)}
                         for p in content)  # fmt: skip
        for call in message.get("tool_calls") or []:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                fn = call["function"]
                parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                              "arguments": _arguments(fn.get("arguments"))})  # fmt: skip
        entry: dict[str, Any] = {"role": role, "parts": parts}
        if finish is not None:
            entry["finish_reason"] = finish
        out.append(entry)
    return out
