"""What a provider adapter adds to one model call, next to the call itself.

For each adapter, on a history of 20 tool rounds (42 messages) and 3 tools:
(a) translating the history out and validating it for the provider, plus reading a
reply with two tool calls back (pure CPU, no I/O), in µs per model call; and (b) one full
model call through the official SDK client against a loopback HTTP server that answers
at once, in ms. The ratio says how much of a local round trip the adapter's own work is;
a real provider's latency (hundreds of ms) dwarfs both.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from provider_shapes import APIS as _APIS  # the tests' reply builders, reused

APIS: list[Any] = list(_APIS)

ROUNDS = 20
CPU_REPEATS = 2000
HTTP_REPEATS = 100
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "A tool.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
    for i in range(3)
]


def history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Track my orders."},
    ]
    for i in range(ROUNDS):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": "tool_0",
                            "arguments": json.dumps({"order_id": f"A{i}"}),
                        },
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "content": json.dumps({"ok": True, "value": {"status": "in_transit"}}),
            }
        )
    return messages


def serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as with a real provider

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes: without this, Nagle's algorithm and
            # delayed ACKs add ~40 ms per call and the benchmark measures the kernel.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def main() -> None:
    messages = history()
    print(
        f"history: {len(messages)} messages, {len(TOOLS)} tools; "
        f"CPU x{CPU_REPEATS}, HTTP x{HTTP_REPEATS} (median of 5 batches)"
    )
    for api in APIS:
        reply = api.calls(
            [
                ("call_new_a", "tool_0", {"order_id": "B1"}),
                ("call_new_b", "tool_1", {"order_id": "B2"}),
            ]
        )
        server = serve(json.dumps(reply).encode())
        model = api.adapter(f"http://127.0.0.1:{server.server_port}")
        cpu, http = [], []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(CPU_REPEATS // 5):
                model.build_request(messages, TOOLS)
                model.read_reply(reply, messages)
            cpu.append((time.perf_counter() - start) / (CPU_REPEATS // 5) * 1e6)
            start = time.perf_counter()
            for _ in range(HTTP_REPEATS // 5):
                model(messages, TOOLS)
            http.append((time.perf_counter() - start) / (HTTP_REPEATS // 5) * 1e3)
        server.shutdown()
        server.server_close()
        c, h = statistics.median(cpu), statistics.median(http)
        print(
            f"{api.name:17s} translate+validate+read {c:7.1f} µs/call | "
            f"SDK call on loopback {h:6.2f} ms/call | adapter share {c / (h * 1e3):6.1%}"
        )


if __name__ == "__main__":
    main()
