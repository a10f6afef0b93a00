"""A run stored at checkpoint layout 2 (by the engine before v3) resumes under layout 3:
reviewed, driven to its end, and checkpointed at layout 3 from then on."""

from __future__ import annotations

from conftest import Backend, make_runtime, say
from snapshot_v2 import load_v2

from fsm_agent import MemoryStore
from fsm_agent._durable import owners
from fsm_agent._durable.store import Checkpoint

V2 = load_v2()


def test_a_run_paused_at_layout_2_is_approved_and_finishes(backend: Backend) -> None:
    store = MemoryStore()
    owner = owners.new_owner()
    checkpoint = Checkpoint(V2["snapshot"], list(enumerate(V2["messages"])))
    store.create_run("r1", V2["header"], owner, V2["events"], checkpoint)
    store.release("r1", owner)
    rt = make_runtime([say("Filed.")], backend, store=store, approval=True)
    result = rt.approve("r1", "c1", resume=True)
    assert (result.status, result.answer) == ("done", "Filed.")
    assert [w["request_id"] for w in backend.writes] == ["R-1"]  # the approved write, once
    assert backend.lookups == ["A"]
    stored = store.load_run("r1").snapshot
    assert stored["version"] == 3 and "machine_hash" not in stored["body"]
