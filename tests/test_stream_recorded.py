"""Real recorded streams (tests/data/streams, see SOURCES.md) played byte-exact from a
loopback server to the official SDK clients.

(a) the reply our streaming adapter folds equals what the SDK's own accumulator builds
from the same bytes (openai's stream helpers, anthropic's ``MessageStream``), read by the
same reader an unstreamed call uses; (b) the same when the bytes arrive split at random
offsets, inside UTF-8 sequences too; (c) a stream cut at any event boundary is a failed
model call, nothing of the partial message returned.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
from stream_server import Play, StreamServer, body_of, event_ends, recorded

from fsm_agent._errors import ModelError, ModelUnavailableError
from fsm_agent._runtime.context import reset_delta_sink, set_delta_sink
from fsm_agent.models import (
    AnthropicModel,
    AsyncAnthropicModel,
    AsyncOpenAIChatModel,
    AsyncOpenAIResponsesModel,
    ModelRetry,
    OpenAIChatModel,
    OpenAIResponsesModel,
)

APIS = ("chat", "responses", "anthropic")
ONCE = ModelRetry(max_attempts=1)
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server() -> Iterator[StreamServer]:
    with StreamServer() as s:
        yield s


def _adapter(api: str, url: str, *, asynchronous: bool = False) -> Any:
    kw: dict[str, Any] = {"stream": True, "retry": ONCE, "price_db": False}
    if api == "anthropic":
        cls: Any = AsyncAnthropicModel if asynchronous else AnthropicModel
        client_cls: Any = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
        return cls("claude-x", client=client_cls(base_url=url, api_key="k"), **kw)
    client_cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    client = client_cls(base_url=url + "/v1", api_key="k")
    if api == "chat":
        cls = AsyncOpenAIChatModel if asynchronous else OpenAIChatModel
    else:
        cls = AsyncOpenAIResponsesModel if asynchronous else OpenAIResponsesModel
    return cls("gpt-x", client=client, **kw)


def _sdk_final(api: str, url: str) -> dict[str, Any]:
    """What the SDK's own stream accumulator builds from the next queued bytes."""
    if api == "anthropic":
        client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        with client.messages.stream(model="claude-x", max_tokens=64, messages=USER) as s:  # type: ignore[arg-type]
            return s.get_final_message().model_dump(mode="json", exclude_none=True)
    oclient = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    if api == "chat":
        with oclient.chat.completions.stream(model="gpt-x", messages=USER) as cs:  # type: ignore[arg-type]
            return cs.get_final_completion().model_dump(mode="json", exclude_none=True)
    with oclient.responses.stream(model="gpt-x", input="hi") as rs:
        return rs.get_final_response().model_dump(mode="json", exclude_none=True)


def _essentials(api: str, reply: dict[str, Any]) -> dict[str, Any]:
    """Text, tool ids, names, parsed arguments, stop reason and usage of a reply."""
    calls = [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
        for c in reply.get("tool_calls") or []
    ]
    stop = {k: v for k, v in reply["provider"].items() if k not in ("api",)}
    return {
        "content": reply.get("content") or None,
        "calls": calls,
        "stop": stop,
        "usage": reply.get("usage"),  # absent when the stream reported none
    }


def _chat_usages(body: bytes) -> list[Any]:
    found = []
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage")
            if usage is not None:
                found.append(usage)
    return found


def _reply_or_error(fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | str:
    try:
        return fn()
    except ModelError as exc:
        return f"{type(exc).__name__}"


def _ids(api: str) -> list[Any]:
    return [pytest.param(e, id=e["file"].split("/")[1][:70]) for e in recorded(api)]


ALL = [p for api in APIS for p in _ids(api)]


@pytest.mark.parametrize("entry", ALL)
def test_folded_reply_equals_the_sdk_accumulator(
    server: StreamServer, entry: dict[str, Any]
) -> None:
    api, body = entry["api"], body_of(entry)
    model = _adapter(api, server.url)
    server.queue(Play(body))
    ours = _reply_or_error(lambda: model(list(USER), []))
    server.queue(Play(body))
    try:
        final = _sdk_final(api, server.url)
    except openai.LengthFinishReasonError:
        # openai's stream helper refuses a reply cut by max_tokens; so does our reader.
        assert ours == "ModelResponseError"
        return
    if api == "chat" and "usage" not in final:
        # openai's ChatCompletionStreamState copies each chunk's usage over the last, so a
        # chunk with "usage": null after the usage chunk loses it; the stream did report it.
        reported = _chat_usages(body)
        if reported:
            final["usage"] = reported[-1]
    theirs = _reply_or_error(lambda: model.read_reply(final, list(USER), []))
    if isinstance(theirs, str) or isinstance(ours, str):
        assert ours == theirs
        return
    assert _essentials(api, ours) == _essentials(api, theirs)
    assert "streamed" in ours, "a streamed reply records its blocks (none if no delta came)"


@pytest.mark.parametrize("entry", ALL)
def test_random_splits_fold_to_the_same_reply(server: StreamServer, entry: dict[str, Any]) -> None:
    api, body = entry["api"], body_of(entry)
    model = _adapter(api, server.url)
    server.queue(Play(body))
    whole = _reply_or_error(lambda: model(list(USER), []))
    rng = random.Random(entry["sha256"])
    utf8 = [i for i, b in enumerate(body) if 0x80 <= b < 0xC0]  # inside a multi-byte char
    splits = rng.sample(range(1, len(body)), min(40, len(body) - 1)) + rng.sample(
        utf8, min(10, len(utf8))
    )
    server.queue(Play(body, splits=splits))
    assert _reply_or_error(lambda: model(list(USER), [])) == whole


@pytest.mark.parametrize("entry", ALL)
def test_async_twin_folds_the_same_reply(server: StreamServer, entry: dict[str, Any]) -> None:
    api, body = entry["api"], body_of(entry)
    server.queue(Play(body))
    whole = _reply_or_error(lambda: _adapter(api, server.url)(list(USER), []))
    amodel = _adapter(api, server.url, asynchronous=True)
    server.queue(Play(body, splits=range(7, len(body), 97)))

    async def go() -> dict[str, Any] | str:
        try:
            return dict(await amodel(list(USER), []))
        except ModelError as exc:
            return f"{type(exc).__name__}"

    assert asyncio.run(go()) == whole


@pytest.mark.parametrize("entry", ALL)
def test_a_cut_at_any_event_boundary_is_a_failed_call(
    server: StreamServer, entry: dict[str, Any]
) -> None:
    api, body = entry["api"], body_of(entry)
    model = _adapter(api, server.url)
    ends = event_ends(body)
    # Every boundary before the terminal event (the last one or two: [DONE], message_stop,
    # response.completed); a long stream is sampled, its first and last boundaries kept.
    cuts = ends[:-2] if len(ends) > 2 else ends[:1]
    if len(cuts) > 12:
        cuts = [*cuts[:4], *random.Random(1).sample(cuts[4:-4], 4), *cuts[-4:]]
    deltas: list[Any] = []
    token = set_delta_sink(lambda kind, fields: deltas.append(kind))
    try:
        for cut in cuts:
            server.queue(Play(body[:cut]))
            with pytest.raises(ModelError):
                model(list(USER), [])
            server.queue(Play(body[:cut], abort=True))
            with pytest.raises(ModelError):
                model(list(USER), [])
    finally:
        reset_delta_sink(token)


def test_a_connection_dropped_mid_stream_is_retryable(server: StreamServer) -> None:
    entry = recorded("chat")[0]
    body = body_of(entry)
    model = _adapter("chat", server.url)
    server.queue(Play(body[: len(body) // 2], abort=True))
    with pytest.raises(ModelUnavailableError, match="stream"):
        model(list(USER), [])
    model.retry = ModelRetry(max_attempts=2, backoff_s=0)
    server.queue(Play(body[: len(body) // 2], abort=True), Play(body))
    assert model(list(USER), [])["role"] == "assistant"


def test_there_are_enough_recorded_streams() -> None:
    counts = {api: len(recorded(api)) for api in APIS}
    assert all(n >= 40 for n in counts.values()), counts
    assert sum(counts.values()) >= 150, counts
    bodies = {api: [body_of(e) for e in recorded(api)] for api in APIS}
    anthropic_calls = [b for b in bodies["anthropic"] if re.search(rb'"type":\s*"tool_use"', b)]
    assert len(anthropic_calls) >= 8, "Anthropic streams with tool calls"
    assert sum(b"thinking_delta" in b and b"signature_delta" in b for b in bodies["anthropic"]) >= 5
    assert sum(b'"usage":{' not in b for b in bodies["chat"]) >= 10, "Chat streams without usage"
    assert sum(b"function_call_arguments.delta" in b for b in bodies["responses"]) >= 10


def _text_only(api: str) -> list[dict[str, Any]]:
    with StreamServer() as s:
        found = []
        for entry in recorded(api):
            s.queue(Play(body_of(entry)))
            try:
                reply = _adapter(api, s.url)(list(USER), [])
            except ModelError:
                continue
            if not reply.get("tool_calls") and reply.get("content"):
                found.append(entry)
        return found


@pytest.mark.parametrize("api", APIS)
def test_recorded_streams_through_runtime_stream_end_to_end(server: StreamServer, api: str) -> None:
    from conftest import assert_valid_run

    from fsm_agent import Runtime, ToolRegistry
    from fsm_agent._core.events import TextDelta
    from fsm_agent._trace.checker import check_events

    entries = _text_only(api)[:3]
    assert entries, f"no text-only {api} stream"
    for entry in entries:
        runtime = Runtime(model=_adapter(api, server.url), tools=ToolRegistry(), allowed_tools=())
        server.queue(Play(body_of(entry), splits=range(5, 100_000, 37)))
        with runtime.stream("hi") as run:
            events = list(run)
        result = run.result
        assert result.status == "done", (result.reason, result.detail)
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == result.answer
        (decision,) = [e for e in result.events if e["type"] == "decision"]
        assert decision["message"]["streamed"], "the trace keeps the blocks' digests"
        assert_valid_run(result)
        assert check_events(result.events) == []
        # cut before its terminal event: a failed model call, nothing of it kept
        body = body_of(entry)
        server.queue(Play(body[: event_ends(body)[-3]]))
        with runtime.stream("hi") as cut:
            list(cut)
        assert (cut.result.status, cut.result.reason) == ("protocol_error", "model_error")
        assert not any(m.get("role") == "assistant" for m in cut.result.messages)
        assert_valid_run(cut.result)


@pytest.mark.parametrize(
    ("api", "error"),
    [
        (
            "anthropic",
            b"event: error\ndata: "
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n',
        ),
        (
            "responses",
            b'event: error\ndata: {"type":"error","code":"server_error","message":"boom"}\n\n',
        ),
        ("chat", b'data: {"error":{"type":"server_error","message":"boom"}}\n\n'),
    ],
)
def test_an_error_event_inside_a_200_stream_is_a_failed_call(
    server: StreamServer, api: str, error: bytes
) -> None:
    entry = recorded(api)[0]
    body = body_of(entry)
    at = event_ends(body)[1]  # after the first two events, before the reply is complete
    model = _adapter(api, server.url)
    server.queue(Play(body[:at] + error + body[at:]))
    with pytest.raises(ModelError, match="error event"):
        model(list(USER), [])


def _loops() -> list[Any]:
    """The recorded multi-step exchanges: one cassette's streams, in order, each asking
    for tools until the last, which answers (what a real agent loop sent and got)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for api in APIS:
        for e in recorded(api):
            groups.setdefault((api, e["repo"], e["path"]), []).append(e)
    found = []
    with StreamServer() as s:
        for (api, _, path), entries in groups.items():
            entries.sort(key=lambda e: e["interaction"])
            shape = ""
            for entry in entries:
                s.queue(Play(body_of(entry)))
                try:
                    reply = _adapter(api, s.url)(list(USER), [])
                except ModelError:
                    shape += "E"
                    continue
                shape += "T" if reply.get("tool_calls") else "A" if reply.get("content") else "?"
            if re.fullmatch("T+A", shape):
                found.append(pytest.param(api, entries, id=f"{api}-{path.rsplit('/', 1)[-1]}"))
    return found


LOOPS = _loops()


def test_the_material_holds_multi_step_tool_loops_of_every_api() -> None:
    assert {p.values[0] for p in LOOPS} == set(APIS)
    assert len(LOOPS) >= 8


@pytest.mark.parametrize(("api", "entries"), LOOPS)
def test_recorded_tool_loops_replay_end_to_end_through_runtime_stream(
    server: StreamServer, api: str, entries: list[dict[str, Any]]
) -> None:
    """Each recorded step played in order: the streamed calls run as tools (each once,
    after its whole message arrived), their results go back, the last reply answers."""
    from conftest import assert_valid_run

    from fsm_agent import Budget, Runtime, ToolRegistry
    from fsm_agent._core.events import Observed, TextDelta, ToolArgsDelta
    from fsm_agent._trace.checker import check_events

    replies = []
    for entry in entries:
        server.queue(Play(body_of(entry)))
        replies.append(_adapter(api, server.url)(list(USER), []))
    names = {c["function"]["name"] for r in replies for c in r.get("tool_calls") or []}
    ran: list[tuple[str, dict[str, Any]]] = []
    tools = ToolRegistry()

    def tool(name: str) -> Callable[..., dict[str, Any]]:
        def run_it(**arguments: Any) -> dict[str, Any]:
            ran.append((name, arguments))
            return {"ok": "recorded"}

        return run_it

    for name in names:
        tools.register(
            tool(name),
            name=name,
            effect="read",
            schema={"type": "object"},
            allow_extra_fields=True,
        )
    budget = Budget(max_tool_rounds=len(entries), max_calls_per_round=16, max_model_calls=16)
    runtime = Runtime(model=_adapter(api, server.url), tools=tools, allowed_tools=names,
                      budget=budget)  # fmt: skip
    for entry in entries:
        server.queue(Play(body_of(entry), splits=range(17, 1_000_000, 89)))
    with runtime.stream("hi", trace_deltas=True) as run:
        events = list(run)
    result = run.result
    assert (result.status, result.reason) == ("done", "final_answer"), result.detail
    asked = [(c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
             for r in replies for c in r.get("tool_calls") or []]  # fmt: skip
    assert ran == asked  # every streamed call ran once, with its folded arguments
    # no tool started before the whole message that asked for it had streamed
    for i, e in enumerate(events):
        if isinstance(e, Observed):
            assert not any(isinstance(d, ToolArgsDelta) and d.call_id == e.call_id
                           for d in events[i:])  # fmt: skip
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.endswith(result.answer or "")
    assert check_events(result.events) == []
    assert_valid_run(result)
