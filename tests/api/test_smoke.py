from __future__ import annotations

from tests.api.conftest import Api, states


async def test_typo_fixer_runs_to_success(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    events = await api.events(run["run_id"])
    assert states(events) == [
        "pending",
        "planning",
        "executing",
        "planning",
        "executing",
        "planning",
        "executing",
        "succeeded",
    ]
