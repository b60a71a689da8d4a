"""The planner node alone: a hand-made state, a scripted planner, a FakeStore."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.runtime import Runtime

from nodes.planner import make_planner_node
from runtime import ids
from runtime.context import Context
from runtime.model import Decision, DecisionUsage, Handoff, Usage
from runtime.planner import PlannerView
from tests.agents import call, finish
from tests.unit.fakes import node_runtime
from tests.unit.node_env import NodeEnv, limits


class CountingPlanner:
    """Answers with ``decisions`` in turn (raising those that are exceptions); keeps its views."""

    def __init__(self, *decisions: Decision | Exception) -> None:
        self.decisions = list(decisions)
        self.views: list[PlannerView] = []

    async def next_step(self, view: PlannerView) -> Decision:
        self.views.append(view)
        out = self.decisions[len(self.views) - 1]
        if isinstance(out, Exception):
            raise out
        return out


async def test_planner_records_a_step_and_returns_its_decision(env: NodeEnv) -> None:
    decision = call("echo", text="a", n=1)
    planner = CountingPlanner(decision)

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    assert update["step_index"] == 0 and update["usage"]["steps"] == 1 and update["calls"] == []
    assert Decision.model_validate(update["decision"]) == decision
    step = await env.store.get_step(env.run_id, 0)
    assert step is not None and step.decision == decision
    assert {t["name"] for t in planner.views[0].tools} >= {"echo", "refund"}
    assert planner.views[0].input == "help" and planner.views[0].step_index == 0


async def test_the_planner_is_told_how_many_llm_calls_the_budget_leaves(env: NodeEnv) -> None:
    planner = CountingPlanner(finish("done"))
    state = env.state(
        usage=Usage(llm_calls=7).model_dump(), limits=limits(budget={"max_llm_calls": 9})
    )

    await make_planner_node(planner, env.tools)(state, env.runtime)

    assert planner.views[0].llm_calls_left == 2


async def test_a_failed_step_still_counts_the_llm_calls_it_made(env: NodeEnv) -> None:
    error = TimeoutError("model timed out")
    error.llm_calls = 3  # type: ignore[attr-defined]  # as ChatModelPlanner says it
    state = env.state(usage=Usage(llm_calls=2).model_dump())

    update = await make_planner_node(CountingPlanner(error), env.tools)(state, env.runtime)

    assert update["outcome"]["code"] == "PLANNER_ERROR"
    assert update["usage"]["llm_calls"] == 5


async def test_planner_replays_the_recorded_decision(env: NodeEnv) -> None:
    planner = CountingPlanner(call("echo", text="a", n=1), finish("different"))
    node = make_planner_node(planner, env.tools)

    first = await node(env.state(), env.runtime)
    again = await node(env.state(), env.runtime)  # LangGraph re-runs it after a crash

    assert len(planner.views) == 1
    assert again["decision"] == first["decision"]
    assert len(await env.store.list_steps(env.run_id)) == 1


async def test_planner_trusts_recorded_before_and_the_store_keeps_the_first_step(
    env: NodeEnv,
) -> None:
    """recorded_before=0: the drive began with no steps, so the planner is asked without a
    read; had a step been recorded meanwhile, record_step would still hand back the first."""
    await make_planner_node(CountingPlanner(finish("first")), env.tools)(env.state(), env.runtime)
    planner = CountingPlanner(finish("second"))
    runtime: Runtime[Context] = node_runtime(env.store, env.run_id, recorded_before=0)

    update = await make_planner_node(planner, env.tools)(env.state(), runtime)

    assert len(planner.views) == 1 and update["decision"]["answer"] == "first"


async def test_planner_stamps_the_agent_and_counts_model_usage(env: NodeEnv) -> None:
    spent = DecisionUsage(llm_calls=1, tokens=120, cost_usd=0.25)
    planner = CountingPlanner(finish("x").model_copy(update={"agent_id": "liar", "usage": spent}))
    state = env.state(usage=Usage(steps=2, llm_calls=3, tokens=10).model_dump())

    update = await make_planner_node(planner, env.tools, agent_id="boss")(state, env.runtime)

    assert update["step_index"] == 2 and update["decision"]["agent_id"] == "boss"
    assert (update["usage"]["llm_calls"], update["usage"]["tokens"]) == (4, 130)
    assert update["usage"]["cost_usd"] == 0.25
    step = await env.store.get_step(env.run_id, 2)
    assert step is not None and step.decision.agent_id == "boss"


async def test_planner_turns_an_empty_tool_step_into_a_finish(env: NodeEnv) -> None:
    planner = CountingPlanner(Decision(kind="tool_calls", summary="nothing to do"))

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    assert update["decision"]["kind"] == "finish"


async def test_an_empty_tool_step_turned_finish_keeps_what_it_spent_and_said(
    env: NodeEnv,
) -> None:
    """Only its kind changes: its model call was charged nothing (and could go past the
    token budget unnoticed), its answer and data were lost."""
    spent = DecisionUsage(llm_calls=1, tokens=600)
    empty = Decision(kind="tool_calls", answer="SKU-1", data={"n": 1}, usage=spent)
    state = env.state(usage=Usage(llm_calls=1, tokens=100).model_dump())

    update = await make_planner_node(CountingPlanner(empty), env.tools)(state, env.runtime)

    decision = Decision.model_validate(update["decision"])
    assert (decision.kind, decision.answer, decision.data) == ("finish", "SKU-1", {"n": 1})
    assert (update["usage"]["llm_calls"], update["usage"]["tokens"]) == (2, 700)
    tight = env.state(limits=limits(budget={"max_tokens": 500}))
    over = await make_planner_node(CountingPlanner(empty), env.tools)(tight, env.runtime)
    assert over["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"


@pytest.mark.parametrize(
    ("decision", "instead"),
    [
        (finish("paid"), "was to finish"),
        (
            Decision(kind="handoff", handoff=Handoff(agent_id="helper", task="t")),
            "was to hand off",
        ),
    ],
)
async def test_calls_beside_a_finish_or_a_handoff_are_said_not_to_run(
    env: NodeEnv, decision: Decision, instead: str
) -> None:
    """Nothing proposed disappears unexplained: the step keeps the calls, the finish or
    the handoff goes ahead, and each call gets its CALL_NOT_RUN, once on a replay."""
    proposals = [*call("refund", amount=5).tool_calls, *call("echo", text="a", n=1).tool_calls]
    both = decision.model_copy(update={"tool_calls": proposals})
    node = make_planner_node(CountingPlanner(both, both), env.tools)

    update = await node(env.state(), env.runtime)
    await node(env.state(), env.runtime)  # replayed after a crash

    assert "outcome" not in update and update["decision"]["kind"] == decision.kind
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["call_index"], e["recovery"]) for e in errors] == [
        ("CALL_NOT_RUN", 0, "none"),
        ("CALL_NOT_RUN", 1, "none"),
    ]
    assert errors[0]["message"] == f"not run: the step's decision {instead}"
    assert errors[0]["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0)
    observed = [(o["tool"], o["status"]) for o in update["observations"]]
    assert observed == [("refund", "CALL_NOT_RUN"), ("echo", "CALL_NOT_RUN")]


async def test_planner_stops_at_max_steps(env: NodeEnv) -> None:
    planner = CountingPlanner(finish("never"))
    state = env.state(usage=Usage(steps=2).model_dump(), limits=limits(max_steps=2))

    update = await make_planner_node(planner, env.tools)(state, env.runtime)

    assert update["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert planner.views == [] and await env.store.get_step(env.run_id, 2) is None


@pytest.mark.parametrize(
    ("spent", "budget", "why"),
    [
        (DecisionUsage(llm_calls=1, tokens=600), {"max_tokens": 1500}, "max_tokens 1500: 1600"),
        (
            DecisionUsage(llm_calls=1, cost_usd=0.1),
            {"max_cost_usd": 0.15},
            "max_cost_usd 0.15: 0.2",
        ),
        (DecisionUsage(llm_calls=2), {"max_llm_calls": 2}, "max_llm_calls 2: 3"),
    ],
)
@pytest.mark.parametrize("decision", [call("echo", text="a", n=1), finish("done")])
async def test_a_decision_that_spent_past_a_limit_is_recorded_not_acted_on(
    env: NodeEnv, spent: DecisionUsage, budget: dict[str, Any], why: str, decision: Decision
) -> None:
    """A model's tokens and cost are known only after its call: the step that went over
    is kept, and the run ends rather than running its calls or taking its answer."""
    planner = CountingPlanner(decision.model_copy(update={"usage": spent}))
    used = Usage(steps=1, llm_calls=1, tokens=1000, cost_usd=0.1)
    state = env.state(usage=used.model_dump(), limits=limits(budget=budget))

    update = await make_planner_node(planner, env.tools)(state, env.runtime)

    assert update["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert update["outcome"]["message"].startswith(why)
    step = await env.store.get_step(env.run_id, 1)
    assert step is not None and step.decision.kind == decision.kind
    errors = [e.data for e in await env.store.list_events(env.run_id) if e.type == "error"]
    assert [(e["code"], e["recovery"]) for e in errors] == [("CALL_NOT_RUN", "none")] * len(
        decision.tool_calls
    )


async def test_a_decision_that_uses_the_budget_up_exactly_goes_ahead(env: NodeEnv) -> None:
    spent = DecisionUsage(llm_calls=1, tokens=500, cost_usd=0.05)
    planner = CountingPlanner(finish("done").model_copy(update={"usage": spent}))
    state = env.state(
        usage=Usage(steps=1, llm_calls=1, tokens=1000, cost_usd=0.1).model_dump(),
        limits=limits(budget={"max_tokens": 1500, "max_cost_usd": 0.15, "max_llm_calls": 2}),
    )

    update = await make_planner_node(planner, env.tools)(state, env.runtime)

    assert "outcome" not in update and update["decision"]["kind"] == "finish"


async def test_planner_exception_is_a_planner_error(env: NodeEnv) -> None:
    planner = CountingPlanner(ValueError("model down"))

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    assert update["outcome"]["code"] == "PLANNER_ERROR"
    assert "model down" in update["outcome"]["message"]
    # The run's end writes the one error event (the adapter's fail_run), not the node.
    assert [e for e in await env.store.list_events(env.run_id) if e.type == "error"] == []
    assert await env.store.get_step(env.run_id, 0) is None


async def test_a_decision_is_recorded_as_the_stores_can_keep_it(env: NodeEnv) -> None:
    """A lone surrogate (a model's broken token) would fail the step's write in either
    store, 2**64 the checkpoint, after the model had been paid for; a run of hours
    should not end on half an emoji."""
    planner = CountingPlanner(
        call("echo", text="hi \ud83d\x00", n=2**64), finish("half an emoji \ud83d")
    )
    node = make_planner_node(planner, env.tools)

    update = await node(env.state(), env.runtime)
    [proposed] = Decision.model_validate(update["decision"]).tool_calls
    assert proposed.args == {"text": "hi \ufffd\x00", "n": str(2**64)}  # the guard judges these
    step = await env.store.get_step(env.run_id, 0)
    assert step is not None and step.decision.tool_calls[0].args == proposed.args

    update = await node(env.state(usage=Usage(steps=1).model_dump()), env.runtime)
    assert "outcome" not in update
    assert Decision.model_validate(update["decision"]).answer == "half an emoji \ufffd"


@pytest.mark.parametrize("depth", [100, 300, 5000])
async def test_a_decision_nested_too_deep_to_keep_is_a_planner_error(
    env: NodeEnv, depth: int
) -> None:
    """From about 300 levels the step could not be recorded (pydantic's serialiser), or
    checkpointed (msgpack, 255): the run failed INTERNAL_ERROR, not the planner's error."""
    deep: Any = "leaf"
    for _ in range(depth):
        deep = [deep]
    paid = DecisionUsage(llm_calls=1, tokens=500, cost_usd=0.01)
    planner = CountingPlanner(call("echo", text="a", deep=deep).model_copy(update={"usage": paid}))

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    # The reply was paid for, kept or not.
    assert (update["usage"]["llm_calls"], update["usage"]["tokens"]) == (1, 500)

    assert update["outcome"]["code"] == "PLANNER_ERROR"
    assert "nests deeper than 64 levels" in update["outcome"]["message"]
    assert await env.store.get_step(env.run_id, 0) is None


async def test_a_graph_invoked_without_an_input_is_told_so(env: NodeEnv) -> None:
    """Studio invokes the graph with whatever its form holds: no ``input`` was a bare
    KeyError 'input'. Nothing is planned or recorded."""
    planner = CountingPlanner(finish("done"))
    state = {k: v for k, v in env.state().items() if k != "input"}

    with pytest.raises(ValueError, match="no 'input'"):
        await make_planner_node(planner, env.tools)(state, env.runtime)

    assert planner.views == [] and await env.store.get_step(env.run_id, 0) is None


@pytest.mark.parametrize(
    ("tokens", "cost"), [(-1_000_000, -5.0), (2**64, float("inf")), (10, float("nan"))]
)
async def test_a_planner_s_account_of_its_usage_is_counted_within_bounds(
    env: NodeEnv, tokens: int, cost: float
) -> None:
    """A negative report gave the budget back; 2**64 tokens failed the run's write
    (INTERNAL_ERROR); past every budget, it is a budget stop."""
    spent = DecisionUsage(llm_calls=1, tokens=tokens, cost_usd=cost)
    planner = CountingPlanner(finish("done").model_copy(update={"usage": spent}))

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    usage = update["usage"]
    assert 0 <= usage["tokens"] <= 10**12 and 0 <= usage["cost_usd"] < float("inf")
    if tokens > 10**9:  # past every budget's bound
        assert update["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    else:
        assert "outcome" not in update and usage["tokens"] == max(tokens, 0)
        assert usage["cost_usd"] == 0.0
    step = await env.store.get_step(env.run_id, 0)
    assert step is not None and step.decision.usage.tokens == usage["tokens"]


async def test_a_planner_answering_no_decision_is_a_planner_error(env: NodeEnv) -> None:
    """A custom planner's bug: it fails the run PLANNER_ERROR, not the node."""

    class DictPlanner:
        async def next_step(self, view: PlannerView) -> Any:
            return {"kind": "finish", "answer": "done"}

    update = await make_planner_node(DictPlanner(), env.tools)(env.state(), env.runtime)

    assert update["outcome"]["code"] == "PLANNER_ERROR"
