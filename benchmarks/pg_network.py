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

Then each kind of round of ``docs/concepts/durable-runs.md``'s table, fsm-agent alone:
a read, a keyed write, a write without a key (each the difference between runs of 8 and
2 such rounds, over 6), a final answer (a run that only answers: its creation, its last
checkpoint, its claim let go), and a review (a run that pauses for approval, the
decision recorded, the run resumed to its answer; and a decision on the version its
decider read, as the review server's page holds it: ``record_review(..., seen=)``), in
round trips and in ms at each RTT.

    python benchmarks/pg_network.py [--runs 11] [--rtts 0,0.2,1,4] [--kinds-only]
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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import postgres as pg_bench

from fsm_agent import Runtime, ScriptedModel, ToolRegistry
from fsm_agent._durable.postgres import PostgresStore
from fsm_agent._durable.review import record_review
from fsm_agent.testing._pgserver import Server

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


# ── each kind of round (fsm-agent) ────────────────────────────────────────────────

_SCHEMA = {"type": "object", "required": ["i"], "properties": {"i": {"type": "string"}}}
KINDS = {"a read": ("read",), "a keyed write": ("keyed",), "a write without a key": ("put",)}


def kind_tools() -> ToolRegistry:
    tools = ToolRegistry()
    tools.register(lambda i: {"read": i}, name="read", effect="read", schema=_SCHEMA)
    tools.register(
        lambda i: {"keyed": i},
        name="keyed",
        effect="write",
        idempotency_key=lambda a: a["i"],
        schema=_SCHEMA,
    )
    tools.register(
        lambda i: {"approved": i},
        name="approved",
        effect="write",
        idempotency_key=lambda a: a["i"],
        requires_approval=True,
        schema=_SCHEMA,
    )
    tools.register(lambda i: {"put": i}, name="put", effect="write", schema=_SCHEMA)
    return tools


def _calls(tag: str, r: int, names: tuple[str, ...]) -> dict[str, Any]:
    calls = [
        {
            "id": f"c{r}{j}",
            "type": "function",
            "function": {"name": name, "arguments": f'{{"i": "{tag}-{r}-{j}"}}'},
        }
        for j, name in enumerate(names)
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _kind_runtime(store: PostgresStore, steps: list[Any]) -> Runtime:
    return Runtime(
        model=ScriptedModel(steps),
        tools=kind_tools(),
        allowed_tools={"read", "keyed", "approved", "put"},
        store=store,
    )


def _timed(proxy: Proxy, work: Any) -> tuple[float, int]:
    proxy.round_trips()
    start = time.perf_counter()
    work()
    ms = (time.perf_counter() - start) * 1000
    return ms, proxy.round_trips()


def _rounds(store: PostgresStore, names: tuple[str, ...], n: int) -> Any:
    tag = uuid.uuid4().hex[:8]
    steps = [_calls(tag, r, names) for r in range(n)]
    answer = {"role": "assistant", "content": "done"}
    runtime = _kind_runtime(store, [*steps, answer])

    def work() -> None:
        result = runtime.run("go")
        assert result.status == "done", (result.status, result.reason, result.detail)

    return work


def _review(store: PostgresStore, proxy: Proxy) -> list[tuple[float, int]]:
    """A run paused for approval, its decision recorded, the run resumed: each part;
    then a decision on the version its decider read (the review server's page)."""
    tag = uuid.uuid4().hex[:8]
    answer = {"role": "assistant", "content": "done"}
    run_id = f"review-{tag}"
    runtime = _kind_runtime(store, [_calls(tag, 0, ("approved",)), answer])
    parts = [
        lambda: runtime.run("go", run_id=run_id),
        lambda: runtime.approve(run_id, "c00", by="ana"),
        lambda: _kind_runtime(store, [answer]).resume(run_id),
    ]
    timed = [_timed(proxy, part) for part in parts]
    shown = f"{run_id}-shown"
    _kind_runtime(store, [_calls(tag, 1, ("approved",)), answer]).run("go", run_id=shown)
    view = store.load_run(shown)

    def decide() -> None:
        record_review(store, shown, "c10", "approve", reviewer="ana", seen=view)

    return [*timed, _timed(proxy, decide)]


def measure_kinds(
    proxy: Proxy, dsn: str, rtts: list[float], runs: int
) -> dict[str, dict[float, tuple[float, float]]]:
    """``{kind: {rtt: (ms, round trips)}}``: per round for the three kinds of round,
    per run for a final answer, per part of a review."""
    store = PostgresStore(dsn, schema="bench_kinds")
    out: dict[str, dict[float, tuple[float, float]]] = {}
    for rtt in rtts:
        proxy.set_rtt(rtt)
        got: dict[str, list[tuple[float, float]]] = {}
        for repeat in range(runs + 1):  # the first warms the connections
            points: dict[str, tuple[float, float]] = {}
            for kind, names in KINDS.items():
                ms2, n2 = _timed(proxy, _rounds(store, names, 2))
                ms8, n8 = _timed(proxy, _rounds(store, names, 8))
                points[kind] = ((ms8 - ms2) / 6, (n8 - n2) / 6)
            points["a final answer (a whole run)"] = _timed(proxy, _rounds(store, (), 0))
            pause, decide, resume, on_view = _review(store, proxy)
            points["a review: the pause (a whole run)"] = pause
            points["a review: the decision recorded"] = decide
            points["a review: the decision on a view"] = on_view
            points["a review: the run resumed to its end"] = resume
            if repeat:
                for kind, point in points.items():
                    got.setdefault(kind, []).append(point)
        for kind, samples in got.items():
            out.setdefault(kind, {})[rtt] = (
                statistics.median(ms for ms, _ in samples),
                statistics.median(n for _, n in samples),
            )
    store.close()
    return out


def report_kinds(results: dict[str, dict[float, tuple[float, float]]], runs: int) -> None:
    rtts = list(next(iter(results.values())))
    print(f"fsm-agent, each kind of round (median of {runs} runs): ms at each added RTT")
    print(f"  {'':40} {'trips':>6}" + "".join(f"  {r:>6.1f} ms" for r in rtts) + "     fit")
    for kind, points in results.items():
        trips = points[rtts[0]][1]
        cells = "".join(f"  {points[r][0]:>9.2f}" for r in rtts)
        fit = ""
        if len(rtts) >= 2:
            a, b = _fit([(r, points[r][0]) for r in rtts])
            fit = f"  {a:.2f} + {b:.2f} × RTT"
        print(f"  {kind:40} {trips:>6.2f}{cells}{fit}")


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
    parser.add_argument(
        "--kinds-only", action="store_true", help="only each kind of round (no LangGraph)"
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
                results = None if args.kinds_only else measure(proxy, dsn, rtts, args.runs)
                kinds = measure_kinds(proxy, dsn, rtts, args.runs)
            finally:
                proxy.stop()
        if results is not None:
            report(results, where, args.runs)
        report_kinds(kinds, args.runs)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
