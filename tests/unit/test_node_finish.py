"""The finish node alone: the terminal check on a hand-made state and a FakeStore."""

from __future__ import annotations

from nodes.executor import make_executor_node
from nodes.finish import make_finish_node
from runtime.ledger import new_ledger_row
from runtime.model import Decision
from tests.agents import call, finish
from tests.unit.node_env import NodeEnv


async def test_finish_succeeds_with_the_result(env: NodeEnv) -> None:
    observations = [{"artifact_id": "sha256:b"}, {"artifact_id": None}, {"artifact_id": "sha256:a"}]
    decision = Decision(kind="finish", summary="s", answer="42", data={"n": 1})
    state = env.state(decision, observations=observations)

    update = await make_finish_node()(state, env.runtime)

    assert update["outcome"] == {"status": "succeeded", "code": None, "message": ""}
    assert update["result"] == {
        "answer": "42",
        "summary": "s",
        "data": {"n": 1},
        "artifacts": ["sha256:a", "sha256:b"],
    }
    assert await env.event_types() == ["state"]  # the adapter, not the node, ends the run


async def test_finish_accepts_a_run_whose_work_is_done(env: NodeEnv) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.approve(c)
    ran = await make_executor_node(env.tools)(env.state(calls=[c]), env.runtime)

    update = await make_finish_node()(env.state(finish("paid"), **ran), env.runtime)

    assert update["outcome"]["status"] == "succeeded"


async def test_finish_refuses_while_an_approval_is_pending(env: NodeEnv) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.store.ensure_approval(env.approval(c), {})

    update = await make_finish_node()(env.state(finish("done"), memory_version=2), env.runtime)

    [obs] = update["observations"]
    assert obs["status"] == "FINISH_REFUSED" and "approval" in obs["error"]
    assert "result" not in update and "outcome" not in update and update["memory_version"] == 3
    # The log says why the run went on after a step that proposed to finish, once
    # however often the node runs (a resume runs it again).
    await make_finish_node()(env.state(finish("done"), memory_version=2), env.runtime)
    refused = [e for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e.data["code"], e.data["recovery"], e.data["step_index"]) for e in refused] == [
        ("FINISH_REFUSED", "replan", obs["step_index"])
    ]
    assert "approval" in refused[0].data["message"]


async def test_finish_refuses_with_calls_still_queued(env: NodeEnv) -> None:
    guarded = await env.guard(call("echo", text="a", n=1))

    update = await make_finish_node()(env.state(finish("done"), **guarded), env.runtime)

    assert "queued" in update["observations"][0]["error"] and "outcome" not in update


async def test_finish_refuses_while_a_tool_call_runs(env: NodeEnv) -> None:
    [c] = (await env.guard(call("counter", label="x")))["calls"]
    spec = env.tools.resolve("counter", "1")
    assert spec is not None
    row = new_ledger_row(env.run_id, 0, 0, c["tool_call_id"], spec, c["args"], c["args_hash"])
    await env.store.start_tool_call(row, {})

    update = await make_finish_node()(env.state(finish("done")), env.runtime)

    assert f"{c['tool_call_id']} is still running" in update["observations"][0]["error"]


async def test_finish_refuses_a_result_whose_artifact_is_missing(env: NodeEnv) -> None:
    [c] = (await env.guard(call("echo", text="a", n=1)))["calls"]
    await make_executor_node(env.tools)(env.state(calls=[c]), env.runtime)
    await env.store.update_tool_call(
        c["tool_call_id"], from_status=("succeeded",), artifact_id="sha256:gone"
    )

    update = await make_finish_node()(env.state(finish("done")), env.runtime)

    assert "artifact sha256:gone is not stored" in update["observations"][0]["error"]
