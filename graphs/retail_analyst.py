"""The demo agent ``retail_analyst``: which SKUs drove last week's sales drop in a region.

Its deterministic planner hands the report to ``report_writer`` (a sub-agent
with its own tools, :mod:`graphs.report_writer`) and answers from what comes
back. The runtime compiles ``build_agent(...).builder`` with its checkpointer;
:mod:`graphs.studio` compiles the same builder without one for ``langgraph dev``.
The planner is the deterministic :class:`RetailPlanner` unless another is given,
or ``planner_model`` names a chat model (``AGENT_RUNTIME_PLANNER_MODEL``, e.g.
``openai:gpt-4o-mini``; needs the ``llm`` extra).
"""

from __future__ import annotations

from pathlib import Path

from graphs import report_writer
from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.planner import Planner
from runtime.policy import DefaultPolicy
from tools.retail import RetailPlanner, build_registry, generate

AGENT_ID = "retail_analyst"

RETAIL_PROMPT = (
    "You answer which SKUs drove a region's week-over-week sales decline. Query the "
    "sales with query_sales, write a Markdown report of the findings with write_report "
    "(its findings argument is the query_sales output), then publish it with "
    "publish_report to the run context's notify addresses, or sales-ops@example.com, "
    "unless the user asked not to publish. Answer in the language of the question, "
    "naming the main declining SKUs and their change."
)


def make_planner(planner_model: str | None = None, usd_per_million_tokens: float = 0.0) -> Planner:
    """The deterministic planner, or a chat-model planner when a model is named (its
    tokens priced at ``usd_per_million_tokens``)."""
    if not planner_model:
        return RetailPlanner(report_agent=report_writer.AGENT_ID)
    from graphs.chat_planner import DEFAULT_SYSTEM_PROMPT, init_chat_planner

    return init_chat_planner(
        planner_model,
        system_prompt=f"{DEFAULT_SYSTEM_PROMPT}\n\n{RETAIL_PROMPT}",
        cost_per_token=usd_per_million_tokens / 1_000_000,
    )


def build_agent(
    demo_db: Path,
    planner: Planner | None = None,
    *,
    planner_model: str | None = None,
    usd_per_million_tokens: float = 0.0,
) -> AgentSpec:
    generate(demo_db)
    # Its own tools include the report ones, so a chat-model planner (which does not
    # hand off) can still write and publish; they are report_writer's very specs.
    tools = build_registry(demo_db)
    chosen = planner if planner is not None else make_planner(planner_model, usd_per_million_tokens)
    return AgentSpec(
        agent_id=AGENT_ID,
        description="Finds the SKUs behind a region's week-over-week sales drop, has "
        "report_writer write the report and publish it after approval.",
        builder=build_run_graph(
            chosen,
            tools,
            DefaultPolicy(),
            agent_id=AGENT_ID,
            handoffs=[report_writer.subagent(tools)],
        ),
        tools=tools,
        metadata={"planner": type(chosen).__name__}
        | ({"planner_model": planner_model} if planner is None and planner_model else {}),
    )
