"""Long property-based fuzz run of the run invariants (``make fuzz``).

Draws whole cases from ``fsm_agent.testing._strategies.cases()`` (decisions valid and
malformed, fault tools, budgets, policies), runs them, and checks every invariant. Prints
what it ran, examples per second, the stop reasons reached, the transitions taken and
whether any invariant broke; exits 1 with the (shrunk) failing case if one did.

    python benchmarks/fuzz.py [--examples N] [--workers W] [--seed S]

``FUZZ_EXAMPLES`` / ``FUZZ_WORKERS`` set the defaults (50,000 examples, 1 worker);
workers split the examples, each with its own seed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import sys
import time
import traceback
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from fsm_agent._core.table import TRANSITIONS
from fsm_agent.testing._coverage import TransitionCoverage
from fsm_agent.testing._strategies import FuzzCase, cases, invariant_problems, run_case


def _fuzz(examples: int, seed_value: int) -> dict[str, Any]:
    """Run ``examples`` cases in this process; return counts (and the failure, if any)."""
    stats: dict[str, Any] = {
        "examples": 0,
        "runs": 0,
        "reasons": collections.Counter(),
        "failure": None,
    }
    coverage = TransitionCoverage()
    coverage.install()

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(cases())
    def check(case: FuzzCase) -> None:
        stats["examples"] += 1
        if stats["examples"] % 5000 == 0:  # a long run says it is alive
            print(f"  seed {seed_value}: {stats['examples']} examples", flush=True)
        outcome = run_case(case)
        stats["runs"] += len(outcome.results)
        for result in outcome.results:
            stats["reasons"][f"{result.status}/{result.reason}"] += 1
        problems = invariant_problems(outcome)
        assert problems == [], "\n".join(problems)

    try:
        check()
    except AssertionError:
        stats["failure"] = traceback.format_exc(limit=0)[-4000:]
    finally:
        coverage.uninstall()
    stats["hits"] = coverage.hits
    return stats


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples",
        type=_positive,
        default=None,
        help="examples in total (default $FUZZ_EXAMPLES or 50000)",
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="processes sharing the examples (default $FUZZ_WORKERS or 1)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the first worker")
    args = parser.parse_args(argv)
    try:
        examples = args.examples or _positive(os.environ.get("FUZZ_EXAMPLES", "50000"))
        workers = args.workers or _positive(os.environ.get("FUZZ_WORKERS", "1"))
    except argparse.ArgumentTypeError as exc:
        parser.error(f"FUZZ_EXAMPLES/FUZZ_WORKERS: {exc}")
    base_seed = args.seed if args.seed is not None else int(time.time())
    shares = [examples // workers + (1 if i < examples % workers else 0) for i in range(workers)]
    print(
        f"fuzz: {examples} examples over {workers} worker(s), seeds {base_seed}.."
        f"{base_seed + workers - 1}",
        flush=True,
    )
    started = time.perf_counter()
    if workers == 1:
        results = [_fuzz(shares[0], base_seed)]
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_fuzz, shares, [base_seed + i for i in range(workers)]))
    elapsed = time.perf_counter() - started
    ran = sum(r["examples"] for r in results)
    runs = sum(r["runs"] for r in results)
    reasons: collections.Counter[str] = sum((r["reasons"] for r in results), collections.Counter())
    hits = [sum(r["hits"][i] for r in results) for i in range(len(TRANSITIONS))]
    print(
        f"ran {ran} examples ({runs} runs) in {elapsed:.1f} s: "
        f"{ran / elapsed:.1f} examples/s, {runs / elapsed:.1f} runs/s"
    )
    print("stop reasons: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
    taken = sum(1 for h in hits if h)
    print(
        f"transitions taken: {taken}/{len(TRANSITIONS)}"
        + "".join(f"\n  never: #{i} {TRANSITIONS[i].label}" for i, h in enumerate(hits) if not h)
    )
    failures = [r["failure"] for r in results if r["failure"]]
    if failures:
        print("INVARIANT BROKEN:\n" + failures[0], file=sys.stderr)
        return 1
    print(f"no invariant broke in {ran} examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
