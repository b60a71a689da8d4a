"""The executor node alone: guarded calls in a hand-made state, run through the ledger
on a FakeStore, asserting the update and the ledger rows, events and artifacts it wrote."""

from __future__ import annotations

import pytest

from nodes.executor import make_executor_node, resolution_call
from runtime import ids
from runtime.ledger import INLINE_OUTPUT_BYTES, new_ledger_row
from runtime.model import Decision, ProposedCall, Usage
from tests.agents import call, counter_lines
from tests.unit.node_env import NodeEnv


async def test_executor_runs_the_guarded_calls(env: NodeEnv) -> None:
    guarded = await env.guard(call("echo", text="ab", n=2))
    state = env.state(usage=Usage(tool_calls=3).model_dump(), calls=guarded["calls"])

    update = await make_executor_node(env.tools)(state, env.runtime)

    tc_id = ids.tool_call_id(env.run_id, 0, 0)
    assert update["tool_calls"] == [tc_id] and update["calls"] == []
    [obs] = update["observations"]
    assert obs["status"] == "succeeded" and obs["output"] == {"text": "abab"}
    assert update["usage"]["tool_calls"] == 4 and "outcome" not in update
    row = await env.store.get_tool_call(tc_id)
    assert row is not None and (row.status, row.attempts) == ("succeeded", 1)
    assert row.idempotency_key == ids.idempotency_key(tc_id)
    assert await env.event_types() == ["state", "action", "result"]


async def test_executor_replayed_does_not_run_a_side_effect_twice(env: NodeEnv) -> None:
    guarded = await env.guard(call("counter", label="once"))
    node = make_executor_node(env.tools)

    first = await node(env.state(calls=guarded["calls"]), env.runtime)
    again = await node(env.state(calls=guarded["calls"]), env.runtime)  # LangGraph replays it

    assert len(counter_lines(env.data_dir)) == 1
    assert again["observations"] == first["observations"]
    assert await env.event_types() == ["state", "action", "result"]


async def test_executor_refuses_an_unapproved_call(env: NodeEnv) -> None:
    guarded = await env.guard(call("refund", amount=5))

    with pytest.raises(RuntimeError, match="no matching approval"):
        await make_executor_node(env.tools)(env.state(calls=guarded["calls"]), env.runtime)

    assert env.refunds == [] and await env.store.list_tool_calls(env.run_id) == []


async def test_executor_refuses_a_rejected_call(env: NodeEnv) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.approve(c, "rejected")

    with pytest.raises(RuntimeError, match="no matching approval"):
        await make_executor_node(env.tools)(env.state(calls=[c]), env.runtime)

    assert env.refunds == []


async def test_executor_refuses_an_approval_of_other_arguments(env: NodeEnv) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.approve(c)
    swapped = {**c, "args": {"amount": 500}, "args_hash": ids.content_hash({"amount": 500})}

    with pytest.raises(RuntimeError, match="no matching approval"):
        await make_executor_node(env.tools)(env.state(calls=[swapped]), env.runtime)

    assert env.refunds == []


async def test_executor_runs_an_approved_call(env: NodeEnv) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.approve(c)

    update = await make_executor_node(env.tools)(env.state(calls=[c]), env.runtime)

    assert env.refunds == [5] and update["observations"][0]["status"] == "succeeded"


async def test_a_business_error_goes_back_to_the_planner(env: NodeEnv) -> None:
    guarded = await env.guard(call("lookup", size=7))

    update = await make_executor_node(env.tools)(env.state(calls=guarded["calls"]), env.runtime)

    assert "outcome" not in update
    [obs] = update["observations"]
    assert obs["status"] == "TOOL_BUSINESS_ERROR" and obs["error"] == "no customer 7"
    row = await env.store.get_tool_call(obs["tool_call_id"])
    assert row is not None and row.status == "failed"


async def test_an_unavailable_tool_ends_the_run_after_its_retries(env: NodeEnv) -> None:
    guarded = await env.guard(call("flaky", seconds=0))

    update = await make_executor_node(env.tools)(env.state(calls=guarded["calls"]), env.runtime)

    assert update["outcome"]["status"] == "failed"
    assert update["outcome"]["code"] == "TOOL_UNAVAILABLE"
    [row] = await env.store.list_tool_calls(env.run_id)
    assert (row.status, row.attempts) == ("failed", 3)
    assert len((env.data_dir / "flaky.log").read_text().splitlines()) == 3


async def test_a_big_output_becomes_an_artifact(env: NodeEnv) -> None:
    guarded = await env.guard(call("report", size=INLINE_OUTPUT_BYTES))

    update = await make_executor_node(env.tools)(env.state(calls=guarded["calls"]), env.runtime)

    [obs] = update["observations"]
    art = obs["artifact_id"]
    assert art is not None and obs["output"]["artifact_id"] == art
    assert await env.store.artifact_exists(art)
    stored = await env.store.get_artifact(art)
    assert stored is not None and len(stored[1]) > INLINE_OUTPUT_BYTES
    assert await env.event_types() == ["state", "action", "artifact", "result"]


async def test_an_interrupted_side_effect_waits_for_a_human(env: NodeEnv) -> None:
    """A drive died after counting the attempt: the executor must neither guess nor re-run."""
    [c] = (await env.guard(call("counter", label="once")))["calls"]
    spec = env.tools.resolve("counter", "1")
    assert spec is not None
    row = new_ledger_row(env.run_id, 0, 0, c["tool_call_id"], spec, c["args"], c["args_hash"])
    await env.store.start_tool_call(row, {})  # the dead drive's claim
    node = make_executor_node(env.tools)

    update = await node(env.state(calls=[c]), env.runtime)

    assert counter_lines(env.data_dir) == []
    assert update["observations"] == [] and update["tool_calls"] == []
    assert update["usage"]["tool_calls"] == 1  # charged once, as it was started
    [ask] = update["calls"]
    assert ask["kind"] == "outcome_unknown" and ask["needs_approval"] is True
    assert ask["unknown_after_attempts"] == 1
    stuck = await env.store.get_tool_call(c["tool_call_id"])
    assert stuck is not None and stuck.status == "unknown" and stuck.error is not None
    # The human is told what the ledger knows: not that the process stopped, which
    # it may not have (the database may have failed as the outcome was written).
    why = stuck.error["message"]
    assert "its process stopped, or the database failed" in why
    assert f"the ledger says {why!r}. Approve to run it again" in ask["reason"], ask["reason"]
    # Quoted, and bounded: the ledger's message may be a handler's or a remote system's.
    long = stuck.model_copy(update={"error": {"message": "approve me! " * 10_000}})
    assert len(resolution_call(c, long)["reason"]) < 600

    await env.approve(ask)  # "run it again"
    rerun = await node(env.state(calls=[ask], usage=update["usage"]), env.runtime)

    assert len(counter_lines(env.data_dir)) == 1
    # One call, one charge: running it again on a human's word is not a second call.
    assert rerun["usage"]["tool_calls"] == 1
    assert rerun["observations"][0]["status"] == "succeeded"
    done = await env.store.get_tool_call(c["tool_call_id"])
    assert done is not None and (done.status, done.attempts) == ("succeeded", 2)
    # The log: the re-run's action numbers its attempt, and its result does not repeat
    # the stopped attempt the `unknown` result already answered.
    log = await env.store.list_events(env.run_id)
    events = [e for e in log if e.type in ("action", "result")]
    assert [(e.type, e.data.get("status"), e.data.get("attempt")) for e in events] == [
        ("action", None, None),  # the dead drive's
        ("result", "unknown", None),
        ("action", None, 2),
        ("result", "succeeded", None),
    ]
    assert "retried" not in events[-1].data


async def test_a_failed_call_ends_the_run_though_another_is_unknown(env: NodeEnv) -> None:
    """One call of the step failed for good and another's outcome is unknown: the run
    fails (as without the unknown one), listing the unknown effect; it asked a human
    about that one instead, and once they had ruled the failure was lost, and the run
    could succeed."""
    decision = Decision(
        kind="tool_calls",
        summary="two",
        tool_calls=[
            ProposedCall(tool="counter", args={"label": "once"}),
            ProposedCall(tool="flaky", args={"seconds": 0}),
        ],
    )
    counted, flaky = (await env.guard(decision))["calls"]
    spec = env.tools.resolve("counter", "1")
    assert spec is not None
    row = new_ledger_row(
        env.run_id, 0, 0, counted["tool_call_id"], spec, counted["args"], counted["args_hash"]
    )
    await env.store.start_tool_call(row, {})  # a dead drive's claim: its outcome unknown

    update = await make_executor_node(env.tools)(env.state(calls=[counted, flaky]), env.runtime)

    assert update["outcome"]["code"] == "TOOL_UNAVAILABLE", update
    assert update["outcome"]["tool_call_id"] == flaky["tool_call_id"]
    assert update["calls"] == []  # nobody is asked: the run ends
    statuses = {r.tool: r.status for r in await env.store.list_tool_calls(env.run_id)}
    assert statuses == {"counter": "unknown", "flaky": "failed"}
    assert counter_lines(env.data_dir) == []
