"""Agents only the scale-out tests need; a process loads them next to tests.agents
when its AGENT_RUNTIME_EXTRA_AGENTS is :data:`EXTRA_AGENTS`."""

from __future__ import annotations

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.model import Decision
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from server.settings import Settings
from tests.agents import ScriptPlanner, build_tools, call, finish

EXTRA_AGENTS = '["tests.agents:build_agents", "tests.integration.more_agents:build_agents"]'


def sleep_then_count(view: PlannerView) -> Decision:
    """A sleep (idempotent), then counter (a non-idempotent side effect), then finish."""
    seconds = float(view.input.split()[-1]) if view.input.split()[-1][0].isdigit() else 0.1
    done = {o.tool for o in view.observations if o.status == "succeeded"}
    if "sleep" not in done:
        return call("sleep", seconds=seconds)
    if "counter" not in done:
        return call("counter", label="after-sleep")
    return finish("counted")


def build_agents(settings: Settings) -> list[AgentSpec]:
    tools = build_tools(settings.data_dir)
    return [
        AgentSpec(
            agent_id="sleep_then_count",
            description=sleep_then_count.__doc__ or "sleep_then_count",
            builder=build_run_graph(ScriptPlanner(sleep_then_count), tools, DefaultPolicy()),
            tools=tools,
        )
    ]
