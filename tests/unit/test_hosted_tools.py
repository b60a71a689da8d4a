"""An agent's tools as a cancel resolves its ledger's rows: its own, then its hosted
agents' (``graphs.run_graph.with_hosted_tools``), never another agent's undo for a call."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from graphs.run_graph import build_run_graph, with_hosted_tools
from runtime.agent import AgentSpec, SubAgent
from runtime.policy import DefaultPolicy
from runtime.tooling import REDACTED, ChainedTools
from server.api.redaction import RunTools
from server.api.routes.approvals import four_eyes
from tests.agents import ScriptPlanner, build_tools, finish
from tests.unit.conftest import build_run
from tools.registry import ToolRegistry


def test_a_tool_is_found_wherever_one_agent_defines_it(tmp_path: Path) -> None:
    tools = build_tools(tmp_path)
    own = ToolRegistry([tools.resolve("echo", "1")])  # type: ignore[list-item]
    sub = ToolRegistry(s for s in tools.specs() if s.name in ("counter", "sleep"))
    chained = ChainedTools(own, sub, tools)  # counter in two: the same spec
    assert chained.resolve("counter", "1") is tools.resolve("counter", "1")
    assert chained.resolve("echo", "1") is tools.resolve("echo", "1")
    assert chained.resolve("nothing", "1") is None
    # What the agent's planner is offered, and GET /agents lists: its own tools only.
    assert [s.name for s in chained.specs()] == ["echo"]


def test_a_name_two_agents_define_differently_resolves_to_neither(tmp_path: Path) -> None:
    """A row does not say whose call it was: one agent's undo must not run for
    another's effect (the compensation is left undone, which its outcome shows)."""
    counter = build_tools(tmp_path).resolve("counter", "1")
    assert counter is not None
    other = dataclasses.replace(counter, compensate=None)
    chained = ChainedTools(ToolRegistry([counter]), ToolRegistry([other]))
    assert chained.resolve("counter", "1") is None


def test_an_agent_s_spec_covers_its_hosted_agents_tools(tmp_path: Path) -> None:
    tools = build_tools(tmp_path)
    own = ToolRegistry([tools.resolve("echo", "1")])  # type: ignore[list-item]
    sub_tools = ToolRegistry(s for s in tools.specs() if s.name == "counter")
    sub = SubAgent("counting", "counts", ScriptPlanner(lambda _v: finish("x")), sub_tools,
                   DefaultPolicy())  # fmt: skip
    builder = build_run_graph(ScriptPlanner(lambda _v: finish("x")), own, DefaultPolicy(),
                              handoffs=[sub])  # fmt: skip
    spec = AgentSpec("root", "root", builder, own)
    covered = with_hosted_tools(spec)
    assert covered.tools.resolve("counter", "1") is tools.resolve("counter", "1")
    assert [s.name for s in covered.tools.specs()] == ["echo"]
    alone = AgentSpec("alone", "alone", build_run_graph(
        ScriptPlanner(lambda _v: finish("x")), own, DefaultPolicy()), own)  # fmt: skip
    assert with_hosted_tools(alone) is alone  # nothing hosted: the spec as it was


def test_a_call_two_of_an_agent_s_agents_define_differently_is_shown_as_unknown(
    tmp_path: Path,
) -> None:
    """Where the run's agent cannot tell, another registered agent's definition (the
    sub-agent's, registered on its own too) stood in: it declared no secret, and let
    the run's user approve a call the root's tool keeps for another pair of eyes."""
    echo = build_tools(tmp_path).resolve("echo", "1")
    assert echo is not None
    root_echo = dataclasses.replace(echo, secret_args=frozenset({"text"}), four_eyes=True)
    sub_tools = ToolRegistry([dataclasses.replace(echo, secret_args=frozenset(), four_eyes=False)])
    engine = SimpleNamespace(
        agents={
            "root": SimpleNamespace(tools=ChainedTools(ToolRegistry([root_echo]), sub_tools)),
            "writer": SimpleNamespace(tools=sub_tools),
        }
    )
    run = build_run().model_copy(update={"agent_id": "root"})
    tools = RunTools(engine, run)  # type: ignore[arg-type]
    assert tools.shown("echo", "1", {"text": "hunter2"}) == {"text": REDACTED}
    assert four_eyes(engine, run, "echo", "1")  # type: ignore[arg-type]
    # The sub-agent's own calls, named as its, read its own definition.
    assert tools.shown("echo", "1", {"text": "hi"}, agent_id="writer") == {"text": "hi"}


def test_a_run_of_an_agent_not_hosted_here_reads_no_other_agent_s_tool(tmp_path: Path) -> None:
    """A fleet mid-deploy: the run's agent is not here, another agent defines the same
    name and version with no secret and no second pair of eyes, and stood in."""
    echo = build_tools(tmp_path).resolve("echo", "1")
    assert echo is not None
    other = ToolRegistry([dataclasses.replace(echo, secret_args=frozenset(), four_eyes=False)])
    engine = SimpleNamespace(agents={"other": SimpleNamespace(tools=other)})
    run = build_run().model_copy(update={"agent_id": "root"})
    assert RunTools(engine, run).shown("echo", "1", {"text": "x"}) == {"text": REDACTED}  # type: ignore[arg-type]
    assert four_eyes(engine, run, "echo", "1")  # type: ignore[arg-type]
