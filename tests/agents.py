"""Agents for tests: the same graph builder as the demo, with small scripted planners.

A server loads them with AGENT_RUNTIME_EXTRA_AGENTS='["tests.agents:build_agents"]'.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec, SubAgent
from runtime.events import handoff_tool
from runtime.model import Decision, Handoff, ProposedCall
from runtime.planner import Observation, PlannerView
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolContext, ToolSpec, ToolUnavailable
from server.settings import Settings
from tools.registry import ToolRegistry


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    n: int = Field(ge=1, le=10)


class SayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str


SAID: dict[str, object] = {
    "text": "plain string",
    "digits": "42",
    "quoted": '"quoted"',
    "number": 42,
    "fraction": 0.5,
    "truth": True,
    "pair": ("a", 1),
}
"""What ``say`` returns, by kind: JSON values that are not objects (a tuple is a list)."""


class CounterArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str


class SleepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(ge=0, le=120)


class TransferArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(ge=1)
    hold_s: float = Field(ge=0, le=120)
    """How long the call stays open around its effect."""
    effect_first: bool = True
    """Whether the effect happens when the call starts (else when it ends)."""


class MemoryArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1, max_length=100)
    value: str | None = None


UNREFUNDABLE = 13
"""A transfer of this amount cannot be compensated: its refund fails."""


def transfer_lines(data_dir: Path) -> list[str]:
    path = data_dir / "transfer.log"
    return path.read_text().splitlines() if path.exists() else []


def counter_lines(data_dir: Path) -> list[str]:
    path = data_dir / "counter.log"
    return path.read_text().splitlines() if path.exists() else []


def build_tools(data_dir: Path) -> ToolRegistry:
    async def echo(args: EchoArgs, ctx: ToolContext) -> dict[str, object]:
        return {"text": args.text * args.n}

    async def say(args: SayArgs, ctx: ToolContext) -> object:
        return SAID[args.kind]

    async def counter(args: CounterArgs, ctx: ToolContext) -> dict[str, object]:
        # A real, non-idempotent side effect: one line per execution.
        with (data_dir / "counter.log").open("a") as fh:
            fh.write(f"{ctx.tool_call_id} {args.label}\n")
        return {"label": args.label}

    async def uncount(args: CounterArgs, output: object, ctx: ToolContext) -> None:
        with (data_dir / "counter.log").open("a") as fh:
            fh.write(f"{ctx.tool_call_id} undo\n")

    async def sleep(args: SleepArgs, ctx: ToolContext) -> dict[str, object]:
        with (data_dir / "sleep.log").open("a") as fh:
            fh.write(f"{ctx.tool_call_id}\n")
        # A restarted test server may shorten the sleep it resumes.
        await asyncio.sleep(float(os.environ.get("TEST_SLEEP_OVERRIDE", args.seconds)))
        return {"slept": args.seconds}

    def record_transfer(ctx: ToolContext, what: str) -> None:
        with (data_dir / "transfer.log").open("a") as fh:
            fh.write(f"{ctx.idempotency_key} {what}\n")

    async def transfer(args: TransferArgs, ctx: ToolContext) -> dict[str, object]:
        # A remote system's effect, keyed by the idempotency key, which reconcile looks up.
        if args.effect_first:
            record_transfer(ctx, str(args.amount))
        await asyncio.sleep(args.hold_s)
        if not args.effect_first:
            record_transfer(ctx, str(args.amount))
        return {"transferred": args.amount}

    async def find_transfer(args: TransferArgs, ctx: ToolContext) -> dict[str, object] | None:
        # A slow remote system, where a test asks for one; or one that hangs the first
        # time it is asked and answers after.
        await asyncio.sleep(float(os.environ.get("TEST_RECONCILE_S", "0")))
        hung = data_dir / "reconcile.hung"
        if os.environ.get("TEST_RECONCILE_HANGS_ONCE") and not hung.exists():
            hung.touch()
            await asyncio.sleep(3600)
        with (data_dir / "reconcile.log").open("a") as fh:
            fh.write(f"{ctx.idempotency_key}\n")
        done = any(line.split()[0] == ctx.idempotency_key for line in transfer_lines(data_dir))
        return {"transferred": args.amount} if done else None

    async def refund(args: TransferArgs, output: object, ctx: ToolContext) -> None:
        if args.amount == UNREFUNDABLE:
            raise RuntimeError(f"the bank refused to refund {args.amount}")
        record_transfer(ctx, "refund")

    async def remember(args: MemoryArgs, ctx: ToolContext) -> dict[str, object]:
        assert ctx.memory is not None, "the engine's graphs have a store"
        await ctx.memory.put(args.key, {"value": args.value})
        return {"remembered": args.key}

    async def recall(args: MemoryArgs, ctx: ToolContext) -> dict[str, object]:
        assert ctx.memory is not None, "the engine's graphs have a store"
        found = await ctx.memory.get(args.key)
        return {"value": None if found is None else found["value"]}

    async def flaky(args: SleepArgs, ctx: ToolContext) -> dict[str, object]:
        with (data_dir / "flaky.log").open("a") as fh:
            fh.write(f"{ctx.tool_call_id}\n")
        raise ToolUnavailable("upstream is down")

    async def wire(args: TransferArgs, ctx: ToolContext) -> dict[str, object]:
        record_transfer(ctx, f"wire {args.amount}")
        return {"wired": args.amount}

    return ToolRegistry(
        [
            ToolSpec("echo", "1", "Repeat text n times.", EchoArgs, echo),
            ToolSpec("say", "1", "A bare JSON value of the kind asked.", SayArgs, say),
            ToolSpec(
                "counter",
                "1",
                "Append a line (non-idempotent side effect).",
                CounterArgs,
                counter,
                side_effect=True,
                idempotent=False,
                compensate=uncount,
            ),
            ToolSpec("sleep", "1", "Sleep (idempotent).", SleepArgs, sleep, timeout_s=60),
            ToolSpec("flaky", "1", "Always unavailable.", SleepArgs, flaky, max_attempts=3),
            ToolSpec(
                "remember",
                "1",
                "Keep a value about the user for later runs.",
                MemoryArgs,
                remember,
                side_effect=True,
            ),
            ToolSpec("recall", "1", "What was kept about the user.", MemoryArgs, recall),
            ToolSpec(
                "wire",
                "1",
                "Move money abroad (high-risk: a human approves; a rejection replans).",
                TransferArgs,
                wire,
                risk="high",
                side_effect=True,
                on_reject="replan",
            ),
            ToolSpec(
                "transfer",
                "1",
                "Move money (non-idempotent; reconcilable; compensable by a refund).",
                TransferArgs,
                transfer,
                side_effect=True,
                idempotent=False,
                timeout_s=float(os.environ.get("TEST_TRANSFER_TIMEOUT_S", "120")),
                reconcile=find_transfer,
                compensate=refund,
            ),
        ]
    )


Script = Callable[[PlannerView], Decision]


class ScriptPlanner:
    def __init__(self, script: Script) -> None:
        self.script = script

    async def next_step(self, view: PlannerView) -> Decision:
        return self.script(view)


class SwallowingPlanner:
    """Thinks for the seconds its input says and swallows a cancel while it does, as
    the code a cancel lands in sometimes does (a driver mid-pipeline); then counts,
    a side effect, and finishes."""

    async def next_step(self, view: PlannerView) -> Decision:
        if view.observations:
            return finish("counted")
        try:
            await asyncio.sleep(float(view.input.split()[-1]))
        except asyncio.CancelledError:
            pass
        return call("counter", label="after the cancel")


def call(tool: str, **args: object) -> Decision:
    return Decision(
        kind="tool_calls",
        summary=f"call {tool}",
        tool_calls=[ProposedCall(tool=tool, args=dict(args))],
    )


def finish(answer: str) -> Decision:
    return Decision(kind="finish", summary="done", answer=answer)


def last(view: PlannerView) -> Observation | None:
    return view.observations[-1] if view.observations else None


def typo_fixer(view: PlannerView) -> Decision:
    """Sends a bad argument first, then corrects it from the validation error."""
    obs = last(view)
    if obs is None:
        return call("echo", text="hi", n="many")
    if obs.status == "TOOL_ARGUMENT_INVALID":
        return call("echo", text="hi", n=2)
    return finish(f"echo said {obs.output}")


def stubborn(view: PlannerView) -> Decision:
    """Never corrects its arguments: only the budget stops it."""
    return call("echo", text="hi", n=0)


def slow_worker(view: PlannerView) -> Decision:
    """counter (a non-idempotent side effect), then a long sleep, then finish."""
    seconds = float(view.input.split()[-1]) if view.input.split()[-1][0].isdigit() else 0.1
    # A human who ruled an unknown outcome "already happened" is taken at their word.
    done = {o.tool for o in view.observations if o.status in ("succeeded", "TOOL_OUTCOME_UNKNOWN")}
    if "counter" not in done:
        return call("counter", label="once")
    if "sleep" not in done:
        return call("sleep", seconds=seconds)
    return finish("slept")


def hurried(view: PlannerView) -> Decision:
    """counter and a sleep of the seconds its input says, in one step, then finish."""
    if not view.observations:
        return Decision(
            kind="tool_calls",
            summary="both at once",
            tool_calls=[
                ProposedCall(tool="counter", args={"label": "first"}),
                ProposedCall(tool="sleep", args={"seconds": float(view.input.split()[-1])}),
            ],
        )
    return finish("done")


def transferrer(view: PlannerView) -> Decision:
    """One transfer held open for the seconds its input says, its effect "first" or
    "last", of 5 or the amount given (input "first 30", "first 30 13"), then finish."""
    when, seconds, *amount = view.input.split()
    if not view.observations:
        return call(
            "transfer",
            amount=int(amount[0]) if amount else 5,
            hold_s=float(seconds),
            effect_first=when == "first",
        )
    return finish("transferred")


def second_guesser(view: PlannerView) -> Decision:
    """A wire of 7 a human must approve; rejected, it asks for a transfer of 7 instead."""
    if not view.observations:
        return call("wire", amount=7, hold_s=0)
    if view.observations[-1].status == "APPROVAL_REJECTED":
        return call("transfer", amount=7, hold_s=0)
    return finish(f"{view.observations[-1].tool} done")


def double_wirer(view: PlannerView) -> Decision:
    """Two wires, of 7 and then 8, each a human must approve: a run that parks twice."""
    if len(view.observations) < 2:
        return call("wire", amount=7 + len(view.observations), hold_s=0)
    return finish("both wired")


def rememberer(view: PlannerView) -> Decision:
    """'remember <key> <value>' or 'recall <key>' in the user's long-term memory; its
    answer is the value recalled."""
    verb, key, *value = view.input.split()
    if not view.observations:
        if verb == "remember":
            return call("remember", key=key, value=" ".join(value))
        return call("recall", key=key)
    return finish(str((view.observations[-1].output or {}).get("value")))


def plain_talker(view: PlannerView) -> Decision:
    """Asks ``say`` for each kind of bare value in turn, then answers with what it saw."""
    said = [o.output for o in view.observations]
    if len(said) < len(SAID):
        return call("say", kind=list(SAID)[len(said)])
    return finish(repr(said))


def broken(view: PlannerView) -> Decision:
    return call("flaky", seconds=0)


def wanderer(view: PlannerView) -> Decision:
    """Asks for a tool that does not exist, then gives up gracefully."""
    if not view.observations:
        return call("teleport", where="mars")
    return finish(f"could not: {view.observations[-1].status}")


def delegator(view: PlannerView) -> Decision:
    """echo, then hands the rest of its input to the agent its first word names, then
    finishes with what that agent handed back."""
    target, _, task = view.input.partition(" ")
    if not any(o.tool == "echo" for o in view.observations):
        return call("echo", text=target, n=1)
    back = next((o for o in view.observations if o.tool == handoff_tool(target)), None)
    if back is None:
        return Decision(
            kind="handoff",
            summary=f"hand {task!r} to {target}",
            handoff=Handoff(agent_id=target, task=task or "go", data={"from": view.agent_id}),
        )
    if back.status != "succeeded":
        return finish(f"handoff failed: {back.status}")
    # A large result comes as an artifact, its preview in its place.
    said = back.output.get("answer", back.output.get("preview"))
    return finish(f"{target} said {said}")


def bulky(view: PlannerView) -> Decision:
    """Finishes at once with data of as many bytes as its input says."""
    size = int(view.input.split()[-1]) if view.input.split()[-1].isdigit() else 10
    return Decision(kind="finish", summary="bulk", answer="bulk", data={"blob": "x" * size})


SCRIPTS: dict[str, Script] = {
    "typo_fixer": typo_fixer,
    "stubborn": stubborn,
    "slow_worker": slow_worker,
    "hurried": hurried,
    "transferrer": transferrer,
    "rememberer": rememberer,
    "second_guesser": second_guesser,
    "double_wirer": double_wirer,
    "broken": broken,
    "plain_talker": plain_talker,
    "wanderer": wanderer,
    "bulky": bulky,
}


SUB_TOOLS = ("counter", "sleep")
"""The sub-agents' own tools: not echo, which only the delegators have."""


def sub_agents(tools: ToolRegistry) -> tuple[SubAgent, ...]:
    """What ``delegator`` may hand off to: two scripts with their own tools, and ``relay``
    (another delegator) that may hand off to them in turn."""
    own = ToolRegistry(s for s in tools.specs() if s.name in SUB_TOOLS)
    subs = tuple(
        SubAgent(name, SCRIPTS[name].__doc__ or name, ScriptPlanner(SCRIPTS[name]), own, policy)
        for name, policy in (
            ("slow_worker", DefaultPolicy()),
            ("typo_fixer", DefaultPolicy()),
            ("bulky", DefaultPolicy()),
        )
    )
    relay = SubAgent("relay", "a delegator", ScriptPlanner(delegator), tools, DefaultPolicy(), subs)
    return (*subs, relay)


def build_agents(settings: Settings) -> list[AgentSpec]:
    tools = build_tools(settings.data_dir)
    narrow = ToolRegistry(s for s in tools.specs() if s.name == "echo")
    return [
        AgentSpec(
            agent_id=name,
            description=script.__doc__ or name,
            builder=build_run_graph(ScriptPlanner(script), tools, DefaultPolicy()),
            tools=tools,
        )
        for name, script in SCRIPTS.items()
    ] + [
        AgentSpec(
            agent_id="swallower",
            description=SwallowingPlanner.__doc__ or "swallower",
            builder=build_run_graph(SwallowingPlanner(), tools, DefaultPolicy()),
            tools=tools,
        ),
        AgentSpec(
            agent_id="narrow_delegator",
            description="delegator, built without an id and registered with its own tool only",
            builder=build_run_graph(
                ScriptPlanner(delegator), narrow, DefaultPolicy(), handoffs=sub_agents(tools)
            ),
            tools=narrow,
        ),
        AgentSpec(
            agent_id="delegator",
            description=delegator.__doc__ or "delegator",
            builder=build_run_graph(
                ScriptPlanner(delegator),
                tools,
                DefaultPolicy(),
                agent_id="delegator",
                handoffs=sub_agents(tools),
            ),
            tools=tools,
        ),
    ]
