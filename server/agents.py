"""Which agents a server hosts: the demo agent plus any configured ``module:function``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from runtime.agent import AgentSpec
from server.settings import Settings


def load_agents(settings: Settings) -> dict[str, AgentSpec]:
    from graphs import report_writer
    from graphs.retail_analyst import build_agent

    agents: dict[str, AgentSpec] = {}
    demo = build_agent(settings.resolved_demo_db, planner_model=settings.planner_model)
    agents[demo.agent_id] = demo
    # The agent the demo hands its reports to, runnable on its own too.
    writer = report_writer.build_agent(demo.tools)
    agents[writer.agent_id] = writer
    for path in settings.extra_agents:
        module_name, _, attr = path.partition(":")
        try:
            factory: Callable[[Settings], Iterable[AgentSpec]] = getattr(
                importlib.import_module(module_name), attr or "build_agents"
            )
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"AGENT_RUNTIME_EXTRA_AGENTS: cannot load {path!r}: {exc}") from exc
        for spec in factory(settings):
            agents[spec.agent_id] = spec
    return agents
