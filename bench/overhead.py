"""Runtime overhead: the same planner + no-op tool loop, raw LangGraph vs the engine.

Both sides use the same kind of checkpointer (SQLite file, then PostgreSQL) with
``durability="sync"``. The engine side includes everything a run pays for in
process: run row, lease, steps, ledger, events, lifecycle, budget checks. No HTTP.

Repetitions alternate pairwise (raw, engine, then engine, raw, …) so a slow
moment of the machine hits both sides; we report medians and the median of the
per-pair ratios, never a single absolute time.

``python -m bench.overhead [--reps N] [--realistic] [--profile sqlite|postgres]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import operator
import pstats
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import aiosqlite
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from bench import (
    NOOP_AGENT,
    TOOL_STEPS,
    WORK,
    Work,
    bench_agents,
    engine_settings,
    fmt_ms,
    median,
    pg_schema,
)
from runtime.backend import CHECKPOINT_SERDE
from runtime.checkpointer import PooledPostgresSaver
from runtime.lifecycle import State
from runtime.model import RunCreate
from server.host import Host, open_host

TARGET_RATIO = 1.3


# -- raw LangGraph ------------------------------------------------------------


class RawState(TypedDict, total=False):
    input: str
    step_index: int
    decision: dict[str, Any] | None
    calls: list[dict[str, Any]]
    observations: Annotated[list[dict[str, Any]], operator.add]
    outcome: dict[str, Any] | None


async def raw_noop_tool() -> dict[str, object]:
    if WORK.tool_s:
        await asyncio.sleep(WORK.tool_s)
    return {"ok": True}


# The same topology as graphs.run_graph (planner → guard → executor → planner … →
# finish), so both sides take the same supersteps and write the same number of
# checkpoints: what differs is only what the runtime does around the nodes.


async def raw_planner(state: RawState) -> dict[str, Any]:
    if WORK.planner_s:
        await asyncio.sleep(WORK.planner_s)
    done = len(state.get("observations") or [])
    if done < TOOL_STEPS:
        decision = {"kind": "tool_calls", "tool_calls": [{"tool": "noop", "args": {}}]}
    else:
        decision = {"kind": "finish", "answer": "done"}
    return {"decision": decision, "step_index": state.get("step_index", 0) + 1, "calls": []}


async def raw_guard(state: RawState) -> dict[str, Any]:
    decision = state.get("decision") or {}
    return {"calls": [dict(c) for c in decision.get("tool_calls", [])]}


async def raw_executor(state: RawState) -> dict[str, Any]:
    observations = []
    for call in state.get("calls") or []:
        output = await raw_noop_tool()
        observations.append({"tool": call["tool"], "status": "succeeded", "output": output})
    return {"observations": observations, "calls": []}


async def raw_finish(state: RawState) -> dict[str, Any]:
    return {"outcome": {"status": "succeeded"}}


def raw_route_planner(state: RawState) -> Literal["guard", "finish"]:
    return "guard" if (state.get("decision") or {}).get("kind") == "tool_calls" else "finish"


def raw_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder: StateGraph[RawState, None, RawState, RawState] = StateGraph(RawState)
    builder.add_node("planner", raw_planner)
    builder.add_node("guard", raw_guard)
    builder.add_node("executor", raw_executor)
    builder.add_node("finish", raw_finish)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", raw_route_planner)
    builder.add_edge("guard", "executor")
    builder.add_edge("executor", "planner")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


@contextlib.asynccontextmanager
async def raw_checkpointer(store: str, tmp: Path) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    if store == "sqlite":
        conn = await aiosqlite.connect(tmp / "raw.db")
        # The engine's checkpointer shares the run store's file, which is in WAL mode:
        # the same journal (and fsyncs per commit) here, or the two sides differ in I/O.
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA busy_timeout=10000")
        saver = AsyncSqliteSaver(conn, serde=CHECKPOINT_SERDE)  # the engine's, as below
        await saver.setup()
        try:
            yield saver
        finally:
            await conn.close()
        return
    with pg_schema() as url:
        pool: AsyncConnectionPool[AsyncConnection[DictRow]] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=10,
            kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0},
            open=False,
        )
        await pool.open(wait=True, timeout=10)
        try:
            # The engine's checkpointer class (LangGraph's, less its lock and thread hop):
            # the same checkpointer on both sides, or the ratio would credit the engine
            # with what it saves inside LangGraph's saver.
            pg_saver = PooledPostgresSaver(pool, serde=CHECKPOINT_SERDE)  # type: ignore[arg-type]
            await pg_saver.setup()
            yield pg_saver
        finally:
            await pool.close()


@contextlib.asynccontextmanager
async def engine_host(store: str, tmp: Path) -> AsyncIterator[Host]:
    if store == "sqlite":
        async with open_host(
            engine_settings(tmp, f"sqlite:///{tmp / 'engine.db'}"), agents=bench_agents()
        ) as host:
            yield host
        return
    with pg_schema() as url:
        async with open_host(engine_settings(tmp, url), agents=bench_agents()) as host:
            yield host


# -- one run of each ----------------------------------------------------------


def raw_runner(graph: CompiledStateGraph[Any, Any, Any, Any]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        config: Any = {"configurable": {"thread_id": f"raw-{uuid.uuid4().hex}"}}
        out = await graph.ainvoke({"input": "x"}, config, durability="sync")
        assert len(out["observations"]) == TOOL_STEPS, out

    return run


def engine_runner(host: Host) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        created, _ = await host.engine.create_run(RunCreate(agent_id=NOOP_AGENT, input="x"))
        final = await host.engine.wait_settled(created.run_id)
        assert final.state is State.SUCCEEDED, final
        assert final.usage.tool_calls == TOOL_STEPS, final.usage

    return run


async def timed(fn: Callable[[], Awaitable[None]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


@dataclass
class OverheadResult:
    store: str
    reps: int
    work: str
    raw_s: float
    engine_s: float
    ratio: float
    """median(engine) / median(raw)"""
    pair_ratio: float
    """median over pairs of engine/raw"""

    @property
    def within_target(self) -> bool:
        return self.pair_ratio <= TARGET_RATIO

    def row(self) -> list[str]:
        return [
            self.store,
            self.work,
            str(self.reps),
            fmt_ms(self.raw_s),
            fmt_ms(self.engine_s),
            f"{self.ratio:.2f}x",
            f"{self.pair_ratio:.2f}x",
            "yes" if self.within_target else "NO",
        ]


HEADER = [
    "store",
    "simulated work per step",
    "pairs",
    "raw LangGraph / run (median)",
    "engine / run (median)",
    "engine/raw (of medians)",
    "engine/raw (median of pairs)",
    f"<= {TARGET_RATIO}x",
]


REALISTIC = Work(planner_s=0.05, tool_s=0.02)
"""Still fast for an LLM (50 ms a planning step) and a tool (20 ms): the share of a
real run's time that the runtime adds, next to the no-op run's worst case."""


async def measure(
    store: str, reps: int, warmup: int = 3, work: Work | None = None
) -> OverheadResult:
    work = work or Work()
    WORK.planner_s, WORK.tool_s = work.planner_s, work.tool_s
    try:
        return await _measure(store, reps, warmup, work)
    finally:
        WORK.planner_s = WORK.tool_s = 0.0


async def _measure(store: str, reps: int, warmup: int, work: Work) -> OverheadResult:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmpdir:
        tmp = Path(tmpdir)
        async with raw_checkpointer(store, tmp) as saver, engine_host(store, tmp) as host:
            raw, eng = raw_runner(raw_graph(saver)), engine_runner(host)
            for _ in range(warmup):
                await raw()
                await eng()
            raw_t: list[float] = []
            eng_t: list[float] = []
            for i in range(reps):
                if i % 2 == 0:
                    raw_t.append(await timed(raw))
                    eng_t.append(await timed(eng))
                else:
                    eng_t.append(await timed(eng))
                    raw_t.append(await timed(raw))
    pairs = [e / r for e, r in zip(eng_t, raw_t, strict=True)]
    return OverheadResult(
        store=store,
        reps=reps,
        work=work.label(),
        raw_s=median(raw_t),
        engine_s=median(eng_t),
        ratio=median(eng_t) / median(raw_t),
        pair_ratio=median(pairs),
    )


async def profile(store: str, runs: int, top: int = 30) -> str:
    """cProfile of ``runs`` engine runs (the whole event loop, so the store's I/O too)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmpdir:
        async with engine_host(store, Path(tmpdir)) as host:
            eng = engine_runner(host)
            await eng()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(runs):
                await eng()
            prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--store", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--profile", choices=["sqlite", "postgres"])
    parser.add_argument("--profile-runs", type=int, default=20)
    parser.add_argument(
        "--realistic",
        action="store_true",
        help=f"also with simulated work: {REALISTIC.label()} (the target is on the no-op run)",
    )
    args = parser.parse_args()
    if args.profile:
        print(asyncio.run(profile(args.profile, args.profile_runs)))
        return
    from bench import markdown_table

    works = [Work(), REALISTIC] if args.realistic else [Work()]
    rows = [
        asyncio.run(measure(s, args.reps, work=w)).row()
        for w in works
        for s in args.store or ["sqlite", "postgres"]
    ]
    print(markdown_table(HEADER, rows))


if __name__ == "__main__":
    main()
