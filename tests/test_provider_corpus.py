"""Recorded real API traffic (tests/data/providers, see SOURCES.md) through the adapters.

Three checks per recorded exchange, for each of the three APIs:

* **reply**: the recorded response, served on loopback to the official SDK client, reads
  exactly as the body says (text, calls with their ids and arguments, the reasoning the
  adapter must keep, token counts); a reply the adapter does not support (cut short,
  built-in server tools, background mode) is refused with a precise
  ``ModelResponseError``; an error reply raises the error class its status calls for;
* **request**: every request the real API accepted passes our validator (and the ones it
  refused for a history reason are refused);
* **rebuild**: the recorded request mapped back to an engine history — assistant turns
  read by the adapter's own reader, as a run would have stored them — is rebuilt by the
  adapter into the same shape the real API accepted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from fake_provider import Answer, FakeProvider
from provider_corpus import (
    APIS,
    HISTORIES,
    READINGS,
    Exchange,
    OutOfScope,
    Refused,
    anthropic_shape,
    chat_shape,
    chat_specs,
    coverage,
    load,
    reply_body,
    responses_shape,
)

from fsm_agent._core.decision import parse_decision
from fsm_agent.models import (
    AnthropicModel,
    HistoryError,
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelRetry,
    ModelUnavailableError,
    OpenAIChatModel,
    OpenAIResponsesModel,
)
from fsm_agent.models._validate import (
    check_anthropic_request,
    check_openai_chat_request,
    check_openai_responses_request,
    recognise_history_rejection,
    recognise_reasoning_rejection,
)

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

CORPUS = {api: load(api) for api in APIS}
CHECKS = {
    "openai_chat": check_openai_chat_request,
    "openai_responses": check_openai_responses_request,
    "anthropic_messages": check_anthropic_request,
}
ONE_TRY = ModelRetry(max_attempts=1)
REASONING_KEYS = ("reasoning_content", "reasoning", "reasoning_details")


def cases(status: str) -> list[Any]:
    out = []
    for api in APIS:
        for e in CORPUS[api]:
            if (status == "ok") == (e.status == 200):
                out.append(pytest.param(e, id=f"{api}:{e.id}"))
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


@functools.cache
def adapter(api: str, url: str, send_reasoning: tuple[str, ...] | None = None) -> Any:
    """One adapter per API and server (an SDK client costs ~0.1 s to build: reuse it)."""
    kw: dict[str, Any] = {} if send_reasoning is None else {"send_reasoning": send_reasoning}
    if api == "openai_chat":
        client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        return OpenAIChatModel("gpt-4o", client=client, retry=ONE_TRY, **kw)
    if api == "openai_responses":
        client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        return OpenAIResponsesModel("gpt-4o", client=client, retry=ONE_TRY, **kw)
    aclient = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0)
    return AnthropicModel("claude-sonnet-4-5", client=aclient, retry=ONE_TRY, **kw)


HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("exchange", cases("ok"))
def test_reply_reads_exactly(exchange: Exchange, server: FakeProvider) -> None:
    specs = chat_specs(exchange.request.get("tools"))
    expected = READINGS[exchange.api](exchange.response, specs)
    server.queue(Answer(200, exchange.response))
    model = adapter(exchange.api, server.url)
    model.options = {}
    if isinstance(expected, Refused):
        with pytest.raises(ModelResponseError, match=expected.needle):
            model(HELLO, specs)
        return
    reply = model(HELLO, specs)
    calls = [
        (c["id"], c["function"]["name"], c["function"].get("arguments"))
        for c in reply.get("tool_calls") or ()
    ]
    assert (reply["content"], calls) == (expected["content"], expected["calls"])
    kept = {
        k: reply[k]
        for k in (*REASONING_KEYS, "anthropic_content", "responses_output")
        if k in reply
    }
    assert kept == expected["keep"]
    assert (
        reply["usage"]["total_tokens"]
        == reply["usage"]["input_tokens"] + reply["usage"]["output_tokens"]
    )
    # What the machine keeps of it: the calls as read, and every kept key verbatim.
    message = parse_decision(reply).message
    assert {k: message[k] for k in kept} == kept


def _error_class(exchange: Exchange) -> type[ModelError]:
    body = json.dumps(exchange.response)
    if exchange.status in (401, 403):
        return ModelAuthError
    if exchange.status in (408, 409, 429) or exchange.status >= 500:
        return ModelUnavailableError
    if recognise_history_rejection(body) or recognise_reasoning_rejection(body):
        return HistoryError
    return ModelRequestError


@pytest.mark.parametrize("exchange", cases("error"))
def test_error_reply_is_classified(exchange: Exchange, server: FakeProvider) -> None:
    server.queue(Answer(exchange.status, exchange.response))
    model = adapter(exchange.api, server.url)
    model.options = {}
    with pytest.raises(ModelError) as caught:
        model(HELLO, [])
    assert type(caught.value) is _error_class(exchange)
    message = exchange.response.get("error", {}).get("message") or ""
    assert str(message)[:60] in str(caught.value)


@pytest.mark.parametrize("exchange", cases("ok"))
def test_accepted_request_passes_the_validator(exchange: Exchange) -> None:
    assert CHECKS[exchange.api](exchange.request) == []


@pytest.mark.parametrize("exchange", cases("error"))
def test_refused_request_is_refused_for_its_reason(exchange: Exchange) -> None:
    problems = CHECKS[exchange.api](exchange.request)
    history_reason = recognise_reasoning_rejection(json.dumps(exchange.response))
    assert bool(problems) is history_reason, problems


def _history(exchange: Exchange, model: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    raw, specs, options = HISTORIES[exchange.api](exchange.request)
    model.options = options
    history: list[dict[str, Any]] = []
    for m in raw:
        if "assistant_reply" in m:
            body = reply_body(exchange.api, m["assistant_reply"])
            reply = model.read_reply(body, history, specs)
            history.append(parse_decision(reply).message)
        else:
            history.append(m)
    return history, specs


def _send_reasoning(exchange: Exchange) -> tuple[str, ...]:
    """The reasoning keys this server was sent back in the recording (the adapter's
    ``send_reasoning``, configured per server: Groq refuses ``reasoning``, others take it)."""
    sent = {
        k
        for m in exchange.request.get("messages") or ()
        for k in REASONING_KEYS
        if m.get("role") == "assistant" and k in m
    }
    return tuple(sorted(sent | {"reasoning_content", "reasoning_details"}))


def rebuilt(exchange: Exchange) -> tuple[Any, Any]:
    """(shape of the request the adapter builds, shape of the recorded request)."""
    keys = _send_reasoning(exchange) if exchange.api == "openai_chat" else None
    model = adapter(exchange.api, "http://127.0.0.1:9", keys)
    history, specs = _history(exchange, model)
    built = model.build_request(history, specs)
    names = sorted(s["function"]["name"] for s in specs)
    if keys is not None:
        return (chat_shape(built, keys), names), (chat_shape(exchange.request, keys), names)
    if exchange.api == "anthropic_messages":
        return anthropic_shape(built), anthropic_shape(exchange.request)
    return responses_shape(built), responses_shape(exchange.request)


def _rebuildable(exchange: Exchange) -> bool:
    try:
        HISTORIES[exchange.api](exchange.request)
    except OutOfScope:
        return False
    return True


@pytest.mark.parametrize(
    "exchange",
    [p for p in cases("ok") if _rebuildable(p.values[0])],
)
def test_request_is_rebuilt_in_the_accepted_shape(exchange: Exchange) -> None:
    ours, recorded = rebuilt(exchange)
    assert ours == recorded


def test_the_corpus_covers_what_issue_14_asks() -> None:
    total = sum(len(v) for v in CORPUS.values())
    assert total >= 200
    for api, exchanges in CORPUS.items():
        seen = coverage(exchanges)
        assert len(exchanges) >= 100, api
        for what in ("parallel calls", "reasoning replies", "error replies", "media tool results"):
            assert seen[what] > 0, (api, what, seen)
