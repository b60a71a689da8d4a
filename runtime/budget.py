"""Budgets: effective limits from request options and server maxima, checked before each call."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from runtime.model import DecisionUsage, Limits, RunOptions, Usage

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Maxima:
    """Server-wide caps; a request may ask for less, never for more."""

    max_steps: int = 50
    max_llm_calls: int = 100
    max_tool_calls: int = 200
    max_tokens: int = 2_000_000
    max_cost_usd: float = 50.0
    timeout_s: float = 3600.0


SPENT_CAP = 10**12
"""The most one reply is counted for, in calls or tokens: past every budget's bound
(a model's usage report of 2**64 tokens failed the run's write), short of a sum that
overflows a 64-bit column."""


def counted(spent: DecisionUsage) -> DecisionUsage:
    """A planner's account of what a decision cost, as a budget can count it: nothing
    negative (a report of -10**6 tokens gave the budget back), nothing past
    :data:`SPENT_CAP`, and a cost that is a number."""

    def bound(value: N) -> N:
        return min(max(value, type(value)(0)), type(value)(SPENT_CAP))

    cost = spent.cost_usd
    return DecisionUsage(
        llm_calls=bound(spent.llm_calls),
        tokens=bound(spent.tokens),
        cost_usd=0.0 if math.isnan(cost) else bound(cost),
    )


def effective_limits(options: RunOptions, maxima: Maxima) -> Limits:
    b = options.budget

    def cap(asked: N | None, ceiling: N) -> N:
        return ceiling if asked is None else min(asked, ceiling)

    return Limits(
        max_steps=cap(options.max_steps, maxima.max_steps),
        max_llm_calls=cap(b.max_llm_calls, maxima.max_llm_calls),
        max_tool_calls=cap(b.max_tool_calls, maxima.max_tool_calls),
        max_tokens=cap(b.max_tokens, maxima.max_tokens),
        max_cost_usd=cap(b.max_cost_usd, maxima.max_cost_usd),
        timeout_s=cap(b.timeout_s, maxima.timeout_s),
    )


def before_plan(usage: Usage, limits: Limits, active_s: float) -> str | None:
    """Why another planner call would break the budget, or None if it may go ahead."""
    if usage.steps >= limits.max_steps:
        return f"max_steps {limits.max_steps} reached"
    if usage.llm_calls >= limits.max_llm_calls:
        return f"max_llm_calls {limits.max_llm_calls} reached"
    if usage.tokens >= limits.max_tokens:
        return f"max_tokens {limits.max_tokens} reached"
    if usage.cost_usd >= limits.max_cost_usd:
        return f"max_cost_usd {limits.max_cost_usd} reached"
    if active_s >= limits.timeout_s:
        return f"timeout_s {limits.timeout_s} reached"
    return None


def after_plan(usage: Usage, limits: Limits) -> str | None:
    """Why a decision, charged to ``usage``, may not be acted on: the planner call that
    made it spent more than was left (a model's tokens and cost are known only after
    the call, and a planner may make more calls than it was allowed)."""
    if usage.llm_calls > limits.max_llm_calls:
        return f"max_llm_calls {limits.max_llm_calls}: {usage.llm_calls} used"
    if usage.tokens > limits.max_tokens:
        return f"max_tokens {limits.max_tokens}: {usage.tokens} used"
    if usage.cost_usd > limits.max_cost_usd:
        return f"max_cost_usd {limits.max_cost_usd}: {usage.cost_usd:.6g} used"
    return None


def before_tools(usage: Usage, limits: Limits, n_calls: int, active_s: float) -> str | None:
    """Reserve ``n_calls`` tool calls at once, so parallel calls cannot overshoot."""
    if usage.tool_calls + n_calls > limits.max_tool_calls:
        return (
            f"max_tool_calls {limits.max_tool_calls}: {usage.tool_calls} used, "
            f"{n_calls} more requested"
        )
    if active_s >= limits.timeout_s:
        return f"timeout_s {limits.timeout_s} reached"
    return None


def limits_from(raw: dict[str, object] | None) -> Limits:
    """The limits stored in a graph state, or the server defaults for a state without any."""
    return Limits.model_validate(raw) if raw else effective_limits(RunOptions(), Maxima())
