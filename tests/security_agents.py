"""Agents for the security tests: a secret argument, and a tool its own user may approve.

Loaded with extra_agents ``tests.security_agents:build_agents``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.model import Decision
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolContext, ToolSpec
from server.settings import Settings
from tests.agents import ScriptPlanner, call, finish
from tools.registry import ToolRegistry

SECRET = "hunter2-do-not-show"


class RotateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    account: str
    password: str


class CheckArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: str


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


def build_tools(settings: Settings) -> ToolRegistry:
    async def rotate(args: RotateArgs, ctx: ToolContext) -> dict[str, object]:
        # The handler gets the real value; only what is shown is redacted.
        with (settings.data_dir / "rotated.log").open("a") as fh:
            fh.write(f"{args.account} {args.password}\n")
        return {"account": args.account, "rotated": True}

    async def check_key(args: CheckArgs, ctx: ToolContext) -> dict[str, object]:
        # A careless handler: its error quotes the secret it was given.
        raise PermissionError(f"upstream rejected key {args.api_key!r}")

    async def note(args: NoteArgs, ctx: ToolContext) -> dict[str, object]:
        return {"noted": args.text}

    return ToolRegistry(
        [
            ToolSpec(
                "rotate_password",
                "1",
                "Set an account's password (high risk; the password is secret).",
                RotateArgs,
                rotate,
                risk="high",
                side_effect=True,
                secret_args=frozenset({"password"}),
            ),
            ToolSpec(
                "check_key",
                "1",
                "Check an API key upstream (the key is secret).",
                CheckArgs,
                check_key,
                secret_args=frozenset({"api_key"}),
            ),
            ToolSpec(
                "self_note",
                "1",
                "A high-risk note the run's own user may approve.",
                NoteArgs,
                note,
                risk="high",
                four_eyes=False,
            ),
        ]
    )


def rotator(view: PlannerView) -> Decision:
    """Rotate a password (needs approval), then finish."""
    if not view.observations:
        return call("rotate_password", account="svc-reporting", password=SECRET)
    return finish(f"rotation: {view.observations[-1].status}")


def leaker(view: PlannerView) -> Decision:
    """One call whose handler fails with the secret in its message."""
    if not view.observations:
        return call("check_key", api_key=SECRET)
    return finish("checked")


def self_approver(view: PlannerView) -> Decision:
    """One high-risk call whose tool allows self-approval."""
    if not view.observations:
        return call("self_note", text="mine")
    return finish("noted")


def build_agents(settings: Settings) -> list[AgentSpec]:
    tools = build_tools(settings)
    return [
        AgentSpec(
            agent_id=script.__name__,
            description=script.__doc__ or script.__name__,
            builder=build_run_graph(ScriptPlanner(script), tools, DefaultPolicy()),
            tools=tools,
        )
        for script in (rotator, self_approver, leaker)
    ]
