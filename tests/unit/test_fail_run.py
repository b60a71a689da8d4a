"""Failing a run while a human decides its question: the approval moves the run from
waiting_human to executing without the lease, between fail_run's read and its write."""

from __future__ import annotations

from typing import Any

from runtime.adapter import fail_run
from runtime.errors import Code
from runtime.lifecycle import State
from runtime.model import Run
from runtime.store.base import RunStore
from tests.unit.conftest import MakeRun
from tests.unit.test_fencing import store_of
from tests.unit.test_store import pending_approval


class DecidedAfterRead:
    """A drive's store view; a human approves right after the view's first read of the run."""

    def __init__(self, view: RunStore, base: RunStore, approval_id: str) -> None:
        self.view, self.base, self.approval_id = view, base, approval_id
        self.decided = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)

    async def get_run(self, run_id: str) -> Run | None:
        run = await self.view.get_run(run_id)
        if not self.decided:
            self.decided = True
            await self.base.decide_approval(
                self.approval_id, "approved", decided_by="u-mgr", comment=None
            )
        return run


async def test_a_cancel_racing_an_approval_still_ends_cancelled(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store, state=State.EXECUTING)
    version = await store.take_lease(run.run_id, "w1", 30.0)
    assert version is not None
    view = store.fenced(run.run_id, version)
    approval = pending_approval(run.run_id, "ap-race")
    await store.ensure_approval(approval, {"approval_id": approval.approval_id})
    await view.park(run.run_id, approval.approval_id, State.EXECUTING)

    racing: Any = DecidedAfterRead(view, store, approval.approval_id)
    final = await fail_run(racing, run.run_id, Code.RUN_CANCELLED, "stop")

    assert racing.decided
    assert final is not None and final.state is State.FAILED
    assert final.outcome is not None and final.outcome.code is Code.RUN_CANCELLED
    states = [e.data["to"] for e in await store.list_events(run.run_id) if e.type == "state"]
    assert states[-3:] == ["waiting_human", "executing", "failed"]
    errors = [e.data["code"] for e in await store.list_events(run.run_id) if e.type == "error"]
    assert errors == ["RUN_CANCELLED"]
