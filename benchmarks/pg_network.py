"""A durable round across a network: PostgreSQL behind a delaying proxy, fsm-agent next to
LangGraph + PostgresSaver, at several added round-trip times.

Where the database is on another host, a durable round costs its *sequential* round trips.
This benchmark puts the throwaway server behind ``delay_proxy.py``, a proxy of its own
that delays each direction by half the added RTT and counts the round trips each client
waits for. Where the host allows it (root, ``ip netns``), the proxy runs in a network
namespace of its own and the client reaches it over a veth pair, as it would reach a
database host; elsewhere it listens on loopback (the output says which). The kernel's
``netem`` is not needed (this one may not have it).

The scenario is ``benchmarks/postgres.py``'s (20 rounds, each a read and an idempotent
write; ``synchronous_commit=off`` for both engines, LangGraph committing each step
before the next). For each added RTT it prints the median time per round and the round
trips counted per round, for both, and then the fit ``a + b × RTT`` of each: ``b`` is the
round trips a round waits for, ``a`` what a round costs with none.

    python benchmarks/pg_network.py [--runs 11] [--rtts 0,0.2,1,4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import postgres as pg_bench

from fsm_agent.durable.postgres import PostgresStore
from fsm_agent.testing.pgserver import Server

HERE = Path(__file__).resolve().parent
SETTINGS = ("-c synchronous_commit=off",)
PORT = 15432


class Proxy:
    """The delaying proxy process, driven over its stdin/stdout."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        if self._line() != "ready":
            raise RuntimeError("the delaying proxy did not start")

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._line()

    def set_rtt(self, rtt_ms: float) -> None:
        if self.ask(f"delay {rtt_ms / 2000}") != "ok":
            raise RuntimeError("the delaying proxy refused a delay")

    def round_trips(self) -> int:
        return int(self.ask("count"))

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.ask("quit")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def namespace() -> Iterator[tuple[list[str], str]]:
    """A network namespace with a veth pair to it: the command prefix that runs a process
    inside it and the address it is reached at; loopback where no namespace can be made."""
    name, host_if, ns_if = f"fsmbench{os.getpid()}", f"fsmh{os.getpid()}", f"fsmn{os.getpid()}"
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield [], "127.0.0.1"
        return
    subnet = f"10.213.{os.getpid() % 250}"
    try:
        _ip("netns", "add", name)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"{subnet}.1/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        inside = ["ip", "netns", "exec", name]
        subprocess.run([*inside, "ip", "link", "set", "lo", "up"], check=True)
        subprocess.run([*inside, "ip", "addr", "add", f"{subnet}.2/30", "dev", ns_if], check=True)
        subprocess.run([*inside, "ip", "link", "set", ns_if, "up"], check=True)
    except (subprocess.CalledProcessError, OSError):
        _cleanup(name, host_if)
        yield [], "127.0.0.1"
        return
    try:
        yield inside, f"{subnet}.2"
    finally:
        _cleanup(name, host_if)


def _cleanup(name: str, host_if: str) -> None:
    for args in (("link", "del", host_if), ("netns", "del", name)):
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip(*args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def measure(
    proxy: Proxy, dsn: str, rtts: list[float], runs: int
) -> dict[str, dict[float, tuple[float, float]]]:
    """``{engine: {rtt: (ms per round, round trips per round)}}``."""
    store = PostgresStore(dsn, schema="bench_network")
    graph = pg_bench.langgraph_app(dsn)
    engines: dict[str, Any] = {"fsm-agent": lambda tag: pg_bench.fsm_round_us(store, tag)}
    if graph is not None:
        engines["LangGraph+PostgresSaver"] = lambda tag: pg_bench.langgraph_round_us(
            graph, tag, "sync"
        )
    out: dict[str, dict[float, tuple[float, float]]] = {name: {} for name in engines}
    for rtt in rtts:
        proxy.set_rtt(rtt)
        samples: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
        for repeat in range(runs + 1):  # the first of each warms the connections
            for name, round_us in engines.items():
                proxy.round_trips()
                us = round_us(f"n{name[:2]}{rtt}-{repeat}-{uuid.uuid4().hex[:6]}")
                trips = proxy.round_trips()
                if repeat:
                    samples[name].append((us / 1000, trips))
        for name, got in samples.items():
            ms = statistics.median(t for t, _ in got)
            per_round = statistics.median(n for _, n in got) / pg_bench.ROUNDS
            out[name][rtt] = (ms, per_round)
    store.close()
    return out


def report(results: dict[str, dict[float, tuple[float, float]]], where: str, runs: int) -> None:
    names = list(results)
    print(
        f"PostgreSQL across a network ({where}): {pg_bench.ROUNDS} rounds of a read and an "
        f"idempotent write, median of {runs} runs, synchronous_commit=off"
    )
    print("  added RTT" + "".join(f"  {n:>24} ms/round  trips/round" for n in names)
          + ("   ratio" if len(names) == 2 else ""))  # fmt: skip
    for rtt in results[names[0]]:
        cells = "".join(
            f"  {results[n][rtt][0]:>33.2f}  {results[n][rtt][1]:>11.2f}" for n in names
        )
        ratio = ""
        if len(names) == 2:
            ratio = f"   {results[names[1]][rtt][0] / results[names[0]][rtt][0]:5.2f}x"
        print(f"  {rtt:6.1f} ms{cells}{ratio}")
    for name in names:
        points = [(rtt, ms) for rtt, (ms, _) in results[name].items()]
        if len(points) >= 2:
            a, b = _fit(points)
            print(f"  fit {name}: {a:.2f} ms + {b:.2f} × RTT per round")
    if len(names) < 2:
        print("  LangGraph: not installed (pip install -e '.[bench-langgraph]')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="measured runs per point")
    parser.add_argument(
        "--rtts", default="0,0.2,1,4", help="added round-trip times in ms, comma-separated"
    )
    args = parser.parse_args()
    rtts = [float(r) for r in args.rtts.split(",")]
    signal.signal(signal.SIGTERM, pg_bench._terminated)
    server = Server.start(SETTINGS, own=True)
    try:
        assert server.directory is not None
        socket_path = str(server.directory / ".s.PGSQL.5432")
        with namespace() as (inside, address), tempfile.TemporaryDirectory():
            port = PORT if inside else _free_port()
            where = "a network namespace over a veth" if inside else "loopback"
            script = str(HERE / "delay_proxy.py")
            listen = f"{address}:{port}"
            proxy = Proxy(
                [*inside, sys.executable, script, "--listen", listen, "--upstream", socket_path]
            )
            try:
                dsn = f"postgresql://postgres@{address}:{port}/postgres"
                results = measure(proxy, dsn, rtts, args.runs)
            finally:
                proxy.stop()
        report(results, where, args.runs)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
