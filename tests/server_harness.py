"""A real review server for tests: uvicorn on 127.0.0.1 (a free port) in a thread,
started and stopped around a test (and restartable on the same store and port)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from fsm_agent.server._app import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    def __init__(self, store: Any, port: int | None = None, **options: Any) -> None:
        self.store, self.options = store, options
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self.app: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> LiveServer:
        app = self.app = create_app(self.store, **self.options)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._server = None
