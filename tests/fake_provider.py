"""A loopback HTTP server that answers like a model provider, from a script.

Tests queue answers (status, JSON body or raw bytes, headers); the server records every
request it receives, so a test can assert what the official SDK client actually sent
(and that nothing was sent when a check should have stopped the call first).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # a JSON value, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class FakeProvider:
    """Start with ``with FakeProvider() as server:``; ``server.url`` is ``http://127.0.0.1:N``."""

    def __init__(self) -> None:
        self.answers: deque[Answer] = deque()
        self.received: list[Received] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                provider.received.append(Received(self.path, dict(self.headers), body))
                answer = (
                    provider.answers.popleft()
                    if provider.answers
                    else Answer(500, {"error": {"message": "the test script has no answer left"}})
                )
                data = (
                    answer.body
                    if isinstance(answer.body, bytes)
                    else json.dumps(answer.body).encode()
                )
                self.send_response(answer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def queue(self, *answers: Answer | dict[str, Any]) -> FakeProvider:
        for a in answers:
            self.answers.append(a if isinstance(a, Answer) else Answer(200, a))
        return self

    def __enter__(self) -> FakeProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
