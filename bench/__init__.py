"""Benchmarks of the runtime against raw LangGraph: ``python -m bench.run`` (``make bench``).

Shared here: the bench agents (a scripted planner and its tools), fresh PostgreSQL
schemas, and the statistics every benchmark reports (medians of paired ratios).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.model import Decision, ProposedCall
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolContext, ToolSpec
from server.settings import Settings
from tools.registry import ToolRegistry

PG_URL = os.environ.get("AGENT_RUNTIME_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TOOL_STEPS = 5
"""Tool steps per run in the overhead benchmark (then the planner finishes)."""
NOOP_AGENT = "bench_noop"
BLOB_AGENT = "bench_blob"


@dataclass
class Work:
    """Simulated latency of the work a run does, the same on both sides of a comparison."""

    planner_s: float = 0.0
    """Each planning step (an LLM call, in a real run)."""
    tool_s: float = 0.0
    """Each tool call."""

    def label(self) -> str:
        if not self.planner_s and not self.tool_s:
            return "none (no-op)"
        return f"planner {self.planner_s * 1000:.0f} ms, tool {self.tool_s * 1000:.0f} ms"


WORK = Work()
"""What the benchmark's planner and no-op tool wait for; set by ``bench.overhead``."""


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BlobArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(ge=10, le=64 * 1024 * 1024)
    """Size in bytes of the tool's output, encoded as JSON."""


async def noop(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
    if WORK.tool_s:
        await asyncio.sleep(WORK.tool_s)
    return {"ok": True}


def blob_output(size: int) -> dict[str, str]:
    """A JSON-able value whose compact JSON encoding (``{"d": "…"}``) is ``size`` bytes."""
    return {"d": "x" * (size - len('{"d": ""}'))}


async def blob(args: BlobArgs, ctx: ToolContext) -> dict[str, str]:
    return blob_output(args.size)


class ScriptPlanner:
    """A deterministic planner: no model calls, so only the runtime is measured."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def next_step(self, view: PlannerView) -> Decision:
        if self.agent == NOOP_AGENT and WORK.planner_s:
            await asyncio.sleep(WORK.planner_s)
        if self.agent == NOOP_AGENT and len(view.observations) < TOOL_STEPS:
            return Decision(
                kind="tool_calls", summary="noop", tool_calls=[ProposedCall(tool="noop")]
            )
        if self.agent == BLOB_AGENT and not view.observations:
            size = int(view.input)
            return Decision(
                kind="tool_calls",
                summary="blob",
                tool_calls=[ProposedCall(tool="blob", args={"size": size})],
            )
        return Decision(kind="finish", summary="done", answer="done")


def bench_agents() -> dict[str, AgentSpec]:
    tools = ToolRegistry(
        [
            ToolSpec("noop", "1", "Do nothing.", NoArgs, noop),
            ToolSpec("blob", "1", "Return `size` bytes of JSON.", BlobArgs, blob),
        ]
    )
    return {
        agent: AgentSpec(
            agent_id=agent,
            description=agent,
            builder=build_run_graph(ScriptPlanner(agent), tools, DefaultPolicy()),
            tools=tools,
        )
        for agent in (NOOP_AGENT, BLOB_AGENT)
    }


def engine_settings(data_dir: Path, url: str) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=url,
        default_agent=NOOP_AGENT,
        worker_concurrency=8,
        log_level="warning",
    )


@contextmanager
def pg_schema(base: str = PG_URL) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def fmt_bytes(n: float) -> str:
    if abs(n) >= 1024 * 1024:
        return f"{n / 1024 / 1024:.2f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.2f} KiB"
    return f"{n:.0f} B"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
