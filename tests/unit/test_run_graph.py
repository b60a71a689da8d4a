"""The run graph's routers: where LangGraph runs them, and the edges Studio draws."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal, get_args, get_type_hints

from graphs import run_graph
from graphs.run_graph import build_run_graph, inline
from runtime.policy import DefaultPolicy
from runtime.state import RunState
from tests.agents import ScriptPlanner, finish
from tests.unit.node_env import NodeEnv


async def test_an_inline_router_runs_on_the_loops_thread_untraced() -> None:
    seen: list[int] = []

    def router(state: RunState) -> Literal["a", "b"]:
        seen.append(threading.get_ident())
        return "a"

    path = inline(router)
    config: Any = {"callbacks": []}
    assert await path.ainvoke({}, config) == "a"
    # A plain function given to add_conditional_edges would run on the thread pool.
    assert seen == [threading.get_ident()]
    assert path.func is router  # Literal inference and sync callers still see it
    assert not path.trace
    loop_thread = threading.get_ident()
    assert await asyncio.to_thread(path.invoke, {}, config) == "a"
    assert seen[-1] != loop_thread


def test_every_branch_of_the_run_graph_is_inline_and_keeps_its_edges(env: NodeEnv) -> None:
    builder = build_run_graph(ScriptPlanner(lambda v: finish("x")), env.tools, DefaultPolicy())
    assert builder.branches, "the run graph routes with conditional edges"
    for source, branches in builder.branches.items():
        for spec in branches.values():
            assert not getattr(spec.path, "trace", True), source
            router = getattr(run_graph, f"route_after_{source}")
            expected = set(get_args(get_type_hints(router)["return"]))
            assert spec.ends is not None and set(spec.ends) == expected, source
