"""Ending a cancelled run: close its running calls, compensate if asked, record why.

Split from the engine, which calls it from whichever drive holds the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from langgraph.store.base import BaseStore

from runtime.adapter import fail_run, side_effects
from runtime.errors import CODES, Code
from runtime.events import EventType
from runtime.ledger import StoreArtifacts, scrub, secret_values, settle_cut_off
from runtime.lifecycle import TERMINAL
from runtime.memory import Memory
from runtime.model import Run, ToolCall, Usage
from runtime.store.base import RunStore
from runtime.tooling import ToolContext, ToolResolver

log = logging.getLogger(__name__)

CUT_OFF = "cancelled while running"


@dataclass(frozen=True)
class CallSetting:
    """What a handler had around it, for the reconcile and compensation calls that
    follow it: the run's agent's tools, and LangGraph's store (long-term memory)."""

    tools: ToolResolver
    memory: BaseStore | None = None

    def context(self, store: RunStore, run: Run, row: ToolCall) -> ToolContext:
        memory = self.memory
        return ToolContext(
            run_id=run.run_id,
            tool_call_id=row.tool_call_id,
            idempotency_key=row.idempotency_key,
            context=run.context,
            artifacts=StoreArtifacts(store, run.run_id),
            memory=None
            if memory is None
            else Memory(memory, run.context.tenant_id, run.context.user_id),
        )


async def finish_cancel(
    store: RunStore,
    setting_of: Callable[[str], CallSetting],
    run_id: str,
    reason: str,
    compensate: bool,
    usage: Usage | None = None,
) -> None:
    """``setting_of``: agent_id → the tools and memory store its calls had; ``usage``:
    the run's as its drive knew it when the cancel cut it off (None: as stored)."""
    run = await store.get_run(run_id)
    if run is None or run.state in TERMINAL:
        return
    setting = setting_of(run.agent_id)
    charged = await cut_off_usage(store, run_id, usage or run.usage)
    await settle_running_calls(store, setting, run, Code.RUN_CANCELLED, CUT_OFF)
    await store.interrupt_running_calls(run_id, Code.RUN_CANCELLED, CUT_OFF)
    compensated = await compensate_effects(store, setting, run) if compensate else None
    await fail_run(
        store,
        run_id,
        Code.RUN_CANCELLED,
        reason or "cancelled",
        compensations=compensated,
        usage=charged,
    )


async def cut_off_usage(store: RunStore, run_id: str, usage: Usage) -> dict[str, Any]:
    """``usage`` with the calls charged that a cancel or the time budget cut off after
    their handler had started: the executor charges its calls when they return, and
    these never will. Read before the cut-off settles them (they are still running)."""
    started = [
        row
        for row in await store.list_tool_calls(run_id)
        if row.status == "running" and row.attempts > 0
    ]
    return usage.model_copy(update={"tool_calls": usage.tool_calls + len(started)}).model_dump()


async def settle_running_calls(
    store: RunStore, setting: CallSetting, run: Run, code: Code, message: str
) -> None:
    """Side effects cut off mid-call (the run was cancelled, or ran out of time, with
    ``code``): where the tool can say whether the effect took place, the ledger records
    which (:func:`runtime.ledger.settle_cut_off`)."""
    for row in await store.list_tool_calls(run.run_id):
        if row.status != "running" or not row.side_effect or row.attempts == 0:
            continue
        spec = setting.tools.resolve(row.tool, row.version)
        if spec is None or spec.reconcile is None:
            continue
        args = spec.args_model.model_validate(row.args)
        tctx = replace(setting.context(store, run, row), cut_off=True)
        await settle_cut_off(store, spec, row, args, tctx, {"code": code, "message": message})


async def compensate_effects(store: RunStore, setting: CallSetting, run: Run) -> list[str]:
    """Run each declared compensation of a side effect that happened, at most once."""
    tools = setting.tools
    _, already = await side_effects(store, run.run_id)
    done = list(already)
    for row in await store.list_tool_calls(run.run_id):
        spec = tools.resolve(row.tool, row.version)
        if row.compensated or row.status != "succeeded" or not row.side_effect:
            continue
        if spec is None or spec.compensate is None:
            continue
        if not await store.claim_compensation(row.tool_call_id):
            continue
        tctx = setting.context(store, run, row)
        try:
            await asyncio.wait_for(
                spec.compensate(spec.args_model.model_validate(row.args), row.output, tctx),
                spec.timeout_s,
            )
        except Exception as exc:
            secrets = secret_values(spec, spec.args_model.model_validate(row.args))
            if secrets:  # a traceback would print the values unscrubbed
                log.error(
                    "compensation of %s failed: %s", row.tool_call_id, scrub(repr(exc), secrets)
                )
            else:
                log.exception("compensation of %s failed", row.tool_call_id)
            await store.release_compensation(row.tool_call_id, done=False)
            # The record says which compensations ran, and which were tried and failed.
            await store.append_event(
                run.run_id,
                EventType.ERROR,
                {
                    "code": Code.COMPENSATION_FAILED,
                    "message": scrub(f"{spec.ref} compensate: {exc!r}", secrets),
                    "tool_call_id": row.tool_call_id,
                    "recovery": CODES[Code.COMPENSATION_FAILED].recovery,
                },
                dedupe_key=f"compensation-failed:{row.tool_call_id}",
            )
            continue
        await store.release_compensation(row.tool_call_id, done=True)
        done.append(row.tool_call_id)
    return done
