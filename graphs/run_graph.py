"""The run graph: planner → guard → (approval) → executor → planner … → finish.

``build_run_graph`` returns an uncompiled builder: the engine compiles it with
its checkpointer, tests with theirs, and ``langgraph dev`` with none.
"""

from __future__ import annotations

from typing import Literal

from langgraph.graph import START, StateGraph

from nodes.approval import make_approval_node
from nodes.executor import make_executor_node
from nodes.finish import make_finish_node
from nodes.guard import make_guard_node
from nodes.planner import make_planner_node
from runtime.context import Context
from runtime.planner import Planner
from runtime.policy import Policy
from runtime.state import InputState, RunState
from runtime.tooling import ToolResolver

RunGraphBuilder = StateGraph[RunState, Context, InputState, RunState]


def route_after_planner(state: RunState) -> Literal["guard", "finish", "__end__"]:
    if state.get("outcome"):
        return "__end__"
    decision = state.get("decision") or {}
    return "finish" if decision.get("kind") == "finish" else "guard"


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


def build_run_graph(planner: Planner, tools: ToolResolver, policy: Policy) -> RunGraphBuilder:
    builder: RunGraphBuilder = StateGraph(RunState, context_schema=Context, input_schema=InputState)
    builder.add_node("planner", make_planner_node(planner, tools))
    builder.add_node("guard", make_guard_node(tools, policy))
    builder.add_node("approval", make_approval_node(tools))
    builder.add_node("executor", make_executor_node(tools))
    builder.add_node("finish", make_finish_node())
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", route_after_planner)
    builder.add_conditional_edges("guard", route_after_guard)
    builder.add_conditional_edges("approval", route_after_approval)
    builder.add_conditional_edges("executor", route_after_executor)
    builder.add_conditional_edges("finish", route_after_finish)
    return builder
