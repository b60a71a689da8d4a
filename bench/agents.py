"""Agents for the benchmarks' server and worker processes.

Loaded with ``AGENT_RUNTIME_EXTRA_AGENTS='["bench.agents:build_agents"]'`` (the
process needs the repository on ``PYTHONPATH``). Same graph builder and policy as
the demo; only the planners are scripted, so no model is called.

* ``bench_park``: asks for one high-risk tool (``publish``), so the run parks in
  ``waiting_human`` after a single planning step; approved, it runs it and finishes.
* ``bench_sleep``: one idempotent ``sleep`` of ``float(input)`` seconds, then finishes.
  Each start of the handler appends ``<pid> <run_id> <time.time()>`` to
  ``<data_dir>/sleep-starts.log``: which process (re)started the run's work, and when.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.model import Decision, ProposedCall
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolContext, ToolSpec
from server.settings import Settings
from tools.registry import ToolRegistry

PARK_AGENT = "bench_park"
SLEEP_AGENT = "bench_sleep"
EXTRA_AGENTS = '["bench.agents:build_agents"]'
SLEEP_STARTS = "sleep-starts.log"


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SleepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(ge=0, le=3600)


class Planner:
    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def next_step(self, view: PlannerView) -> Decision:
        if view.observations:
            return Decision(kind="finish", summary="done", answer="done")
        if self.agent == PARK_AGENT:
            call = ProposedCall(tool="publish")
        else:
            call = ProposedCall(tool="sleep", args={"seconds": float(view.input)})
        return Decision(kind="tool_calls", summary=call.tool, tool_calls=[call])


def build_tools(data_dir: Path) -> ToolRegistry:
    async def publish(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        return {"published": True}

    async def sleep(args: SleepArgs, ctx: ToolContext) -> dict[str, object]:
        with (data_dir / SLEEP_STARTS).open("a") as fh:
            fh.write(f"{os.getpid()} {ctx.run_id} {time.time():.6f}\n")
        await asyncio.sleep(args.seconds)
        return {"slept": args.seconds}

    return ToolRegistry(
        [
            ToolSpec(
                "publish",
                "1",
                "A high-risk side effect: needs approval.",
                NoArgs,
                publish,
                risk="high",
                side_effect=True,
                idempotent=True,
            ),
            ToolSpec("sleep", "1", "Sleep (idempotent).", SleepArgs, sleep, timeout_s=3600),
        ]
    )


def build_agents(settings: Settings) -> list[AgentSpec]:
    tools = build_tools(settings.data_dir)
    return [
        AgentSpec(
            agent_id=agent,
            description=agent,
            builder=build_run_graph(Planner(agent), tools, DefaultPolicy()),
            tools=tools,
        )
        for agent in (PARK_AGENT, SLEEP_AGENT)
    ]


def sleep_starts(data_dir: Path) -> list[tuple[int, str, float]]:
    """(pid, run_id, time.time()) of every start of the sleep handler, in order."""
    path = data_dir / SLEEP_STARTS
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0]), parts[1], float(parts[2])))
    return out
