"""Ending a cancelled run: close its running calls, compensate if asked, record why.

Split from the engine, which calls it from whichever drive holds the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from langgraph.store.base import BaseStore

from runtime.adapter import fail_run, side_effects
from runtime.dberrors import ServiceUnavailable
from runtime.errors import CODES, Code
from runtime.events import EventType
from runtime.ledger import StoreArtifacts, scrub, secret_values, settle_cut_off
from runtime.lifecycle import TERMINAL
from runtime.memory import Memory
from runtime.model import Run, ToolCall, Usage
from runtime.recording import WITHOUT_LEASE_S, with_retries
from runtime.store.base import RunStore
from runtime.tooling import ToolContext, ToolResolver, ToolSpec

log = logging.getLogger(__name__)

CUT_OFF = "cancelled while running"


class _NoTools:
    """The tools of an agent this process does not have: none to ask."""

    def resolve(self, name: str, version: str | None = None) -> ToolSpec | None:
        return None

    def specs(self) -> list[ToolSpec]:
        return []


NO_TOOLS: ToolResolver = _NoTools()


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
            else Memory.for_tool(memory, run.context.tenant_id, run.context.user_id),
        )


async def finish_cancel(
    store: RunStore,
    setting_of: Callable[[str], CallSetting],
    run_id: str,
    reason: str,
    compensate: bool,
    cut: CutOff | None = None,
) -> None:
    """``setting_of``: agent_id → the tools and memory store its calls had; ``cut``:
    where the graph was when the cancel cut it off (None: nowhere known)."""
    run = await store.get_run(run_id)
    if run is None or run.state in TERMINAL:
        return
    setting = setting_of(run.agent_id)
    charged = await cut_off_usage(store, run, cut or CutOff({}))
    await settle_running_calls(store, setting, run, Code.RUN_CANCELLED, CUT_OFF)
    await store.interrupt_running_calls(run_id, Code.RUN_CANCELLED, CUT_OFF)
    # A second cancel may have asked for compensation since the drive read the first;
    # from here on one asking for it is refused (the decision is taken).
    sealed = await store.seal_cancel(run_id)
    if sealed is not None:  # as it stands now, naming who added compensation
        reason, compensate = sealed[0], compensate or sealed[1]
    compensated = await compensate_effects(store, setting, run) if compensate else None
    await fail_run(
        store,
        run_id,
        Code.RUN_CANCELLED,
        reason or "cancelled",
        compensations=compensated,
        usage=charged,
    )


@dataclass(frozen=True)
class CutOff:
    """Where a run's graph was when a cancel or its time budget stopped it."""

    values: Mapping[str, Any]
    """The graph's latest values (its checkpoint's, where no drive of ours held them)."""
    active_s: float | None = None
    """The run's active time up to the cut, where a drive measured it."""


async def cut_off_usage(store: RunStore, run: Run, cut: CutOff) -> dict[str, Any]:
    """The run's usage at the cut, with the calls of the step it stopped charged where
    their handler had started: the executor charges a step's calls together when it
    returns, and this one never will, though some of them may have finished and had
    their effect. A call a human sent back to run again was charged when it first ran."""
    usage = Usage.model_validate(cut.values["usage"]) if cut.values.get("usage") else run.usage
    if cut.active_s is not None:
        usage = usage.model_copy(update={"active_s": cut.active_s})
    # A planner records its step before its node returns the count: cut in between,
    # the step is on the record and not in the usage.
    steps = max(usage.steps, await store.count_steps(run.run_id))
    usage = usage.model_copy(update={"steps": steps})
    calls = list(cut.values.get("calls") or [])
    if calls:
        rows = {row.tool_call_id: row for row in await store.list_tool_calls(run.run_id)}
        started = [
            call
            for call in calls
            if call.get("kind") != "outcome_unknown"
            and (row := rows.get(call["tool_call_id"])) is not None
            and row.attempts > 0
        ]
        usage = usage.model_copy(update={"tool_calls": usage.tool_calls + len(started)})
    return usage.model_dump()


async def settle_running_calls(
    store: RunStore, setting: CallSetting, run: Run, code: Code, message: str
) -> list[str]:
    """Side effects cut off mid-call (the run was cancelled, or ran out of time, with
    ``code``): where the tool can say whether the effect took place, the ledger records
    which (:func:`runtime.ledger.settle_cut_off`). Returns the calls that were running."""
    running = []
    for row in await store.list_tool_calls(run.run_id):
        if row.status != "running":
            continue
        running.append(row.tool_call_id)
        if not row.side_effect or row.attempts == 0:
            continue
        spec = setting.tools.resolve(row.tool, row.version)
        if spec is None or spec.reconcile is None:
            continue
        args = spec.stored_args(row.args)
        tctx = replace(setting.context(store, run, row), cut_off=True)
        await settle_cut_off(store, spec, row, args, tctx, {"code": code, "message": message})
    return running


async def fail_cut_off(
    store: RunStore,
    setting: CallSetting,
    run: Run,
    cut: CutOff,
    code: Code,
    message: str,
    *,
    settling: str | None = None,
    ask_tools: bool = True,
) -> None:
    """Fail a run whose graph was cut off (its time ran out, its workers kept dying):
    its usage at the cut; the calls it left running settled (:func:`settle_running_calls`;
    not asked of the tools without ``ask_tools``), their errors saying ``settling``
    (``message`` if None); the first of them named in its error event."""
    charged = await cut_off_usage(store, run, cut)
    if ask_tools:
        running = await settle_running_calls(store, setting, run, code, settling or message)
    else:
        listed = await store.list_tool_calls(run.run_id)
        running = [row.tool_call_id for row in listed if row.status == "running"]
    await fail_run(
        store,
        run.run_id,
        code,
        message,
        usage=charged,
        tool_call_id=running[0] if running else None,
    )


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
        if row.tool_call_id in _RAN_UNRECORDED:  # ran here already: only say so
            await _record_compensated(store, row.tool_call_id)
            done.append(row.tool_call_id)
            continue
        tctx = setting.context(store, run, row)
        try:
            await asyncio.wait_for(
                spec.compensate(spec.stored_args(row.args), row.output, tctx),
                spec.timeout_s,
            )
        except (asyncio.CancelledError, ServiceUnavailable):
            # Cut short (a shutdown), or our database away under it (not the
            # compensation failing): whoever finishes the cancel claims it again, this
            # drive too (a claim is one per lease), and runs it again. Were the release
            # lost, the next lease's claim still takes it.
            with contextlib.suppress(Exception):
                await asyncio.shield(store.release_compensation(row.tool_call_id, done=False))
            raise
        except Exception as exc:
            secrets = secret_values(spec, spec.stored_args(row.args))
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
        await _record_compensated(store, row.tool_call_id)
        done.append(row.tool_call_id)
    return done


RAN_UNRECORDED_MOST = 1024
_RAN_UNRECORDED: OrderedDict[str, None] = OrderedDict()
"""Compensations this process ran to their end and could not record as done: the next
drive of the run here records them rather than run them a second time. (Another
process's cannot know: it runs them again, under the call's idempotency key.)"""


async def _record_compensated(store: RunStore, tool_call_id: str) -> None:
    """Done, it must say so: the next drive's claim (a lease's own) would run it again,
    and a second pass of this drive would skip it and leave it off the outcome. So the
    write is shielded, tried again through a blip, and remembered if it still fails."""
    try:
        await asyncio.shield(
            with_retries(
                lambda: store.release_compensation(tool_call_id, done=True),
                lambda: time.monotonic() + WITHOUT_LEASE_S,
                f"the compensation of {tool_call_id}",
            )
        )
    except BaseException:
        _RAN_UNRECORDED[tool_call_id] = None
        while len(_RAN_UNRECORDED) > RAN_UNRECORDED_MOST:
            _RAN_UNRECORDED.popitem(last=False)
        raise
    _RAN_UNRECORDED.pop(tool_call_id, None)
