"""Replay a recorded provider exchange through its fsm-agent adapter, on loopback only.

Each recording (``openai_chat.json``, ``openai_responses.json``, ``anthropic.json``)
holds a task and the request/response bodies of one run. This script serves the
recorded responses from a local HTTP server, points the adapter (with the official SDK
client) at it, runs the task with one ``check_order`` tool, and checks that every
request the adapter sent equals the recorded one. Exit 0 when the run ends ``done`` and
every request matches, 1 otherwise, 2 for an unreadable recording.

    python examples/providers/replay.py examples/providers/anthropic.json
    python examples/providers/replay.py FILE --record   # rewrite the recorded requests
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fsm_agent import Runtime, ToolRegistry
from fsm_agent.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel


def tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(
        effect="read",
        schema={
            "type": "object",
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 80}},
        },
    )
    def check_order(order_id: str) -> dict[str, Any]:
        """Look up an order's status."""
        return {"order_id": order_id, "status": "in_transit"}

    return registry


def serve(responses: list[Any], received: list[Any]) -> ThreadingHTTPServer:
    answers = iter(responses)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            data = json.dumps(next(answers, {"error": {"message": "no recorded answer"}}))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data.encode())))
            self.end_headers()
            self.wfile.write(data.encode())

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def adapter(provider: str, model: str, url: str) -> Any:
    if provider == "anthropic":
        return AnthropicModel(model, base_url=url, api_key="recorded", max_tokens=512)
    cls = OpenAIResponsesModel if provider == "openai-responses" else OpenAIChatModel
    return cls(model, base_url=url + "/v1", api_key="recorded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the requests the adapter sends into the recording",
    )
    args = parser.parse_args(argv)
    try:
        recording = json.loads(args.recording.read_text(encoding="utf-8"))
        provider, model, task = recording["provider"], recording["model"], recording["task"]
        exchanges = recording["exchanges"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"replay: cannot read {args.recording}: {exc}", file=sys.stderr)
        return 2
    received: list[Any] = []
    server = serve([e["response"] for e in exchanges], received)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        runtime = Runtime(
            model=adapter(provider, model, url), tools=tools(), allowed_tools={"check_order"}
        )
        result = runtime.run(task)
    finally:
        server.shutdown()
        server.server_close()
    print(
        json.dumps(
            {
                "provider": provider,
                "status": result.status,
                "reason": result.reason,
                "answer": result.answer,
                "tokens": result.counters["tokens"],
                "cost": result.counters["cost"],
            }
        )
    )
    if args.record:
        for exchange, request in zip(exchanges, received, strict=False):  # a short run
            exchange["request"] = request
        args.recording.write_text(
            json.dumps(recording, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return 0 if result.status == "done" else 1
    pairs = zip(exchanges, received, strict=False)  # lengths are compared just below
    mismatched = [i for i, (e, r) in enumerate(pairs) if e["request"] != r]
    if len(received) != len(exchanges) or mismatched:
        print(
            f"replay: {len(received)} requests sent for {len(exchanges)} recorded; "
            f"requests differing from the recording: {mismatched}",
            file=sys.stderr,
        )
        return 1
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
