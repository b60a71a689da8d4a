"""The approval node alone, with a FakeStore: it calls ``interrupt()``, which needs a
LangGraph runnable context, so it runs as the only node of a tiny graph with
``InMemorySaver``; the test checks where the graph stopped and resumes it with
``Command(resume=...)``, as LangGraph's own interrupt tests do."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from pydantic import BaseModel

from nodes.approval import make_approval_node
from runtime import ids
from runtime.context import Context
from runtime.model import Decision
from runtime.state import RunState
from runtime.tooling import REDACTED, ToolContext, ToolSpec
from tests.agents import call
from tests.unit.node_env import NodeEnv


class OneNode:
    """The approval node compiled alone; ``run`` drives it on the env's fake services."""

    def __init__(self, env: NodeEnv) -> None:
        builder = StateGraph(RunState, context_schema=Context)
        builder.add_node("approval", make_approval_node(env.tools))
        builder.add_edge(START, "approval")
        builder.add_edge("approval", END)
        self.graph = builder.compile(checkpointer=InMemorySaver())
        self.config: Any = {"configurable": {"thread_id": env.run_id}}
        self.context = Context(run_id=env.run_id, store=env.store)

    async def run(self, graph_input: Any) -> dict[str, Any]:
        return await self.graph.ainvoke(graph_input, self.config, context=self.context)  # type: ignore[no-any-return]

    async def asked(self) -> list[dict[str, Any]]:
        """The approval requests the graph is stopped on; [] when it is not stopped."""
        snapshot = await self.graph.aget_state(self.config)
        assert snapshot.next == (("approval",) if snapshot.interrupts else ())
        return [i.value for i in snapshot.interrupts]


async def guarded(env: NodeEnv, *decisions: Decision) -> dict[str, Any]:
    """A state after the guard: the decisions' calls, checked and numbered as one step."""
    proposed = [p for d in decisions for p in d.tool_calls]
    update = await env.guard(Decision(kind="tool_calls", tool_calls=proposed))
    return env.state(calls=update["calls"])


@pytest.mark.parametrize("answer", ["approve", "reject"])
async def test_approval_asks_a_human_and_the_resume_decides(env: NodeEnv, answer: str) -> None:
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5))

    await graph.run(state)

    [asked] = await graph.asked()
    tc_id = ids.tool_call_id(env.run_id, 0, 0)
    assert {k: asked[k] for k in ("approval_id", "tool_call_id", "tool", "args", "risk")} == {
        "approval_id": ids.approval_id(tc_id),
        "tool_call_id": tc_id,
        "tool": "refund",
        "args": {"amount": 5},
        "risk": "high",
    }
    row = await env.store.get_approval(asked["approval_id"])
    assert row is not None and row.status == "pending"
    assert await env.event_types() == ["state", "approval_request"]

    final = await graph.run(Command(resume={"decision": answer, "comment": "why not"}))

    assert await graph.asked() == []
    row = await env.store.get_approval(asked["approval_id"])
    assert row is not None and row.decided_by == "graph-resume" and row.comment == "why not"
    assert await env.event_types() == ["state", "approval_request", "approval_result"]
    if answer == "approve":
        assert row.status == "approved" and final.get("outcome") is None
    else:
        assert row.status == "rejected" and final["calls"] == []
        assert final["outcome"] == {
            "status": "failed",
            "code": "APPROVAL_REJECTED",
            "message": "refund@1 rejected by graph-resume: why not",
            "tool_call_id": row.tool_call_id,  # the run's error event names it
        }


async def test_a_decision_made_meanwhile_wins_over_the_resume_value(env: NodeEnv) -> None:
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5))
    await graph.run(state)
    await env.approve(state["calls"][0])  # through the API, while the graph waited

    final = await graph.run(Command(resume={"decision": "reject"}))

    row = await env.store.get_approval(ids.call_approval_id(state["calls"][0]))
    assert row is not None and (row.status, row.decided_by) == ("approved", "ann")
    assert final.get("outcome") is None
    assert (await env.event_types()).count("approval_result") == 1


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"decision": "maybe"}, "approve' or 'reject"),
        ("", "approve' or 'reject"),
        ({"comment": "forgot the decision"}, "approve' or 'reject"),
        ({"decision": "approve", "approval_id": "ap-another"}, "ap-another"),
        ({"decision": "approve", "comment": {"why": 1}}, "comment is text"),
    ],
)
async def test_a_resume_that_decides_nothing_clear_decides_nothing(
    env: NodeEnv, answer: Any, why: str
) -> None:
    """A resume straight into the graph (LangGraph Studio) with a value that is neither
    decision, or that names another approval, is asked again, saying why: it was taken
    for a rejection, which failed the run, or decided the call asked about instead of
    the one named."""
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5), call("refund", amount=6))
    await graph.run(state)
    [asked] = await graph.asked()

    await graph.run(Command(resume=answer))

    row = await env.store.get_approval(asked["approval_id"])
    assert row is not None and row.status == "pending"
    assert (await env.event_types()).count("approval_result") == 0
    [again] = await graph.asked()
    assert why in again.pop("refused")
    assert again == asked  # the same question, and a clear answer then decides it
    await graph.run(Command(resume={"decision": "approve", "approval_id": asked["approval_id"]}))
    [second] = await graph.asked()
    assert second["approval_id"] != asked["approval_id"]
    row = await env.store.get_approval(asked["approval_id"])
    assert row is not None and row.status == "approved"


@pytest.mark.parametrize("decided_meanwhile", [False, True])
async def test_a_refused_answer_keeps_later_answers_with_their_questions(
    env: NodeEnv, decided_meanwhile: bool
) -> None:
    """Answers are matched to interrupts by position on every replay: a refused answer
    is one more position, whether or not its approval has been decided since. (Asking
    again only while the row was pending made the replay skip a position, and the
    second call took the first's "approve" for the human's "reject".)"""
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5), call("refund", amount=6))
    await graph.run(state)
    [first] = await graph.asked()

    await graph.run(Command(resume="maybe"))
    [again] = await graph.asked()
    assert again["approval_id"] == first["approval_id"] and "refused" in again
    if decided_meanwhile:  # through the API, as the human answers in Studio too
        await env.approve(state["calls"][0])
    await graph.run(Command(resume="approve"))
    [second] = await graph.asked()
    assert second["approval_id"] != first["approval_id"]
    final = await graph.run(Command(resume="reject"))

    rows = {r.approval_id: r.status for r in await env.store.list_approvals(run_id=env.run_id)}
    assert rows == {first["approval_id"]: "approved", second["approval_id"]: "rejected"}
    assert final["outcome"]["code"] == "APPROVAL_REJECTED"


async def test_each_call_is_asked_in_turn_and_a_replay_asks_nothing_twice(env: NodeEnv) -> None:
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5), call("refund", amount=6))

    await graph.run(state)
    [first] = await graph.asked()
    await graph.run(Command(resume="approve"))  # the node replays from its start
    [second] = await graph.asked()
    final = await graph.run(Command(resume="yes"))

    assert (first["args"], second["args"]) == ({"amount": 5}, {"amount": 6})
    rows = await env.store.list_approvals(run_id=env.run_id)
    assert [r.status for r in rows] == ["approved", "approved"]
    assert (await env.event_types()).count("approval_request") == 2
    assert final.get("outcome") is None


async def test_a_failing_rejection_does_not_ask_about_the_rest(env: NodeEnv) -> None:
    graph = OneNode(env)
    await graph.run(await guarded(env, call("refund", amount=5), call("refund", amount=6)))

    final = await graph.run(Command(resume="no"))

    assert final["outcome"]["code"] == "APPROVAL_REJECTED" and await graph.asked() == []
    assert len(await env.store.list_approvals(run_id=env.run_id)) == 1


async def test_a_replanning_rejection_does_not_ask_about_the_rest(env: NodeEnv) -> None:
    """The planner decides again: the step's other calls will not run, so a human is
    not asked to approve one (it would be approved and never run)."""
    graph = OneNode(env)
    state = await guarded(env, call("refund_soft", amount=5), call("refund", amount=6))
    await graph.run(state)

    final = await graph.run(Command(resume={"decision": "reject", "comment": "soft"}))

    assert final.get("outcome") is None and final["calls"] == [] and await graph.asked() == []
    soft, hard = state["calls"]
    assert {o["tool_call_id"]: o["status"] for o in final["observations"]} == {
        soft["tool_call_id"]: "APPROVAL_REJECTED",
        hard["tool_call_id"]: "CALL_NOT_RUN",
    }
    assert len(await env.store.list_approvals(run_id=env.run_id)) == 1


async def test_an_approved_call_a_later_rejection_drops_is_on_the_record(env: NodeEnv) -> None:
    """Approved, then its step sent back to the planner by a sibling's rejection: it
    never runs, and the record and the planner say so (two probes found it silent)."""
    graph = OneNode(env)
    state = await guarded(
        env,
        call("refund_soft", amount=5),
        call("refund_soft", amount=6),
        call("echo", text="a", n=1),
    )
    await graph.run(state)
    await graph.run(Command(resume={"decision": "approve"}))

    final = await graph.run(Command(resume={"decision": "reject", "comment": "not 6"}))

    approved, rejected, plain = state["calls"]
    assert final.get("outcome") is None and final["calls"] == []
    assert {o["tool_call_id"]: o["status"] for o in final["observations"]} == {
        approved["tool_call_id"]: "CALL_NOT_RUN",
        rejected["tool_call_id"]: "APPROVAL_REJECTED",
        plain["tool_call_id"]: "CALL_NOT_RUN",
    }
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["tool_call_id"], e["recovery"]) for e in errors] == [
        ("CALL_NOT_RUN", approved["tool_call_id"], "replan"),
        ("CALL_NOT_RUN", plain["tool_call_id"], "replan"),
    ]
    assert rejected["tool_call_id"] in errors[0]["message"]
    # The node replays on resume: the record is not written twice.
    await graph.run(Command(resume={"decision": "reject"}))
    again = [e for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert len(again) == 2


async def test_the_run_ends_naming_the_rejection_that_ends_it(env: NodeEnv) -> None:
    graph = OneNode(env)
    state = await guarded(env, call("refund_soft", amount=5), call("refund", amount=6))
    await graph.run(state)
    await graph.run(Command(resume={"decision": "approve"}))

    final = await graph.run(Command(resume={"decision": "reject", "comment": "hard"}))

    assert final["outcome"]["tool_call_id"] == state["calls"][1]["tool_call_id"]
    assert (
        final["outcome"]["message"].startswith("refund@1 rejected")
        and "hard" in (final["outcome"]["message"])
    )


async def test_a_rejection_that_ends_the_run_puts_the_steps_other_calls_on_record(
    env: NodeEnv,
) -> None:
    """As one that sends the step back does (README: each gets a CALL_NOT_RUN error
    event), but nothing is to be replanned: the record was silent, a human's approval
    of one of them never run, and nothing said so."""
    graph = OneNode(env)
    state = await guarded(
        env, call("refund_soft", amount=5), call("refund", amount=6), call("echo", text="a", n=1)
    )
    await graph.run(state)
    await graph.run(Command(resume={"decision": "approve"}))

    final = await graph.run(Command(resume={"decision": "reject", "comment": "hard"}))

    approved, rejected, plain = state["calls"]
    assert final["outcome"]["tool_call_id"] == rejected["tool_call_id"]
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["tool_call_id"], e["recovery"]) for e in errors] == [
        ("CALL_NOT_RUN", approved["tool_call_id"], "none"),
        ("CALL_NOT_RUN", plain["tool_call_id"], "none"),
    ]
    assert all("ended the run" in e["message"] for e in errors), errors
    await graph.run(Command(resume={"decision": "reject"}))  # replayed: written once
    assert len([e for e in await env.store.list_events(env.run_id) if e.type == "error"]) == 2


async def test_a_replannable_rejection_goes_back_to_the_planner(env: NodeEnv) -> None:
    graph = OneNode(env)
    state = await guarded(env, call("refund_soft", amount=5))
    await graph.run({**state, "memory_version": 4})

    final = await graph.run(Command(resume={"decision": "rejected", "comment": "too much"}))

    assert final.get("outcome") is None and final["calls"] == [] and final["memory_version"] == 5
    [obs] = final["observations"]
    assert (obs["status"], obs["error"]) == ("APPROVAL_REJECTED", "too much")
    assert obs["tool_call_id"] == state["calls"][0]["tool_call_id"]


async def test_an_unknown_outcome_ruled_done_goes_back_to_the_planner(env: NodeEnv) -> None:
    """refund fails the run on a plain rejection; "do not run it again" is a replan."""
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5))
    [c] = state["calls"]
    ask = {**c, "kind": "outcome_unknown", "approval_key": f"{c['tool_call_id']}:outcome:1"}
    await graph.run({**state, "calls": [ask]})
    [asked] = await graph.asked()
    assert asked["kind"] == "outcome_unknown"
    assert asked["approval_id"] == ids.approval_id(ask["approval_key"])

    final = await graph.run(Command(resume="reject"))

    assert final.get("outcome") is None
    assert final["observations"][0]["status"] == "TOOL_OUTCOME_UNKNOWN"
    assert final["tool_calls"] == [c["tool_call_id"]]  # it ran once: the checkpoint says so


async def test_unknown_outcomes_are_decided_each_alone(env: NodeEnv) -> None:
    """ "Run A again", then "not B": A runs again (it was dropped with the step, its row
    left unknown for good, though a human had approved it), B goes to the planner."""
    graph = OneNode(env)
    state = await guarded(env, call("refund", amount=5), call("refund", amount=6))
    asks = [
        {**c, "kind": "outcome_unknown", "approval_key": f"{c['tool_call_id']}:outcome:1"}
        for c in state["calls"]
    ]
    await graph.run({**state, "calls": asks})
    await graph.run(Command(resume="approve"))

    final = await graph.run(Command(resume="reject"))

    again, done = asks
    assert final.get("outcome") is None and final["calls"] == [again]
    assert [(o["tool_call_id"], o["status"]) for o in final["observations"]] == [
        (done["tool_call_id"], "TOOL_OUTCOME_UNKNOWN")
    ]
    assert final["tool_calls"] == [done["tool_call_id"]]  # A's once it has run again
    assert not [e for e in await env.store.list_events(env.run_id) if e.type == "error"]


async def test_calls_that_need_no_approval_pass_without_a_stop(env: NodeEnv) -> None:
    graph = OneNode(env)

    final = await graph.run(await guarded(env, call("echo", text="a", n=1)))

    assert await graph.asked() == [] and final.get("outcome") is None
    assert await env.store.list_approvals(run_id=env.run_id) == []


class CardArgs(BaseModel):
    card: str
    amount: int


async def test_the_approver_never_sees_a_secret_argument(env: NodeEnv) -> None:
    async def charge(args: CardArgs, ctx: ToolContext) -> dict[str, int]:
        return {"charged": args.amount}

    env.tools.register(
        ToolSpec(
            "charge", "1", "Charge.", CardArgs, charge, risk="high", secret_args=frozenset({"card"})
        )
    )
    graph = OneNode(env)
    state = await guarded(env, call("charge", card="4111-1111", amount=3))

    await graph.run(state)

    [asked] = await graph.asked()
    assert asked["args"] == {"card": REDACTED, "amount": 3}
    row = await env.store.get_approval(asked["approval_id"])
    assert row is not None and row.args == asked["args"]
    assert row.args_hash == state["calls"][0]["args_hash"]  # bound to the real card number
    assert "4111" not in str([e.data for e in await env.store.list_events(env.run_id)])
