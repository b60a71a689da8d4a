"""GET /runs/{id}/planner-context/{step}: what the planner was handed for each step,
read back from the checkpoints, sub-agents' steps included (the demo hands off)."""

from __future__ import annotations

import itertools
from typing import Any

from tests.api.conftest import EAST, QUESTION, Api
from tests.api.helpers import problem

WAIT = {"Prefer": "wait=30"}


async def finished_demo_run(api: Api) -> dict[str, Any]:
    parked = (
        await api.client.post("/runs", json={"input": QUESTION, "context": EAST}, headers=WAIT)
    ).json()
    assert parked["state"] == "waiting_human", parked
    await api.decide(parked["run_id"], parked["pending_approval"]["approval_id"], "approve")
    done: dict[str, Any] = (await api.client.get(f"/runs/{parked['run_id']}", headers=WAIT)).json()
    assert done["state"] == "succeeded", done
    return done


async def test_each_step_shows_what_its_planner_was_handed(api: Api) -> None:
    run = await finished_demo_run(api)
    run_id = run["run_id"]
    steps = (await api.client.get(f"/runs/{run_id}/steps")).json()
    assert len(steps) >= 4
    contexts = []
    for step in steps:
        resp = await api.client.get(f"/runs/{run_id}/planner-context/{step['step_index']}")
        assert resp.status_code == 200, resp.text
        contexts.append(resp.json())
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for step, ctx in zip(steps, contexts, strict=True):
        assert ctx["step_index"] == step["step_index"]
        assert ctx["agent_id"] == (step["decision"].get("agent_id") or run["agent_id"])
        assert ctx["usage"]["steps"] == step["step_index"]
        by_agent.setdefault(ctx["agent_id"], []).append(ctx)
    root, subs = by_agent.pop(run["agent_id"]), by_agent
    assert subs, "the demo hands off to a sub-agent"
    # The run's own planner starts from the input and nothing seen; each of its later
    # steps has seen at least what the one before had, the sub-agent's result among them.
    assert root[0]["input"] == QUESTION and root[0]["observations"] == []
    seen = [[o["tool_call_id"] for o in ctx["observations"]] for ctx in root]
    for before, after in itertools.pairwise(seen):
        assert after[: len(before)] == before and len(after) > len(before)
    assert any(o["tool"].startswith("handoff_to_") for o in root[-1]["observations"])
    # A sub-agent's planner was handed its task and data, and only its own observations.
    handoffs = {
        s["decision"]["handoff"]["agent_id"]: s["decision"]["handoff"]
        for s in steps
        if s["decision"]["kind"] == "handoff"
    }
    for agent, ctxs in subs.items():
        assert ctxs[0]["observations"] == [], agent
        for ctx in ctxs:
            assert ctx["input"] == handoffs[agent]["task"]
            assert ctx["task_data"] == handoffs[agent]["data"]
        own = {o["tool_call_id"] for c in ctxs for o in c["observations"]}
        assert not own & {i for s in seen for i in s}
    # Every observation is a call the ledger holds, made before the step it informed.
    ledger = {
        c["tool_call_id"]: c for c in (await api.client.get(f"/runs/{run_id}/tool-calls")).json()
    }
    for ctx in contexts:
        for o in ctx["observations"]:
            if not o["tool"].startswith("handoff_to_"):
                assert ledger[o["tool_call_id"]]["step_index"] < ctx["step_index"]
    # The checkpoint view's ref names where it resolves.
    view = (await api.client.get(f"/runs/{run_id}/checkpoint")).json()
    assert view["planner_context_url"] == (f"/runs/{run_id}/planner-context/{view['step_index']}")
    assert (await api.client.get(view["planner_context_url"])).status_code == 200


async def test_a_step_never_planned_is_404(api: Api) -> None:
    run = await finished_demo_run(api)
    problem(
        await api.client.get(f"/runs/{run['run_id']}/planner-context/999"), 404, "STEP_NOT_FOUND"
    )
    problem(
        await api.client.get(f"/runs/{run['run_id']}/planner-context/-1"), 422, "VALIDATION_ERROR"
    )
    problem(await api.client.get("/runs/run-nope/planner-context/0"), 404, "RUN_NOT_FOUND")


async def test_a_step_whose_planner_decided_nothing_has_no_context(api: Api) -> None:
    """Step 1's planner is never asked (the run's one step is spent): no decision to
    explain, as /steps says, though a checkpoint was written before it."""
    run = await api.create(agent_id="typo_fixer", input="echo", options={"max_steps": 1})
    final = await api.settle(run["run_id"])
    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert [
        s["step_index"] for s in (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
    ] == [0]
    assert (await api.client.get(f"/runs/{run['run_id']}/planner-context/0")).status_code == 200
    problem(await api.client.get(f"/runs/{run['run_id']}/planner-context/1"), 404, "STEP_NOT_FOUND")
