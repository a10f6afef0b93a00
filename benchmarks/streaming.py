"""What streaming a reply through ``Runtime.stream`` costs, next to the SDK alone.

The reply: a real recorded Chat Completions stream (``tests/data/streams``) whose content
chunk is repeated to 2,000 text deltas, each its own SSE event, played from the tests'
loopback server (chunked, as a real server sends it). Measured, best of a few runs:

(a) the official ``openai`` client alone: ``chat.completions.create(stream=True)`` and
    iterating its chunks (the SDK parses each into its model);
(b) the SDK's raw streaming response, its bytes read and nothing parsed (the transport's
    floor: what our adapter reads from);
(c) ``Runtime.stream`` with ``OpenAIChatModel(stream=True)``, the consumer reading every
    event: the fold, the delta sink, the bounded queue, the run's lifecycle around it.

Printed: ms for each, their ratio (target <= 1.5x, issue 20), and the time from a delta
reaching the driver's sink to the consumer holding it (p50/p99, µs). The queue is sized
so nothing is coalesced: each delta is measured once.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

import openai
from stream_server import Play, StreamServer, body_of, recorded

from fsm_agent import Runtime, ToolRegistry
from fsm_agent._core.events import TextDelta
from fsm_agent._runtime.streaming import StreamRun
from fsm_agent.models import ModelRetry, OpenAIChatModel

DELTAS = 2000
REPEATS = 7
TARGET = 1.5
SOURCE = "chat/test_dbos_agent_run_stream-0-6acc6a.sse"


def long_stream() -> bytes:
    """The recorded stream with its text chunk repeated ``DELTAS`` times."""
    (entry,) = [e for e in recorded("chat") if e["file"] == SOURCE]
    events = [e for e in body_of(entry).split(b"\n\n") if e.strip()]
    head, text, tail = events[0], events[1], events[-3:]  # finish, usage, [DONE]
    chunk = json.loads(text[len(b"data: ") :])
    out = [head]
    for i in range(DELTAS):
        chunk["choices"][0]["delta"]["content"] = f" w{i}"
        out.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode())
    return b"\n\n".join(out + tail) + b"\n\n"


def sdk_alone(server: StreamServer, body: bytes) -> float:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    server.queue(Play(body))
    start = time.perf_counter()
    stream = client.chat.completions.create(model="gpt-x", messages=[], stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta]
    elapsed = time.perf_counter() - start
    assert sum(1 for p in pieces if p) == DELTAS
    return elapsed


def transport_alone(server: StreamServer, body: bytes) -> float:
    """The bytes through the SDK's raw streaming response, nothing parsed (a floor)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    server.queue(Play(body))
    start = time.perf_counter()
    with client.chat.completions.with_streaming_response.create(
        model="gpt-x", messages=[], stream=True
    ) as raw:
        size = sum(len(b) for b in raw.iter_bytes())
    elapsed = time.perf_counter() - start
    assert size == len(body)
    return elapsed


class Stamped(StreamRun):
    """A stream that notes when each delta reaches the driver's sink."""

    arrived: list[float]

    def _delta(self, kind: str, fields: dict[str, Any]) -> None:
        self.arrived.append(time.perf_counter())
        super()._delta(kind, fields)


def through_runtime(server: StreamServer, body: bytes) -> tuple[float, list[float]]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    model = OpenAIChatModel(
        "gpt-x", client=client, stream=True, retry=ModelRetry(max_attempts=1), price_db=False
    )
    runtime = Runtime(model=model, tools=ToolRegistry(), allowed_tools=())
    server.queue(Play(body))
    run = Stamped(runtime, "hi", run_id=None, trace=None, model=None, capacity=DELTAS * 2)
    run.arrived = []
    seen: list[float] = []
    start = time.perf_counter()
    with run:
        for event in run:
            if isinstance(event, TextDelta):
                seen.append(time.perf_counter())
    elapsed = time.perf_counter() - start
    assert run.result.status == "done" and run.coalesced == 0 and len(seen) == DELTAS
    return elapsed, [s - a for a, s in zip(run.arrived, seen, strict=True)]


def main() -> int:
    body = long_stream()
    with StreamServer() as server:
        sdk_alone(server, body)  # warm both paths (imports, connections)
        through_runtime(server, body)
        sdk = min(sdk_alone(server, body) for _ in range(REPEATS))
        floor = min(transport_alone(server, body) for _ in range(REPEATS))
        runs = [through_runtime(server, body) for _ in range(REPEATS)]
    ours, lags = min(runs, key=lambda r: r[0])
    lag_us = sorted(x * 1e6 for x in lags)
    p50 = statistics.median(lag_us)
    p99 = lag_us[int(len(lag_us) * 0.99) - 1]
    ratio = ours / sdk
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"{DELTAS}-delta reply, {len(body)} bytes of SSE")
    print(f"openai SDK alone (iterate chunks):   {sdk * 1e3:8.1f} ms")
    print(f"the SDK's raw bytes alone (floor):   {floor * 1e3:8.1f} ms")
    print(f"Runtime.stream (OpenAIChatModel):    {ours * 1e3:8.1f} ms")
    print(f"ratio: {ratio:.2f}x (target <= {TARGET}x: {verdict})")
    print(f"delta at the driver -> consumer: p50 {p50:.0f} µs, p99 {p99:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
