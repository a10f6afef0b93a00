"""Child process of the crash tests: start (or resume) the scenario run against a SQLite
file and get killed where ``FSM_CRASH`` says (see ``durable_scenario.py``).

    python durable_child.py DB EFFECTS RUN_ID start|resume
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import durable_scenario as scenario

from fsm_agent._errors import RunBusy


def main() -> int:
    db, effects, run_id, mode = sys.argv[1:5]
    store = scenario.CrashingStore(db)
    rt = scenario.runtime(store, Path(effects))
    try:
        result = (
            rt.run("Order A17 is late.", run_id=run_id) if mode == "start" else (rt.resume(run_id))
        )
    except RunBusy as exc:
        print(f"busy: {exc}", file=sys.stderr)
        return 3
    print(result.status, result.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
