"""The demo agent ``retail_analyst``: which SKUs drove last week's sales drop in a region.

The runtime compiles ``build_agent(...).builder`` with its checkpointer;
:mod:`graphs.studio` compiles the same builder without one for ``langgraph dev``.
"""

from __future__ import annotations

from pathlib import Path

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.policy import DefaultPolicy
from tools.retail import RetailPlanner, build_registry, generate

AGENT_ID = "retail_analyst"


def build_agent(demo_db: Path) -> AgentSpec:
    generate(demo_db)
    tools = build_registry(demo_db)
    return AgentSpec(
        agent_id=AGENT_ID,
        description="Finds the SKUs behind a region's week-over-week sales drop, writes a "
        "report and publishes it after approval.",
        builder=build_run_graph(RetailPlanner(), tools, DefaultPolicy()),
        tools=tools,
    )
