"""Resuming a stored run: claim it, read it back, and rebuild its state (D1, D2).

:func:`restore_run` claims the run for a fresh owner (``RunBusy`` if a live one drives
it), loads it and rebuilds its :class:`~fsm_agent._core.state.RunState` with the settings
it started with (budget, retry policy, policy, and its allow-list, which the resuming
caller may narrow but never widen) and the machine its checkpoint names, picked from the
machines the caller knows by hash (a run paused under a table the application has since
changed resumes under that table). The loop then takes the ``resume`` edge where one
applies (``core/loop.py``). On any failure the claim is released and nothing changes.

:class:`Heartbeat` renews the claim's lease while a run is driven, so an owner on another
host (which cannot be asked whether it lives) holds the run exactly while it works; the
renewal brings back a cancel asked of the run meanwhile (``durable/cancel.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.state import RunConfig, RunState, allowed_tools, snapshot_machine
from fsm_agent._core.table import DEFAULT_MACHINE, Machine
from fsm_agent._durable import owners
from fsm_agent._durable.store import CancelRequest, RunStore, StoredRun
from fsm_agent._errors import ConfigError, CorruptRecord, MachineMismatch, RunBusy, RunNotFound
from fsm_agent._trace.chain import strip_links
from fsm_agent._trace.replay import recorded_rules

__all__ = ["ConfigFactory", "Heartbeat", "known_machines", "machine_of", "poke",
           "restore_run", "restore_state"]  # fmt: skip

#: Builds a run's config from the settings it started with (``Runtime.config``; the
#: machine is passed by keyword).
ConfigFactory = Callable[..., RunConfig]

#: Rebuilds the machine a stored run's header names from the rules it records
#: (``header, recorded machine hash -> machine``, or None: not this one).
Rebuild = Callable[[Mapping[str, Any], str], "Machine | None"]

#: What a caller that names no machines knows: the default table.
_DEFAULT_ONLY: Mapping[str, Machine] = {DEFAULT_MACHINE.hash: DEFAULT_MACHINE}


def known_machines(machines: Iterable[Machine]) -> dict[str, Machine]:
    """``machines`` by hash (the first of equal hashes wins: they are the same table)."""
    known: dict[str, Machine] = {}
    for m in machines:
        known.setdefault(m.hash, m)
    return known


def machine_of(
    stored: StoredRun,
    machines: Mapping[str, Machine] | None = None,
    rebuild: Rebuild | None = None,
) -> Machine:
    """The machine a stored run was checkpointed under, from ``machines`` (by hash;
    default: the default table), or rebuilt from the rules its header records (a run
    begun under other rules resumes under those: ``rebuild``, a runtime's, which holds
    the rules' callables; default: the recorded rules with stand-ins for callables,
    enough to record a review, which judges nothing). :class:`MachineMismatch` names both
    sides if it is not there."""
    known = _DEFAULT_ONLY if machines is None else machines
    recorded = snapshot_machine(stored.snapshot) or stored.header.get("machine_hash")
    found = known.get(recorded) if isinstance(recorded, str) else None
    if found is None and isinstance(recorded, str) and stored.header.get("rules") is not None:
        found = (rebuild or _recorded_machine)(stored.header, recorded)
    if found is None:
        raise MachineMismatch(
            f"run {stored.run_id!r} was checkpointed by machine {recorded}; this runtime "
            f"knows machine{'s' if len(known) > 1 else ''} {', '.join(known)}. Resume it "
            "with a runtime that knows the machine that started it: "
            "Runtime(machine=..., machines=[<that machine>, ...])."
        )
    return found


def _recorded_machine(header: Mapping[str, Any], recorded: str) -> Machine | None:
    try:
        machine = recorded_rules(header)[1]
    except (ConfigError, ValueError, TypeError, KeyError):
        return None
    return machine if machine.hash == recorded else None


def restore_state(
    stored: StoredRun,
    config: ConfigFactory,
    narrowed_by: frozenset[str] | None = None,
    machines: Mapping[str, Machine] | None = None,
    rebuild: Rebuild | None = None,
) -> RunState:
    """The state of a stored run under the settings recorded in its header, fired by the
    machine its checkpoint names (one of ``machines``, or rebuilt: see
    :func:`machine_of`)."""
    header = stored.header
    machine = machine_of(stored, machines, rebuild)
    try:
        allowed = frozenset(header["allowed_tools"])
        if narrowed_by is not None:
            allowed = allowed_tools(header, narrowed_by)
        cfg = config(
            allowed,
            Budget(**header["budget"]),
            RetryPolicy(**header["retry"]),
            header["policy"],
            machine=machine,
        )
    except (KeyError, TypeError, ConfigError) as exc:
        raise CorruptRecord(f"run {stored.run_id!r}: unreadable header ({exc})") from None
    return RunState.restore(
        stored.snapshot,
        run_id=stored.run_id,
        config=cfg,
        messages=stored.messages,
        events=strip_links(stored.events),
    )


def restore_run(
    store: RunStore,
    run_id: str,
    config: ConfigFactory,
    *,
    claimed_by: str | None = None,
    machines: Mapping[str, Machine] | None = None,
    rebuild: Rebuild | None = None,
) -> tuple[RunState, str, list[dict[str, Any]], CancelRequest | None]:
    """Claim ``run_id`` and rebuild it; returns its state, the owner token that holds
    the claim (the caller releases it when it stops driving), the last two events as
    stored (with their chain links, which the resumed run's trace continues) and the
    cancel asked of it, read with it (the driver honours it at once).
    ``claimed_by``: the owner token of a claim the caller already holds (a worker's, from
    its queue). ``machines``: the machines the caller knows, by hash."""
    owner = claimed_by or owners.new_owner()
    owners.hold(owner)
    stored = None
    try:
        if claimed_by is None:
            stored = claim_and_load(store, run_id, owner)
    except BaseException:
        owners.drop(owner)
        raise
    try:
        if stored is None:  # a claim the caller made (a worker's, which may have read it)
            load = getattr(store, "load_claimed", None)
            stored = store.load_run(run_id) if load is None else load(run_id, owner)
        narrowed = _allowed_of(config)
        state = restore_state(stored, config, narrowed, machines, rebuild)
        return state, owner, stored.events[-2:], stored.cancel_request
    except BaseException:
        owners.let_go(store, run_id, owner)
        raise


def claim_and_load(store: RunStore, run_id: str, owner: str) -> StoredRun:
    """Claim the run and read it back: in one round trip where the store can
    (``PostgresStore.claim_and_load``), else a claim and then a read. A run that
    cannot be read is not left claimed."""
    both = getattr(store, "claim_and_load", None)
    if both is not None:
        stored: StoredRun = both(run_id, owner)
        return stored
    store.claim(run_id, owner)
    try:
        return store.load_run(run_id)
    except BaseException:
        store.release(run_id, owner)
        raise


def _allowed_of(config: ConfigFactory) -> frozenset[str] | None:
    runtime = getattr(config, "__self__", None)
    allowed = getattr(runtime, "allowed_tools", None)
    return frozenset(allowed) if allowed is not None else None


class Heartbeat:
    """Renews ``owner``'s lease on ``run_id`` every third of the store's lease, on a
    daemon thread, until :meth:`stop`.

    It stops only when the claim is really lost (``RunBusy``: another driver took the
    run over); the run's next save is then refused and a fenced owner commits nothing.
    A renewal that fails otherwise — the server restarting, a connection cut, a
    statement timeout — is retried with backoff (from ``RETRY_S``, doubling, at most
    the renewal interval) for as long as the run is driven: a store outage shorter than
    the lease costs nothing, and after a longer one the claim is kept unless another
    driver took it meanwhile (a renewal checks the owner and epoch, not the clock).
    ``lost`` is the last failure (``None`` after a good renewal).

    A renewal returns the run's :class:`~fsm_agent._durable.store.CancelRequest` if one
    is stored: ``on_cancel`` gets it (on this thread), and the heartbeat goes on (the
    driver stops the run and then stops it). :func:`poke` renews at once, out of turn (a
    worker told by ``NOTIFY`` that a cancel was asked of a run it drives)."""

    #: The first retry after a failed renewal, in seconds.
    RETRY_S = 0.1

    def __init__(
        self,
        store: Any,
        run_id: str,
        owner: str,
        on_cancel: Callable[[CancelRequest], None] | None = None,
    ) -> None:
        self.store, self.run_id, self.owner = store, run_id, owner
        self.on_cancel = on_cancel
        self.lost: BaseException | None = None
        self.failures = 0  # renewals that failed and were retried
        self._stopped = False
        self._wake = threading.Event()  # set by stop() and by poke()
        interval = max(float(getattr(store, "lease_s", 300.0)) / 3.0, 0.05)
        self._thread = threading.Thread(
            target=self._beat, args=(interval,), daemon=True, name="fsm-agent-heartbeat"
        )
        with _BEATING_LOCK:
            _BEATING[(run_id, owner)] = self
        self._thread.start()

    def _beat(self, interval: float) -> None:
        wait, retry = interval, min(self.RETRY_S, interval)
        while True:
            self._wake.wait(wait)
            # (A poke between the wait and this clear is answered by this renewal.)
            self._wake.clear()
            if self._stopped:
                return
            try:
                asked = self.store.renew(self.run_id, self.owner)
            except RunNotFound:
                wait = interval  # a new run's first save has not created it yet
                continue
            except RunBusy as exc:  # taken over: nothing of this driving commits now
                self.lost = exc
                return
            except Exception as exc:  # the store is unreachable now (a StoreError): retry
                self.lost = exc
                self.failures += 1
                wait, retry = retry, min(retry * 2, interval)
                continue
            self.lost = None
            wait, retry = interval, min(self.RETRY_S, interval)
            if isinstance(asked, CancelRequest) and self.on_cancel is not None:
                self.on_cancel(asked)

    def stop(self) -> None:
        with _BEATING_LOCK:
            if _BEATING.get((self.run_id, self.owner)) is self:
                del _BEATING[(self.run_id, self.owner)]
        self._stopped = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


#: The heartbeats of this process, by ``(run_id, owner)`` (for :func:`poke`).
_BEATING: dict[tuple[str, str], Heartbeat] = {}
_BEATING_LOCK = threading.Lock()


def poke(run_id: str, owner: str) -> bool:
    """Renew ``owner``'s lease on ``run_id`` now, if this process beats for it: its
    renewal brings a cancel asked of the run at once instead of a third of a lease later.
    Whether there was such a heartbeat."""
    with _BEATING_LOCK:
        beating = _BEATING.get((run_id, owner))
    if beating is None:
        return False
    beating._wake.set()
    return True
