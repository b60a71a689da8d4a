"""The handoff nodes alone on a FakeStore, and a compiled graph that interrupts in a sub-agent."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import ValidationError

from graphs.run_graph import build_run_graph, hosted_agents
from nodes.finish import make_finish_node
from nodes.handoff import MAX_DEPTH, dispatch, make_handback_node, make_handoff_node
from runtime import ids
from runtime.agent import SubAgent
from runtime.context import Context
from runtime.events import handoff_tool
from runtime.model import Approval, Decision, Handoff, Usage
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from tests.agents import ScriptPlanner, call, finish
from tests.unit.node_env import NodeEnv


def handoff(agent_id: str, task: str = "do it", data: dict[str, Any] | None = None) -> Decision:
    return Decision(
        kind="handoff", summary="hand off", handoff=Handoff(agent_id=agent_id, task=task, data=data)
    )


def frame(hid: str, agent_id: str, step: int = 0, depth: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "handoff_id": hid,
        "agent_id": agent_id,
        "from_agent": "boss",
        "task": "sub task",
        "data": {"k": 1},
        "step_index": step,
        "depth": depth,
        **extra,
    }


def test_a_handoff_decision_names_its_handoff() -> None:
    with pytest.raises(ValidationError):
        Decision(kind="handoff", summary="to whom?")
    with pytest.raises(ValidationError):
        Decision(kind="finish", handoff=Handoff(agent_id="a", task="t"))


def test_two_different_agents_may_not_share_an_id(env: NodeEnv) -> None:
    policy = DefaultPolicy()
    a = SubAgent("writer", "one", ScriptPlanner(lambda v: finish("a")), env.tools, policy)
    b = SubAgent("writer", "two", ScriptPlanner(lambda v: finish("b")), env.tools, policy)
    root = SubAgent("boss", "", ScriptPlanner(lambda v: finish("x")), env.tools, policy, (a, b))
    with pytest.raises(ValueError, match="writer"):
        hosted_agents(root)
    again = SubAgent("boss", "", ScriptPlanner(lambda v: finish("x")), env.tools, policy, (a, a))
    assert set(hosted_agents(again)) == {"boss", "writer"}


async def test_handoff_pushes_a_frame_and_says_so_once(env: NodeEnv) -> None:
    node = make_handoff_node({"boss": {"writer"}}, "boss")
    state = env.state(handoff("writer", "write it", {"n": 2}), step_index=3)

    first = await node(state, env.runtime)
    again = await node(state, env.runtime)  # a replay after a crash

    hid = ids.handoff_id(env.run_id, 3)
    assert first == again
    [pushed] = first["handoff_stack"]
    assert pushed == {
        "handoff_id": hid,
        "agent_id": "writer",
        "from_agent": "boss",
        "task": "write it",
        "data": {"n": 2},
        "step_index": 3,
        "depth": 1,
    }
    events = [e for e in await env.store.list_events(env.run_id) if "handoff" in e.data]
    assert [(e.type, e.data["handoff"]["phase"], e.data["tool_call_id"]) for e in events] == [
        ("action", "start", hid)
    ]
    assert events[0].data["tool"] == "handoff_to_writer"


async def test_handoff_to_an_undeclared_agent_is_an_observation(env: NodeEnv) -> None:
    node = make_handoff_node({"boss": {"writer"}, "writer": set()}, "boss")

    refused = await node(env.state(handoff("hacker")), env.runtime)
    inner = env.state(handoff("writer"), handoff_stack=[frame("ho-1", "writer")])
    looped = await node(inner, env.runtime)

    assert "handoff_stack" not in refused
    [obs] = refused["observations"]
    assert (obs["status"], obs["tool"]) == ("AGENT_NOT_FOUND", handoff_tool("hacker"))
    assert "frame" not in obs  # the run's own agent's
    [obs] = looped["observations"]
    assert obs["status"] == "AGENT_NOT_FOUND" and obs["frame"] == "ho-1"
    hid = ids.handoff_id(env.run_id, 0)
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    # Both refusals answer step 0's handoff: one error event, as for a replayed node.
    assert [(e["code"], e["handoff_id"]) for e in errors] == [("AGENT_NOT_FOUND", hid)]
    assert not [e for e in await env.store.list_events(env.run_id) if "handoff" in e.data]


async def test_handoff_depth_is_bounded(env: NodeEnv) -> None:
    node = make_handoff_node({"a": {"a"}}, "a")
    deep = [frame(f"ho-{i}", "a", depth=i + 1) for i in range(MAX_DEPTH)]
    update = await node(env.state(handoff("a"), handoff_stack=deep), env.runtime)
    assert "handoff_stack" not in update
    assert f"depth {MAX_DEPTH}" in update["observations"][0]["error"]
    # Not AGENT_NOT_FOUND, as it was: the agent is there, the stack is full.
    assert update["observations"][0]["status"] == "HANDOFF_TOO_DEEP"


async def test_dispatch_shows_the_sub_agent_its_task_and_its_own_observations(env: NodeEnv) -> None:
    seen: list[dict[str, Any]] = []

    async def writer_node(state: Any, runtime: Any) -> dict[str, Any]:
        seen.append(state)
        return {"observations": [{"step_index": 2, "tool": "x", "tool_call_id": "t"}]}

    async def boss_node(state: Any, runtime: Any) -> dict[str, Any]:
        raise AssertionError("the boss is not in control")

    node = dispatch({"boss": boss_node, "writer": writer_node}, "boss")
    mine = {"step_index": 1, "tool": "y", "tool_call_id": "u", "frame": "ho-1"}
    state = env.state(
        handoff_stack=[frame("ho-1", "writer")],
        observations=[{"step_index": 0, "tool": "z", "tool_call_id": "v"}, mine],
    )

    update = await node(state, env.runtime)

    assert seen[0]["input"] == "sub task" and seen[0]["task_data"] == {"k": 1}
    assert seen[0]["observations"] == [mine]
    assert update["observations"][0]["frame"] == "ho-1"


async def test_handback_pops_the_frame_and_answers_the_callers_step(env: NodeEnv) -> None:
    art = "sha256:" + "a" * 64
    state = env.state(
        Decision(kind="finish", summary="done", answer="written", data={"n": 1}),
        step_index=5,
        handoff_stack=[frame("ho-outer", "mid", step=1), frame("ho-inner", "writer", step=3)],
        observations=[
            {
                "step_index": 4,
                "tool": "write",
                "tool_call_id": "t",
                "artifact_id": art,
                "frame": "ho-inner",
            },
            {
                "step_index": 2,
                "tool": "other",
                "tool_call_id": "o",
                "artifact_id": "x",
                "frame": "ho-outer",
            },
        ],
    )

    update = await make_handback_node()(state, env.runtime)

    assert [f["handoff_id"] for f in update["handoff_stack"]] == ["ho-outer"]
    [back] = update["observations"]
    assert back["frame"] == "ho-outer"  # what the caller, itself a sub-agent, sees
    assert (back["step_index"], back["tool_call_id"]) == (3, "ho-inner")
    assert back["tool"] == handoff_tool("writer") and back["status"] == "succeeded"
    assert back["output"] == {"answer": "written", "data": {"n": 1}, "artifacts": [art]}
    [event] = [e for e in await env.store.list_events(env.run_id) if "handoff" in e.data]
    assert event.type == "result" and event.data["tool_call_id"] == "ho-inner"
    assert (event.data["tool"], event.data["status"]) == (handoff_tool("writer"), "succeeded")
    assert event.data["artifact_id"] == art and event.data["output"] == "written"
    move = event.data["handoff"]
    assert (move["phase"], move["from_agent"], move["to_agent"]) == ("return", "writer", "boss")
    assert move["step_index"] == 3  # the handoff's, as the observation's (not the finish's 5)


@pytest.mark.parametrize("made", [1, 2], ids=["one artifact", "two artifacts"])
async def test_artifacts_a_nested_sub_agent_made_reach_its_caller_and_the_run(
    env: NodeEnv, made: int
) -> None:
    """A handback names an artifact as ``artifact_id`` only when it is the only one: two
    made by a nested sub-agent were lost from the middle agent's and the run's result."""
    arts = ["sha256:" + c * 64 for c in "ab"[:made]]
    outer, inner = frame("ho-outer", "mid", step=0), frame("ho-inner", "writer", step=1, depth=2)
    done = Decision(kind="finish", summary="done", answer="done")
    wrote = [
        {"step_index": 2, "tool": "write", "tool_call_id": art, "artifact_id": art} for art in arts
    ]
    inner_back = await make_handback_node()(
        env.state(
            done,
            step_index=3,
            handoff_stack=[outer, inner],
            observations=[{**o, "frame": "ho-inner"} for o in wrote],
        ),
        env.runtime,
    )
    [to_mid] = inner_back["observations"]
    outer_back = await make_handback_node()(
        env.state(done, step_index=4, handoff_stack=[outer], observations=[to_mid]), env.runtime
    )
    [to_root] = outer_back["observations"]
    assert to_root["output"]["artifacts"] == arts
    # A tool of the handoff's name is not a handback: its output is no list of artifacts.
    lookalike = {"tool": "handoff_to_x", "tool_call_id": "tc-1", "output": {"artifacts": ["z"]}}
    finished = await make_finish_node()(
        env.state(done, step_index=5, observations=[to_root, lookalike]), env.runtime
    )
    assert finished["result"]["artifacts"] == arts


async def test_handback_refused_while_an_approval_is_open(env: NodeEnv) -> None:
    c = (await env.guard(call("refund", amount=5)))["calls"][0]
    await env.store.ensure_approval(env.approval(c), {})
    state = env.state(
        Decision(kind="finish", summary="done"), handoff_stack=[frame("ho-1", "writer")]
    )

    update = await make_handback_node()(state, env.runtime)

    assert "handoff_stack" not in update
    [obs] = update["observations"]
    assert obs["status"] == "FINISH_REFUSED" and obs["frame"] == "ho-1"


async def test_interrupt_inside_a_sub_agent_resumes_there(env: NodeEnv) -> None:
    """LangGraph alone (as in Studio): the approval's interrupt and its resume, in the sub-agent."""
    views: list[PlannerView] = []

    def refunder(view: PlannerView) -> Decision:
        views.append(view)
        if not view.observations:
            return call("refund", amount=int((view.task_data or {})["amount"]))
        return finish(f"refund {view.observations[-1].status}")

    def boss(view: PlannerView) -> Decision:
        back = [o for o in view.observations if o.tool == handoff_tool("refunder")]
        if not back:
            return handoff("refunder", "refund the customer", {"amount": 7})
        return finish(f"refunder said {back[0].output['answer']}")

    sub = SubAgent("refunder", "refunds", ScriptPlanner(refunder), env.tools, DefaultPolicy())
    graph = build_run_graph(
        ScriptPlanner(boss), env.tools, DefaultPolicy(), agent_id="boss", handoffs=[sub]
    ).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": env.run_id}}

    async def drive(graph_input: Any) -> dict[str, Any]:
        ctx = Context(run_id=env.run_id, store=env.store)
        return await graph.ainvoke(graph_input, config, context=ctx, durability="sync")  # type: ignore[no-any-return]

    await drive({"input": "help", "context": {"scope": []}, "usage": Usage().model_dump()})
    snapshot = await graph.aget_state(config)
    assert snapshot.next == ("approval",)
    [intr] = snapshot.interrupts
    # Step 0 was the handoff; the sub-agent's refund is step 1, so its ids cannot clash.
    assert intr.value["tool_call_id"] == ids.tool_call_id(env.run_id, 1, 0)
    assert [f["agent_id"] for f in snapshot.values["handoff_stack"]] == ["refunder"]
    assert env.refunds == []

    final = await drive(Command(resume={"decision": "approve"}))

    assert env.refunds == [7]
    assert final["outcome"]["status"] == "succeeded"
    assert final["result"]["answer"] == "refunder said refund succeeded"
    assert final["handoff_stack"] == []
    assert views[0].input == "refund the customer" and views[0].agent_id == "refunder"
    assert [s.decision.agent_id for s in await env.store.list_steps(env.run_id)] == [
        "boss",
        "refunder",
        "refunder",
        "boss",
    ]
    approval: Approval | None = await env.store.get_approval(intr.value["approval_id"])
    assert approval is not None and approval.status == "approved"


def test_what_a_caller_still_reads_of_a_result_kept_in_an_artifact() -> None:
    from nodes.handoff import HANDBACK_ANSWER_CHARS, HANDBACK_DATA_BYTES, readable

    shown = readable("a" * (HANDBACK_ANSWER_CHARS + 10), {"report_id": "r-1"})
    assert shown == {"answer": "a" * HANDBACK_ANSWER_CHARS, "data": {"report_id": "r-1"}}
    assert readable("ok", {"blob": "x" * HANDBACK_DATA_BYTES})["data"] is None
    assert readable(None, None) == {"answer": None, "data": None}
    looped: dict[str, Any] = {}
    looped["self"] = looped
    assert readable("ok", looped)["data"] is None  # no JSON form: not shown, not a crash
