"""A run's checkpoints hold plain JSON values only: LangGraph reads them back without
a registered type (its strict msgpack mode refuses any other), and so can Studio."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import Api
from tests.api.helpers import parked_demo_run

JSON_TYPES = (str, int, float, bool, type(None))


def not_json(value: Any, path: str = "") -> list[str]:
    """Where ``value`` holds something other than JSON (an enum is a str subclass: its
    exact type is what counts)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in not_json(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in not_json(v, f"{path}[{i}]")]
    return [] if type(value) in JSON_TYPES else [f"{path}: {type(value).__name__}"]


async def foreign_values(api: Api, run_id: str) -> list[str]:
    run = await api.settle(run_id)
    graph = api.engine.graphs[run["agent_id"]]
    config: Any = {"configurable": {"thread_id": run_id}}
    found = []
    async for snapshot in graph.aget_state_history(config):
        found += not_json(snapshot.values)
    return found


async def test_every_checkpoint_of_runs_that_ended_each_way_is_plain_json(api: Api) -> None:
    denied = await api.create(input="Which SKUs drove last week's sales drop in the north region?")
    approved, approval, _ = await parked_demo_run(api)
    await api.decide(approved, approval, "approve")
    rejected, approval, _ = await parked_demo_run(api)
    await api.decide(rejected, approval, "reject")

    scripted = [
        await api.create(agent_id="typo_fixer", input="x"),  # an argument error, replanned
        await api.create(agent_id="wanderer", input="x"),  # an unknown tool
        await api.create(agent_id="stubborn", input="x", options={"max_steps": 2}),
        await api.create(agent_id="broken", input="x"),  # a tool that stays unavailable
        await api.create(agent_id="delegator", input="typo_fixer go"),  # a handoff
    ]

    outcomes = []
    for run_id in (denied["run_id"], approved, rejected, *(r["run_id"] for r in scripted)):
        assert await foreign_values(api, run_id) == [], run_id
        run = await api.settle(run_id)
        outcomes.append((run["state"], (run["outcome"] or {}).get("code")))
    assert outcomes == [
        ("failed", "POLICY_DENIED"),
        ("succeeded", None),
        ("failed", "APPROVAL_REJECTED"),
        ("succeeded", None),
        ("succeeded", None),
        ("failed", "RUN_BUDGET_EXCEEDED"),
        ("failed", "TOOL_UNAVAILABLE"),
        ("succeeded", None),
    ]
