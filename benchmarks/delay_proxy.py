"""A TCP proxy that delays each direction and counts round trips (``pg_network.py``).

Run as its own process (inside a network namespace where the host allows one), it accepts
TCP connections on ``--listen HOST:PORT`` and forwards each to PostgreSQL's Unix socket
``--upstream``. Every chunk is delivered ``one-way delay`` after it arrived, in order: a
delay line per direction, not a sleep per chunk, so pipelined statements overlap as they
would on a real link (this kernel may have no ``netem``).

A *round trip* is counted each time a connection's client sends after it last received
(or first sends): statements sent back to back in one burst, as psycopg's pipeline mode
sends them, count once; a statement that waits for the previous answer counts again.

Control on stdin, one command a line, answered on stdout:
``delay SECONDS`` (one way; ``ok``), ``count`` (round trips since the last ``count``),
``quit``. Threads, not asyncio: an epoll timeout has millisecond resolution, too coarse
for a 0.1 ms one-way delay.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import sys
import threading
import time

_state = {"delay": 0.0, "turns": 0}
_lock = threading.Lock()


def _pump(
    src: socket.socket,
    dst: socket.socket,
    from_client: bool,
    last: list[bool],
) -> None:
    """Read ``src`` and hand each chunk to a writer that sends it to ``dst`` once its
    delay has passed."""
    line: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

    def deliver() -> None:
        while (item := line.get()) is not None:
            due, data = item
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=deliver, daemon=True)
    writer.start()
    try:
        while data := src.recv(65536):
            with _lock:
                if from_client and not last[0]:
                    _state["turns"] += 1
                last[0] = from_client
                delay = _state["delay"]
            line.put((time.perf_counter() + delay, data))
    except OSError:
        pass
    line.put(None)
    writer.join()


def _serve_one(client: socket.socket, upstream: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.connect(upstream)
    except OSError:
        client.close()
        return
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    last = [False]  # whether the connection's last traffic came from the client
    up = threading.Thread(target=_pump, args=(client, server, True, last), daemon=True)
    down = threading.Thread(target=_pump, args=(server, client, False, last), daemon=True)
    up.start()
    down.start()
    up.join()
    down.join()
    client.close()
    server.close()


def _accept(listener: socket.socket, upstream: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(client, upstream), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept TCP on")
    parser.add_argument("--upstream", required=True, help="PostgreSQL's Unix socket path")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(64)
    threading.Thread(target=_accept, args=(listener, args.upstream), daemon=True).start()
    print("ready", flush=True)
    for command in sys.stdin:
        word, _, value = command.strip().partition(" ")
        if word == "delay":
            with _lock:
                _state["delay"] = float(value)
            print("ok", flush=True)
        elif word == "count":
            with _lock:
                turns, _state["turns"] = _state["turns"], 0
            print(turns, flush=True)
        elif word == "quit":
            break
        else:
            print(f"unknown command {word!r}", flush=True)


if __name__ == "__main__":
    main()
