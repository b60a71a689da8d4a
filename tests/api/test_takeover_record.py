"""A run taken over from a worker that died holding it says so on its record (a
recovered error, WORKER_LOST): otherwise a takeover looked like an uneventful run."""

from __future__ import annotations

from tests.api.conftest import Api
from tests.api.helpers import parked_demo_run


async def test_a_takeover_is_on_the_record_and_a_handback_is_not(api: Api) -> None:
    run_id, approval_id, _ = await parked_demo_run(api)
    # Seen parked is not yet given back: the drive releases its lease after the event.
    await api.settle(run_id)
    # A worker claimed the run when the decision came, and died: its lease ran out.
    store = api.engine.store
    assert await store.take_lease(run_id, "dead-worker", -1.0) is not None

    assert (await api.decide(run_id, approval_id, "approve")).status_code == 202
    final = await api.settle(run_id)

    assert final["state"] == "succeeded"
    events = await api.events(run_id)
    lost = [e for e in events if e["type"] == "error"]
    assert [e["data"]["code"] for e in lost] == ["WORKER_LOST"]
    assert lost[0]["data"]["worker"] == "dead-worker"
    assert lost[0]["data"]["recovery"] == "resume"
    assert api.engine.owner in lost[0]["data"]["message"]
    # Where the record shows it: after the decision, before the run went on.
    types = [e["type"] for e in events]
    assert types.index("approval_result") < types.index("error") < len(types) - 1

    # A run whose drives gave it back (parking, here) has no such error.
    other, other_approval, _ = await parked_demo_run(api)
    await api.decide(other, other_approval, "approve")
    await api.settle(other)
    assert [e for e in await api.events(other) if e["type"] == "error"] == []
