"""A loopback HTTP server that plays recorded SSE bodies byte-exact to the real SDKs.

Each queued :class:`Play` is one response: its bytes, written in the pieces ``splits``
cut them into (chunked transfer, one flush per piece, so a client sees a line or a UTF-8
sequence arrive in two reads), and optionally ``abort``: the connection is dropped after
the last piece without the closing chunk, as a server or proxy that dies mid-stream does.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STREAMS = Path(__file__).parent / "data" / "streams"


@dataclass
class Play:
    body: bytes
    splits: Sequence[int] = ()
    abort: bool = False
    status: int = 200


def pieces(body: bytes, splits: Sequence[int]) -> list[bytes]:
    cuts = sorted({s for s in splits if 0 < s < len(body)})
    edges = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


class StreamServer:
    """``with StreamServer() as server:``; ``server.url`` is its base URL."""

    def __init__(self) -> None:
        self.plays: deque[Play] = deque()
        self.requests: list[Any] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                owner.requests.append(json.loads(raw) if raw else None)
                play = owner.plays.popleft() if owner.plays else Play(b"no play left", status=500)
                self.send_response(play.status)
                kind = "text/event-stream" if play.status == 200 else "application/json"
                self.send_header("content-type", kind)
                self.send_header("transfer-encoding", "chunked")
                if play.abort:
                    self.send_header("connection", "close")
                self.end_headers()
                for piece in pieces(play.body, play.splits):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                if play.abort:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return None  # a client that hung up on a cut stream: expected here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def queue(self, *plays: Play) -> StreamServer:
        self.plays.extend(plays)
        return self

    def __enter__(self) -> StreamServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def recorded(api: str) -> list[dict[str, Any]]:
    """The index entries of the recorded streams of ``api`` (chat, responses, anthropic)."""
    index = json.loads((STREAMS / "index.json").read_text(encoding="utf-8"))
    return [e for e in index if e["api"] == api]


def body_of(entry: dict[str, Any]) -> bytes:
    return (STREAMS / str(entry["file"])).read_bytes()


def event_ends(body: bytes) -> list[int]:
    """The offset just after each event's blank line (every event boundary)."""
    ends: list[int] = []
    at = 0
    while True:
        found = body.find(b"\n\n", at)
        if found == -1:
            return ends
        at = found + 2
        ends.append(at)
