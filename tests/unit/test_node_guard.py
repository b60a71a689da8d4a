"""The guard node alone: a hand-made decision, the default policy, a FakeStore."""

from __future__ import annotations

from runtime import ids
from runtime.model import Decision, Usage
from tests.agents import call
from tests.unit.node_env import NodeEnv, limits


async def test_guard_passes_an_allowed_call(env: NodeEnv) -> None:
    update = await env.guard(call("echo", text="a", n=2))

    [c] = update["calls"]
    assert c["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0) and c["call_index"] == 0
    assert (c["tool"], c["version"], c["args"]) == ("echo", "1", {"text": "a", "n": 2})
    assert c["args_hash"] == ids.content_hash(c["args"]) and c["needs_approval"] is False
    assert "outcome" not in update and "observations" not in update
    assert await env.event_types() == ["state"]  # a pass writes nothing


async def test_guard_unknown_tool_is_an_observation_and_an_error_event(env: NodeEnv) -> None:
    update = await env.guard(call("teleport", where="mars"))

    assert update["calls"] == [] and "outcome" not in update and update["memory_version"] == 1
    [obs] = update["observations"]
    assert obs["status"] == "TOOL_NOT_FOUND" and "teleport" in obs["error"]
    [*_, event] = await env.store.list_events(env.run_id)
    assert event.type == "error" and event.data["code"] == "TOOL_NOT_FOUND"
    assert event.data["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0)
    # It never ran, so no ledger row names it: the event says which proposal it was.
    assert (event.data["step_index"], event.data["call_index"]) == (0, 0)


async def test_guard_says_each_error_once_when_replayed(env: NodeEnv) -> None:
    first = await env.guard(call("teleport", where="mars"))
    again = await env.guard(call("teleport", where="mars"))

    assert first == again
    assert await env.event_types() == ["state", "error"]


async def test_guard_bad_arguments_name_the_field(env: NodeEnv) -> None:
    update = await env.guard(call("echo", text="a", n="many"))

    assert update["calls"] == []
    [obs] = update["observations"]
    assert obs["status"] == "TOOL_ARGUMENT_INVALID" and obs["error"].startswith("n:")


async def test_guard_runs_a_step_whole_or_not_at_all(env: NodeEnv) -> None:
    good, bad = call("echo", text="a", n=1), call("echo", text="a", n=0)
    decision = Decision(kind="tool_calls", tool_calls=[*good.tool_calls, *bad.tool_calls])

    update = await env.guard(decision)

    assert update["calls"] == []
    # Both told to the planner, in the step's order: the valid call did not run either.
    assert [(o["tool_call_id"], o["status"]) for o in update["observations"]] == [
        (ids.tool_call_id(env.run_id, 0, 0), "CALL_NOT_RUN"),
        (ids.tool_call_id(env.run_id, 0, 1), "TOOL_ARGUMENT_INVALID"),
    ]
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["call_index"]) for e in errors] == [
        ("TOOL_ARGUMENT_INVALID", 1),
        ("CALL_NOT_RUN", 0),
    ]
    assert ids.tool_call_id(env.run_id, 0, 1) in errors[1]["message"]


async def test_guard_missing_scope_is_denied(env: NodeEnv) -> None:
    update = await env.guard(call("secret", amount=1))

    assert update["outcome"]["code"] == "POLICY_DENIED" and "vault" in update["outcome"]["message"]
    assert update["outcome"]["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0)
    assert update["calls"] == []
    # The run's end writes the one error event (the adapter's fail_run), not the node.
    assert [e for e in await env.store.list_events(env.run_id) if e.type == "error"] == []


async def test_a_denial_that_ends_the_run_says_nothing_is_to_be_replanned(
    env: NodeEnv,
) -> None:
    """An unknown tool, then a call denied for good, then a valid one: the unknown tool
    said "replan" though nothing was replanned, and the valid call was never mentioned."""
    decision = Decision(
        kind="tool_calls",
        tool_calls=[
            *call("teleport", where="mars").tool_calls,
            *call("secret", amount=1).tool_calls,
            *call("echo", text="a", n=1).tool_calls,
        ],
    )

    update = await env.guard(decision)

    assert update["outcome"]["code"] == "POLICY_DENIED"
    assert update["outcome"]["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 1)
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["call_index"], e["recovery"]) for e in errors] == [
        ("TOOL_NOT_FOUND", 0, "none"),
        ("CALL_NOT_RUN", 2, "none"),
    ]
    assert "ended the run" in errors[1]["message"] and "secret" in errors[1]["message"]


async def test_a_denial_can_go_back_to_the_planner(env: NodeEnv) -> None:
    update = await env.guard(call("secret_soft", amount=1))

    assert "outcome" not in update and update["calls"] == []
    [obs] = update["observations"]
    assert obs["status"] == "POLICY_DENIED" and "vault" in obs["error"]
    [*_, event] = await env.store.list_events(env.run_id)
    assert event.data["code"] == "POLICY_DENIED"
    assert event.data["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0)
    assert event.data["recovery"] == "replan"


async def test_a_step_with_a_replanned_denial_runs_none_of_its_calls(env: NodeEnv) -> None:
    denied, risky = call("secret_soft", amount=1), call("refund", amount=5)
    decision = Decision(kind="tool_calls", tool_calls=[*denied.tool_calls, *risky.tool_calls])

    update = await env.guard(decision)

    assert update["calls"] == [] and "outcome" not in update
    assert [o["status"] for o in update["observations"]] == ["POLICY_DENIED", "CALL_NOT_RUN"]
    assert await env.store.list_approvals(run_id=env.run_id) == []


async def test_guard_high_risk_needs_approval(env: NodeEnv) -> None:
    update = await env.guard(call("refund", amount=5), step_index=4)

    [c] = update["calls"]
    assert c["needs_approval"] is True and "high-risk" in c["reason"]
    assert c["tool_call_id"] == ids.tool_call_id(env.run_id, 4, 0)
    assert await env.store.list_approvals(run_id=env.run_id) == []  # asking is approval's job


async def test_guard_reserves_the_tool_budget(env: NodeEnv) -> None:
    decision = Decision(
        kind="tool_calls", tool_calls=[call("echo", text="a", n=1).tool_calls[0]] * 2
    )
    state = {
        "usage": Usage(tool_calls=1).model_dump(),
        "limits": limits(budget={"max_tool_calls": 2}),
    }

    update = await env.guard(decision, **state)

    assert update["outcome"]["code"] == "RUN_BUDGET_EXCEEDED" and update["calls"] == []
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["call_index"], e["recovery"]) for e in errors] == [
        ("CALL_NOT_RUN", 0, "none"),
        ("CALL_NOT_RUN", 1, "none"),
    ]
    assert errors[0]["message"].startswith("not run: the budget (max_tool_calls 2: 1 used")
    within = await env.guard(decision, limits=limits(budget={"max_tool_calls": 2}))
    assert len(within["calls"]) == 2
