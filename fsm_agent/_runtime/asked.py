"""A cancel asked of the run being driven, as its store handed it over (``durable/
cancel.py``): with the claim (a request stored before this driving began) or with a
lease renewal of the heartbeat, on the heartbeat's thread.

The drivers look at it before each request that would ask the world (the model, a tool,
a write's intent, a backoff's sleep) — an attribute read, no store round trip — and stop
the run there by throwing :attr:`CancelAsked.cancelled` into the loop, which takes the
``cancel`` edge with the request's ``by``/``at``/``note``. The async driver also
interrupts a model call, a tool call or a sleep in flight when the request arrives
(:meth:`CancelAsked.on_delivery`): a write interrupted so goes to
``review_required/outcome_unknown`` (R6), as under Ctrl-C.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from fsm_agent._core.loop import Cancelled
from fsm_agent._durable.store import CancelRequest

__all__ = ["CancelAsked"]


class CancelAsked:
    """Whether (and by whom) a cancel was asked of this driving's run; thread-safe."""

    def __init__(self) -> None:
        #: What the driver throws into the loop, once a request is here.
        self.cancelled: Cancelled | None = None
        self.request: CancelRequest | None = None
        self._lock = threading.Lock()
        self._wakers: list[Callable[[], object]] = []

    def deliver(self, request: CancelRequest) -> None:
        """The store says ``request`` was asked (any thread; the first one counts: the
        store keeps only the first, so a later renewal returns the same)."""
        with self._lock:
            if self.cancelled is not None:
                return
            self.request = request
            self.cancelled = Cancelled(by=request.by, at=request.at, note=request.note)
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            with contextlib.suppress(RuntimeError):  # its event loop has closed meanwhile
                wake()

    def on_delivery(self, wake: Callable[[], object]) -> None:
        """Call ``wake`` (on the delivering thread) when a request arrives; at once if one
        is here already."""
        with self._lock:
            if self.cancelled is None:
                self._wakers.append(wake)
                return
        wake()

    def check(self) -> None:
        """Raise :attr:`cancelled` if a request is here."""
        if self.cancelled is not None:
            raise self.cancelled
