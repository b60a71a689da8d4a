"""The adapter: which graph progress fires which lifecycle trigger, on a real store."""

from __future__ import annotations

from runtime.adapter import Adapter
from runtime.lifecycle import State
from runtime.store.base import RunStore
from tests.unit.conftest import MakeRun


async def test_from_waiting_human_only_calls_a_human_approved_fire_approved(
    backend: object, make_run: MakeRun
) -> None:
    """A drive resuming a parked run replays the approval node (after a rejection too):
    that moves nothing. The executor starting means calls a human approved run (an
    unknown outcome sent back to run again, a later one of the step not): approved."""
    store: RunStore = backend.store  # type: ignore[attr-defined]
    run = await make_run(store, state=State.WAITING_HUMAN)
    adapter = Adapter(store, run)

    await adapter.on_task_start("approval")
    assert (await store.get_run(run.run_id)).state is State.WAITING_HUMAN  # type: ignore[union-attr]

    await adapter.on_task_start("executor")

    moved = await store.get_run(run.run_id)
    assert moved is not None and moved.state is State.EXECUTING
    last = (await store.list_events(run.run_id))[-1].data
    assert (last["from"], last["to"], last["trigger"]) == ("waiting_human", "executing", "approved")
