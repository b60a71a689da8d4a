"""The demo agent ``report_writer``: writes a sales report and publishes it after approval.

The retail analyst hands its reports to it (:func:`subagent`); it also runs on
its own (:func:`build_agent`), with a JSON brief as the run's input.
"""

from __future__ import annotations

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec, SubAgent
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolResolver
from tools.registry import ToolRegistry
from tools.retail import writer
from tools.retail.writer import ReportWriterPlanner

AGENT_ID = writer.AGENT_ID

TOOLS = ("write_report", "publish_report")
DESCRIPTION = (
    "Writes a Markdown sales report from query_sales findings and publishes it by email "
    "after approval. Brief: {title, question, findings, recipients, publish}."
)


def writer_tools(retail: ToolResolver) -> ToolRegistry:
    """Its own tools: the report ones of the retail registry, the very same specs."""
    return ToolRegistry(s for s in retail.specs() if s.name in TOOLS)


def subagent(retail: ToolResolver) -> SubAgent:
    return SubAgent(
        agent_id=AGENT_ID,
        description=DESCRIPTION,
        planner=ReportWriterPlanner(),
        tools=writer_tools(retail),
        policy=DefaultPolicy(),
    )


def build_agent(retail: ToolResolver) -> AgentSpec:
    sub = subagent(retail)
    return AgentSpec(
        agent_id=AGENT_ID,
        description=DESCRIPTION,
        builder=build_run_graph(sub.planner, sub.tools, sub.policy, agent_id=AGENT_ID),
        tools=sub.tools,
        metadata={"planner": type(sub.planner).__name__},
    )
