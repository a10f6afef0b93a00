"""What tracing costs a run: the OpenTelemetry interceptor against none, in one process.

The scenario of ``overhead.py`` (100 tool rounds, one read call each, then an answer)
runs through ``Runtime.run`` (a) with no interceptor, (b) with ``fsm_agent.otel``'s
interceptor on the SDK's ``BatchSpanProcessor`` exporting to an exporter that drops
every span (the spans are built, attributed and batched: all of the tracing work but
the network). Printed: µs per tool round for each and their ratio (target ≤ 1.3×,
issue 21). With no interceptor the driver pays one ``None`` check per request whether
or not the ``[otel]`` extra is installed: (a) is that figure.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from overhead import ROUNDS, engine, script
from timing import best

from fsm_agent.otel import OpenTelemetry

REPEATS = 15
TARGET = 1.3


class Dropping(SpanExporter):
    """Takes every batch and keeps nothing (the cost of a network export aside)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def run(steps: list[dict[str, Any]], interceptors: list[Any]) -> str:
    return engine(steps, interceptors)


def main() -> int:
    steps = script()
    exporter = Dropping()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    traced = [OpenTelemetry(provider)]
    assert run(steps, []) == run(steps, traced) == "done"
    plain = best(lambda: run(steps, []), REPEATS) / ROUNDS * 1e6
    with_otel = best(lambda: run(steps, traced), REPEATS) / ROUNDS * 1e6
    provider.shutdown()
    ratio = with_otel / plain
    print(f"no interceptor:             {plain:8.1f} µs per tool round")
    print(f"OpenTelemetry (batch, drop):{with_otel:8.1f} µs per tool round")
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"ratio: {ratio:.2f}x (target <= {TARGET}x: {verdict}); {exporter.spans} spans exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
