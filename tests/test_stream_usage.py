"""Usage a stream does not report is unknown, never zero (issue 20 item 5).

A real recorded Chat Completions stream is played to the real SDK client twice: as
recorded (its last chunk before ``[DONE]`` carries the usage ``include_usage`` asks for),
and with that chunk left out, which is what a server that ignores ``include_usage`` sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import assert_valid_run
from stream_server import Play, StreamServer, body_of, recorded

from fsm_agent import Budget, Runtime, ToolRegistry
from fsm_agent._trace.checker import check_events
from fsm_agent.models import ModelRetry, OpenAIChatModel

RECORDED = "chat/test_dbos_agent_run_stream-0-6acc6a.sse"


@pytest.fixture(scope="module")
def server() -> Iterator[StreamServer]:
    with StreamServer() as s:
        yield s


def _bodies() -> tuple[bytes, bytes]:
    (entry,) = [e for e in recorded("chat") if e["file"] == RECORDED]
    body = body_of(entry)
    events = body.split(b"\n\n")
    usage = [e for e in events if b'"choices":[],"usage":{' in e]
    assert len(usage) == 1, "the recorded stream has one usage chunk"
    return body, b"\n\n".join(e for e in events if e not in usage)


def _runtime(url: str, budget: Budget | None = None) -> Runtime:
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    model = OpenAIChatModel(
        "gpt-x", client=client, stream=True, retry=ModelRetry(max_attempts=1), price_db=False
    )
    options: dict[str, Any] = {} if budget is None else {"budget": budget}
    return Runtime(model=model, tools=ToolRegistry(), allowed_tools=(), **options)


def _decision(result: Any) -> dict[str, Any]:
    (decision,) = [e for e in result.events if e["type"] == "decision"]
    return dict(decision["message"])


@pytest.mark.parametrize(
    "budget", [Budget(max_tokens=1_000_000), Budget(max_cost=100.0)], ids=["tokens", "cost"]
)
def test_a_stream_without_usage_stops_a_budgeted_run_usage_unknown(
    server: StreamServer, budget: Budget
) -> None:
    _, without = _bodies()
    server.queue(Play(without, splits=range(3, len(without), 61)))
    with _runtime(server.url, budget).stream("hi") as run:
        list(run)
    result = run.result
    assert (result.status, result.reason) == ("budget_exhausted", "usage_unknown")
    assert "unknown, not zero" in result.detail
    assert result.usage_unknown and result.answer is None
    assert "usage" not in _decision(result)  # absent in the trace, not zeros
    assert check_events(result.events) == []
    assert_valid_run(result)


def test_without_a_budget_unknown_usage_is_absent_and_flagged(server: StreamServer) -> None:
    _, without = _bodies()
    server.queue(Play(without))
    result = _runtime(server.url).run("hi")
    assert result.status == "done" and result.usage_unknown
    assert "usage" not in _decision(result)
    assert (result.counters["tokens"], result.counters["input_tokens"]) == (0, 0)
    assert check_events(result.events) == []


def test_the_same_stream_with_its_usage_counts_it(server: StreamServer) -> None:
    body, _ = _bodies()
    server.queue(Play(body))
    result = _runtime(server.url, Budget(max_tokens=1_000_000)).run("hi")
    assert result.status == "done" and not result.usage_unknown
    assert (result.counters["input_tokens"], result.counters["output_tokens"]) == (14, 8)
    assert _decision(result)["usage"]["output_tokens"] == 8


NO_USAGE = [
    pytest.param(e, id=e["file"].split("/")[1][:60])
    for e in recorded("chat")
    if b'"usage":{' not in body_of(e)
]


def test_the_material_holds_real_streams_without_usage() -> None:
    assert len(NO_USAGE) >= 10


@pytest.mark.parametrize("entry", NO_USAGE)
def test_every_real_stream_without_usage_is_unknown_and_stops_a_budget(
    server: StreamServer, entry: dict[str, Any]
) -> None:
    from fsm_agent._errors import ModelError

    body = body_of(entry)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    model = OpenAIChatModel(
        "gpt-x", client=client, stream=True, retry=ModelRetry(max_attempts=1), price_db=False
    )
    server.queue(Play(body))
    try:
        reply = model([{"role": "user", "content": "hi"}], [])
    except ModelError:
        pytest.skip("a stream our reader refuses (cut by max_tokens): no reply")
    assert "usage" not in reply
    server.queue(Play(body))
    result = _runtime(server.url, Budget(max_tokens=10**9)).run("hi")
    assert (result.status, result.reason) == ("budget_exhausted", "usage_unknown")
    assert result.usage_unknown and check_events(result.events) == []
