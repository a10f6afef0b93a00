"""``check`` by replay against the v2 walker it replaced, on the same run (issue 18).

The v2 walker (``fsm_agent/trace/walk.py``) checked every trace before Engine v3; a
checkout of its last commit as the checker of new traces (``9c99780``; make one with
``git worktree add --detach /tmp/oldwalker 9c99780``) is given as ``--old``. The walker
is still in this tree, but only for ``fsm-agent.trace/2`` traces; this tree writes and
replays ``/3``. So the *same run* is recorded twice, once by each checkout's
``benchmarks/long_trace.py`` (a real round of three reads, one transient failure
retried, repeated with fresh ids; the old one as ``/2``, this one as ``/3`` with the
inputs replay needs), with the same number of events, and each checkout checks its own:

* old: ``fsm_agent.trace.checker.check_trace`` (the walker) on the ``/2`` trace;
* new: ``fsm_agent._trace.checker.check_trace`` (replay) on the ``/3`` trace;
* for reference, this tree's walker on the ``/2`` trace (it checks ``/2`` with a note,
  but only of a table it knows: the ``usage_unknown`` row came after ``9c99780``, so this
  one is refused as recorded with another table, and the line says so).

Each check runs in a fresh interpreter that imports only its own checkout (asserted),
best of ``--repeats``, alternating; printed: CPU seconds (``process_time``: what a busy
shared machine disturbs least), wall seconds, and peak RSS (``ru_maxrss``) of the
process. Then, where valgrind is installed, the check of a 20,003-event trace of the
same run in each checkout in instructions (callgrind, net of importing the checker):
the figure load cannot move, where CPU time moves by 0.1x between runs minutes apart.

Run: ``python benchmarks/check_vs_walker.py [--old /tmp/oldwalker] [--mb 1000]``
(without ``--old``, a checkout is made with ``git worktree`` and removed after; ``make
bench`` runs it so). The traces are deleted at the end.

Measured (1 GB, 3.18 M events, best of 3): the walker 37.8 s CPU, replay 35.9 s
(0.95x), and in a second run 32.3 s against 32.4 s (1.00x); 1.11x before the line
reader and the replay's request loop were trimmed (30.1 s against 27.0 s), 1.5-1.7x
before issue 18's replay work; peak RSS 33 MB for both. In instructions: 2,017 M against
1,966 M (0.97x; was 2,133 M, 1.06x, and before that 2,960 M, 1.47x).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NEW = HERE.parent

_GENERATE = """
import json, sys
from pathlib import Path
from typing import Any
from long_trace import write_long_trace
path, events, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(write_long_trace(Path(path), events, bytes_wanted=size))
"""

_CHECK = """
import json, resource, sys, time
module, path, root = sys.argv[1], sys.argv[2], sys.argv[3]
checker = __import__(module, fromlist=["check_trace"])
import fsm_agent
assert fsm_agent.__file__.startswith(root), (fsm_agent.__file__, root)
cpu, wall = time.process_time(), time.perf_counter()
try:
    report = checker.check_trace(path)
except Exception as exc:  # a trace this checkout refuses to check at all
    print(json.dumps({"refused": str(exc)}))
    sys.exit(0)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
assert report.ok, report.violations[:3]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"cpu": cpu, "wall": wall, "rss_mb": rss / 1024,
                  "notes": len(getattr(report, "notes", []) or [])}))
"""


def _run(code: str, root: Path, args: list[str], cwd: Path) -> str:
    """``python -c code args`` importing fsm_agent from ``root`` only (run from ``cwd``,
    never from a checkout, whose folder would shadow ``PYTHONPATH``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(cwd)])}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, cwd=cwd, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"failed ({root}): {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def generate(root: Path, path: Path, events: int, size: int) -> int:
    return int(_run(_GENERATE, root, [str(path), str(events), str(size)], root / "benchmarks"))


def check(root: Path, module: str, path: Path, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(_run(_CHECK, root, [module, str(path), str(root)], tmp))
    return out


#: The last commit whose checker was the v2 walker.
WALKER_COMMIT = "9c99780"


@contextmanager
def _walker_checkout(given: Path | None) -> Iterator[Path | None]:
    """``given``, or a checkout of :data:`WALKER_COMMIT` made for this run (a detached
    ``git worktree`` in a temporary folder, removed after), or None without the history."""
    if given is not None:
        yield given.resolve()
        return
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder) / "walker"
        git = ["git", "-C", str(NEW)]
        made = subprocess.run(
            [*git, "worktree", "add", "--detach", str(where), WALKER_COMMIT],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if made.returncode != 0:
            yield None
            return
        try:
            yield where
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(where)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--old", type=Path, help=f"a checkout of {WALKER_COMMIT} (default: one made with git)"
    )
    parser.add_argument("--mb", type=int, default=1000, help="size of the /2 trace, MB")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with _walker_checkout(args.old) as old:
        if old is None:
            print(f"check_vs_walker: skipped: commit {WALKER_COMMIT} (the v2 walker) is not "
                  "in this checkout's git history; give a checkout of it with --old")  # fmt: skip
            return 0
        if not (old / "fsm_agent" / "trace" / "walk.py").exists():
            parser.error(f"{old} is no checkout with fsm_agent/trace/walk.py (the v2 walker)")
        return _compare(old, args.mb, args.repeats)


def _compare(old: Path, mb: int, repeats: int) -> int:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        v2, v3 = tmp / "v2.jsonl", tmp / "v3.jsonl"
        events = generate(old, v2, 0, mb * 1_000_000)
        assert generate(NEW, v3, events, 0) == events
        runs = {
            "walker (old checkout), /2 trace": (old, "fsm_agent.trace.checker", v2),
            "replay (this tree), /3 trace": (NEW, "fsm_agent._trace.checker", v3),
            "walker (this tree), /2 trace": (NEW, "fsm_agent._trace.checker", v2),
        }
        best: dict[str, dict[str, Any]] = {}
        for _ in range(repeats):  # alternating, so a change of load hits each alike
            for label, (root, module, path) in runs.items():
                got = check(root, module, path, tmp)
                if label not in best or got.get("cpu", 0) < best[label].get("cpu", 0):
                    best[label] = got
        sizes = {v2: v2.stat().st_size / 1e6, v3: v3.stat().st_size / 1e6}
        print(f"check_vs_walker: {events:,} events (/2: {sizes[v2]:,.0f} MB, "
              f"/3: {sizes[v3]:,.0f} MB), best of {repeats}")  # fmt: skip
        for label, (_, _, path) in runs.items():
            r = best[label]
            if "refused" in r:
                print(f"  {label:34} refused: {r['refused']}")
                continue
            print(f"  {label:34} cpu {r['cpu']:7.1f} s  wall {r['wall']:7.1f} s  "
                  f"peak RSS {r['rss_mb']:5.0f} MB  ({events / r['cpu']:,.0f} events/s, "
                  f"{sizes[path] / r['cpu']:,.1f} MB/s)")  # fmt: skip
        walker = best["walker (old checkout), /2 trace"]["cpu"]
        replay = best["replay (this tree), /3 trace"]["cpu"]
        print(f"  replay / old walker, CPU time: {replay / walker:.2f}x (target <= 1.00: "
              f"{'ok' if replay <= walker else 'SLOWER'}; moves by 0.1x with load)")  # fmt: skip
        counted = _instructions(old, v2, tmp)
        if counted is not None:
            before, after = counted
            print(f"  in instructions (callgrind, {COUNTED:,} events each, the check alone): "
                  f"walker {before / 1e6:,.0f} M, replay {after / 1e6:,.0f} M = "
                  f"{after / before:.3f}x (target <= 1.00: "
                  f"{'ok' if after <= before else 'SLOWER'})")  # fmt: skip
    return 0


#: Events of the traces whose check is counted in instructions (callgrind runs ~50x
#: slower than the CPU: a 1 GB trace would take hours).
COUNTED = 20_003

_COUNT = """
import sys
module, path = sys.argv[1], sys.argv[2]
checker = __import__(module, fromlist=["check_trace"])
if path != "-":
    assert checker.check_trace(path).ok
"""


def _instructions(old: Path, scratch: Path, tmp: Path) -> tuple[int, int] | None:
    """Instructions of the walker's and the replay's check of a :data:`COUNTED`-event
    trace of the same run (each recorded by its own checkout), net of importing the
    checker; None without valgrind. A busy machine moves CPU time, never this."""
    if shutil.which("valgrind") is None:
        print("  (no valgrind: the check is not counted in instructions)")
        return None
    v2, v3 = scratch.with_name("counted-v2.jsonl"), scratch.with_name("counted-v3.jsonl")
    generate(old, v2, COUNTED, 0)
    generate(NEW, v3, COUNTED, 0)

    def count(root: Path, module: str, path: str) -> int:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, "-c", _COUNT, module, path],
            capture_output=True, text=True, cwd=tmp, check=True,
            env={**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", done.stderr)
        assert found, done.stderr[-2000:]
        return int(found.group(1))

    walker, replay = (old, "fsm_agent.trace.checker"), (NEW, "fsm_agent._trace.checker")
    return (
        count(*walker, str(v2)) - count(*walker, "-"),
        count(*replay, str(v3)) - count(*replay, "-"),
    )


if __name__ == "__main__":
    sys.exit(main())
