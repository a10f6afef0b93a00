"""A store whose process can die, and what such a store kept of a run.

Used by the scenarios (``testing/scenarios.py``) and by :class:`~fsm_agent.testing._agent.
AgentUnderTest` to fake a crash: once the process "dies", the store refuses every write,
as a killed process writes nothing more; the next process reads what it kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsm_agent._durable.resume import restore_state
from fsm_agent._durable.store import Store, supports_runs
from fsm_agent._errors import RunNotFound
from fsm_agent._runtime.result import RunResult, result_of
from fsm_agent._runtime.runtime import Runtime
from fsm_agent.testing._faults import ProcessDied

__all__ = ["Mortal", "stored_result"]


def stored_result(runtime: Runtime, run_id: str) -> RunResult | None:
    """The result of run ``run_id`` as the runtime's store last saved it (``None`` if
    the store keeps no such run)."""
    store = runtime.store
    if not supports_runs(store):
        return None
    try:
        stored = store.load_run(run_id)
    except RunNotFound:
        return None
    return result_of(restore_state(stored, runtime.config))


_STORE_WRITES = (
    "begin_intent",
    "commit_intent",
    "abort_intent",
    "create_run",
    "save",
    "claim",
    "renew",
    "release",
    "consume_approval",
    # PostgresStore's: what rides behind, and the folded statements.
    "commit_intent_behind",
    "save_behind",
    "save_and_release",
    "claim_and_load",
)


class Mortal:
    """A store whose process can die: after :meth:`kill` (or, with ``before_commit``, at
    the first idempotency commit) every write to it raises :class:`ProcessDied`, so a
    dying run writes nothing more — as a killed process would not. :meth:`restart` is the
    next process: the same data, writable again. Reads always work."""

    def __init__(self, store: Store, *, before_commit: bool = False) -> None:
        self.store, self.before_commit, self.dead = store, before_commit, False
        for name in _STORE_WRITES:
            if hasattr(store, name):
                setattr(store, name, self._guard(name, getattr(store, name)))

    def _guard(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise ProcessDied(f"the process is dead ({name} not written)")
            if name in ("commit_intent", "commit_intent_behind") and self.before_commit:
                self.before_commit = False
                self.kill()
                raise ProcessDied(f"the process died before {args[0]!r} {args[1]!r} was stored")
            return original(*args, **kwargs)

        return call

    def kill(self) -> None:
        self.dead = True

    def restart(self) -> None:
        self.dead = False
