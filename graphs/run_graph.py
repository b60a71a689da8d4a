"""The run graph: planner → guard → (approval) → executor → planner … → finish.

A ``handoff`` decision goes planner → handoff → planner, now the sub-agent's; a
sub-agent's ``finish`` goes planner → handback → planner, the caller's again
(:mod:`nodes.handoff`). ``build_run_graph`` returns an uncompiled builder: the
engine compiles it with its checkpointer, tests with theirs, and ``langgraph dev``
with none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal
from weakref import WeakKeyDictionary

from langgraph._internal._runnable import RunnableCallable
from langgraph.graph import START, StateGraph

from nodes.approval import make_approval_node
from nodes.executor import make_executor_node
from nodes.finish import make_finish_node
from nodes.guard import make_guard_node
from nodes.handoff import ROOT, dispatch, make_handback_node, make_handoff_node
from nodes.planner import make_planner_node
from runtime.agent import AgentSpec, SubAgent
from runtime.context import Context
from runtime.planner import Planner
from runtime.policy import Policy
from runtime.state import InputState, RunState
from runtime.tooling import ChainedTools, ToolResolver

RunGraphBuilder = StateGraph[RunState, Context, InputState, RunState]


def route_after_planner(
    state: RunState,
) -> Literal["guard", "finish", "handoff", "handback", "__end__"]:
    if state.get("outcome"):
        return "__end__"
    kind = (state.get("decision") or {}).get("kind")
    if kind == "finish":
        return "handback" if state.get("handoff_stack") else "finish"
    return "handoff" if kind == "handoff" else "guard"


def route_after_guard(state: RunState) -> Literal["approval", "executor", "planner", "__end__"]:
    if state.get("outcome"):
        return "__end__"
    calls = state.get("calls") or []
    if not calls:
        return "planner"
    return "approval" if any(c["needs_approval"] for c in calls) else "executor"


def route_after_approval(state: RunState) -> Literal["executor", "planner", "__end__"]:
    if state.get("outcome"):
        return "__end__"
    return "executor" if state.get("calls") else "planner"


def route_after_executor(state: RunState) -> Literal["planner", "approval", "__end__"]:
    if state.get("outcome"):
        return "__end__"
    # Calls left after execution wait on a human (an outcome the ledger cannot know).
    return "approval" if state.get("calls") else "planner"


def route_after_finish(state: RunState) -> Literal["planner", "__end__"]:
    return "__end__" if state.get("outcome") else "planner"


def route_after_handoff(state: RunState) -> Literal["planner", "__end__"]:
    return "__end__" if state.get("outcome") else "planner"


def inline(router: Callable[[RunState], str]) -> RunnableCallable:
    """``router`` as LangGraph's own branches run: in the loop's thread, untraced.

    Given a plain function, ``add_conditional_edges`` runs it on the thread pool under a
    callback run of its own: a thread hop and a tracing round for a dict lookup, at every
    superstep of every run. The router stays a plain function (its ``Literal`` still
    names the edges); only how LangGraph calls it changes.
    """

    async def arouter(state: RunState) -> str:
        return router(state)

    return RunnableCallable(router, arouter, name=router.__name__, trace=False)


_HOSTED: WeakKeyDictionary[RunGraphBuilder, dict[str, SubAgent]] = WeakKeyDictionary()
"""What each builder of :func:`build_run_graph` hosts, for :func:`handoff_map`."""


def handoff_map(builder: object, own_id: str) -> dict[str, list[str]]:
    """For a builder of :func:`build_run_graph` registered as agent ``own_id``: each
    agent it hosts, by id (its own first, named ``own_id`` where the builder was given
    no id), and the agents that one may hand off to ({own_id: []} for another builder)."""
    hosted = _HOSTED.get(builder) if isinstance(builder, StateGraph) else None
    if not hosted:
        return {own_id: []}
    return {
        (agent_id or own_id): sorted(t.agent_id for t in agent.handoffs)
        for agent_id, agent in hosted.items()
    }


def with_hosted_tools(spec: AgentSpec) -> AgentSpec:
    """``spec``, its tools also resolving those of the agents its graph hosts.

    A run's cancel, time-out or crash loop settles and compensates the calls of its
    ledger through the agent's tools (``AgentSpec.tools``), its sub-agents' calls too:
    a spec registered with its own tools only left a sub-agent's side effects
    uncompensated, without a word. A name and version two of them define differently
    resolves to neither (:class:`runtime.tooling.ChainedTools`)."""
    hosted = _HOSTED.get(spec.builder) if isinstance(spec.builder, StateGraph) else None
    extra = [a.tools for a in (hosted or {}).values() if a.tools is not spec.tools]
    if not extra:
        return spec
    return replace(spec, tools=ChainedTools(spec.tools, *extra))


def hosted_agents(root: SubAgent) -> dict[str, SubAgent]:
    """Every agent reachable by handoff from ``root``, by id (root included)."""
    found: dict[str, SubAgent] = {}
    pending = [root]
    while pending:
        agent = pending.pop()
        known = found.get(agent.agent_id)
        if known is agent:
            continue  # agents may hand off to each other: visit each once
        if known is not None:
            raise ValueError(f"two different agents are called {agent.agent_id!r}")
        found[agent.agent_id] = agent
        pending.extend(agent.handoffs)
    return found


def build_run_graph(
    planner: Planner,
    tools: ToolResolver,
    policy: Policy,
    *,
    agent_id: str | None = None,
    handoffs: Sequence[SubAgent] = (),
) -> RunGraphBuilder:
    """``handoffs``: the sub-agents ``planner`` may hand the run to (and theirs, in turn)."""
    root = agent_id or ROOT
    agents = hosted_agents(SubAgent(root, "", planner, tools, policy, handoffs=tuple(handoffs)))
    builder: RunGraphBuilder = StateGraph(RunState, context_schema=Context, input_schema=InputState)
    builder.add_node(
        "planner",
        dispatch(
            {
                a.agent_id: make_planner_node(
                    a.planner,
                    a.tools,
                    agent_id=a.agent_id or None,
                    agents=[t.describe() for t in a.handoffs],
                )
                for a in agents.values()
            },
            root,
        ),
    )
    builder.add_node(
        "guard",
        dispatch({a.agent_id: make_guard_node(a.tools, a.policy) for a in agents.values()}, root),
    )
    builder.add_node(
        "approval",
        dispatch({a.agent_id: make_approval_node(a.tools) for a in agents.values()}, root),
    )
    builder.add_node(
        "executor",
        dispatch({a.agent_id: make_executor_node(a.tools) for a in agents.values()}, root),
    )
    builder.add_node("finish", make_finish_node())
    targets = {a.agent_id: {t.agent_id for t in a.handoffs} for a in agents.values()}
    builder.add_node("handoff", make_handoff_node(targets, root))
    builder.add_node("handback", make_handback_node())
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", inline(route_after_planner))
    builder.add_conditional_edges("guard", inline(route_after_guard))
    builder.add_conditional_edges("approval", inline(route_after_approval))
    builder.add_conditional_edges("executor", inline(route_after_executor))
    builder.add_conditional_edges("finish", inline(route_after_finish))
    builder.add_conditional_edges("handoff", inline(route_after_handoff))
    builder.add_edge("handback", "planner")
    _HOSTED[builder] = agents
    return builder
