"""The adapter: graph progress → the six public states and their events.

It watches which node LangGraph starts (``tasks`` stream parts) and how the
graph stops (an interrupt, or an ``outcome`` in the state), and fires the
matching lifecycle triggers. Nodes it does not know change nothing, so a graph
can grow nodes without an API consumer noticing.
"""

from __future__ import annotations

import logging
from typing import Any

from runtime.errors import (
    CODES,
    Code,
    Recovery,
    RuntimeProblem,
    call_error,
    call_error_key,
    failure_error,
)
from runtime.events import EventType
from runtime.ids import handoff_key, proposed_calls
from runtime.lifecycle import TERMINAL, TRANSITIONS, State, Trigger, forward_trigger
from runtime.model import Outcome, PendingApproval, Run, ToolCall
from runtime.services import closed_as
from runtime.store.base import RunStore, readable_events

log = logging.getLogger(__name__)

NODE_STATES: dict[str, State] = {
    "planner": State.PLANNING,
    "guard": State.EXECUTING,
    "approval": State.EXECUTING,
    "executor": State.EXECUTING,
    "finish": State.EXECUTING,
    # Handing control to a sub-agent, or back, carries out a planner's decision.
    "handoff": State.EXECUTING,
    "handback": State.EXECUTING,
}


def failure_trigger(code: Code, current: State) -> Trigger:
    """The trigger a failure with ``code`` fires from ``current``."""
    declared = CODES[code].trigger
    if declared is not None and (current, declared) in TRANSITIONS:
        return declared
    return Trigger.PLAN_ERROR if current is State.PLANNING else Trigger.EXEC_ERROR


async def side_effects(store: RunStore, run_id: str) -> tuple[list[str], list[str]]:
    """(side-effecting tool calls that happened or may have, those compensated)."""
    return effects_of(await store.list_tool_calls(run_id))


def effects_of(rows: list[ToolCall]) -> tuple[list[str], list[str]]:
    """:func:`side_effects` of ledger ``rows``."""
    maybe = (Code.TOOL_UNAVAILABLE.value, Code.TOOL_FAILED.value)
    happened = [
        r.tool_call_id
        for r in rows
        if r.side_effect
        and (
            r.status in ("succeeded", "unknown")
            # Cut off by a cancel: it may have taken effect, unless reconcile said not.
            or (r.status == "cancelled" and (r.error or {}).get("took_effect") is not False)
            # A handler that started and then failed may have done its effect first
            # (unless reconcile, asked with the call cut off, said not).
            or (
                r.status == "failed"
                and r.attempts > 0
                and (r.error or {}).get("code") in maybe
                and (r.error or {}).get("took_effect") is not False
            )
        )
    ]
    return happened, [r.tool_call_id for r in rows if r.compensated]


async def open_handoff_results(
    store: RunStore, run_id: str, code: Code, message: str
) -> list[tuple[EventType, dict[str, Any]]]:
    """A run ending inside a sub-agent: the ``result`` of each handoff still open, as a
    tool call left running gets one, so that no ``action`` of the log stays unanswered.
    Written with the terminal state change: were that to fail, the run goes on, and
    its sub-agent's own handback must still be the one answer."""
    opened: dict[str, dict[str, Any]] = {}
    async for event in readable_events(store, run_id, 0):
        if not _handoff_move(event.data):
            continue
        if event.type == EventType.ACTION:
            opened[event.data["tool_call_id"]] = event.data
        elif event.type == EventType.RESULT:
            opened.pop(event.data["tool_call_id"], None)
    # A handback that no longer validates is not read above, but answered all the same:
    # a second answer would return from the sub-agent twice.
    answered = await store.keyed_events(run_id, [handoff_key(hid, "return") for hid in opened])
    results: list[tuple[EventType, dict[str, Any]]] = []
    for hid, action in reversed(opened.items()):  # the innermost first, as they unwind
        if handoff_key(hid, "return") in answered:
            continue
        start = action["handoff"]
        results.append(
            (
                EventType.RESULT,
                {
                    "tool_call_id": hid,
                    "tool": action["tool"],
                    "status": "cancelled" if code is Code.RUN_CANCELLED else "failed",
                    "output": None,
                    "artifact_id": None,
                    "error": {"code": code, "message": message},
                    "handoff": {
                        "phase": "return",
                        "from_agent": start["to_agent"],
                        "to_agent": start["from_agent"],
                        "step_index": start["step_index"],
                        "depth": start["depth"],
                        "artifacts": [],
                    },
                },
            )
        )
    return results


async def unexplained_calls(
    store: RunStore, run_id: str, rows: list[ToolCall], named: str | None, code: Code
) -> list[tuple[EventType, dict[str, Any]]]:
    """A run ending in the middle of a step (a cancel while a call waits for its
    approval, or after it was approved): a ``CALL_NOT_RUN`` error for each call the
    step proposed that never reached the ledger and nothing else explains (a refusal,
    a not-run of the node's own, a rejection, ``named``: the call the failure names),
    so that nothing proposed or approved disappears unexplained."""
    step_index = await store.count_steps(run_id) - 1
    step = await store.get_step(run_id, step_index) if step_index >= 0 else None
    if step is None or not step.decision.tool_calls or step.decision.kind != "tool_calls":
        return []  # a finish's or a handoff's calls were said not to run as it was decided
    # A human's rejection says itself why its call did not run (approval_result).
    rejected = await store.list_approvals(run_id=run_id, status="rejected", limit=1000)
    explained = {r.tool_call_id for r in rows} | {a.tool_call_id for a in rejected} | {named}
    calls = [
        c
        for c in proposed_calls(run_id, step_index, step.decision)
        if c["tool_call_id"] not in explained
    ]
    told = await store.keyed_events(run_id, [call_error_key(c["tool_call_id"]) for c in calls])
    message = f"not run: the run ended ({code.value})"
    return [
        (EventType.ERROR, call_error(Code.CALL_NOT_RUN, c, step_index, message, Recovery.NONE))
        for c in calls
        if call_error_key(c["tool_call_id"]) not in told
    ]


def _handoff_move(data: dict[str, Any]) -> bool:
    """``data`` is a handoff's ``action`` or ``result``, whole: one a hand edit left
    without what the answer is made of is passed over, not a failure made unrecordable."""
    move = data.get("handoff")
    return (
        isinstance(move, dict)
        and {"tool_call_id", "tool"} <= data.keys()
        and {"from_agent", "to_agent", "step_index", "depth"} <= move.keys()
    )


async def fail_run(
    store: RunStore,
    run_id: str,
    code: Code,
    message: str,
    *,
    compensations: list[str] | None = None,
    tool_call_id: str | None = None,
    usage: dict[str, Any] | None = None,
) -> Run | None:
    """End a run as failed with ``code``: error event, outcome with side effects, state event.

    ``tool_call_id``: the call that stopped the run, named in its error event; ``usage``:
    the run's final usage, where the stored one is behind (a cut-off drive's).

    The lease holder is not alone in moving a run: a human's approval moves it from
    waiting_human to executing whoever holds it. A decision that lands between the read
    here and the write is read again and the failure fired from where the run now is.
    """
    for attempt in range(1, STATE_RACES + 1):
        try:
            return await _fail_run(store, run_id, code, message, compensations, tool_call_id, usage)
        except RuntimeProblem as exc:
            if exc.code is not Code.RUN_STATE_CONFLICT or attempt == STATE_RACES:
                raise
            log.info("run %s changed state while failing it (%s); reading it again", run_id, exc)
    raise AssertionError("unreachable")


STATE_RACES = 3
"""Tries of a failure's state change: a run moves without its lease only once (a
human's approval of the question it is parked on)."""


async def _fail_run(
    store: RunStore,
    run_id: str,
    code: Code,
    message: str,
    compensations: list[str] | None,
    tool_call_id: str | None,
    usage: dict[str, Any] | None,
) -> Run | None:
    run = await store.get_run(run_id)
    if run is None or run.state in TERMINAL:
        return run
    unanswered = await open_handoff_results(store, run_id, code, message)
    # Its calls left running are closed with the failure, in its transaction: the
    # outcome counts them as they will be (only the lease holder writes the ledger).
    closing = closed_as(code)
    why = {"code": code.value, "message": message}
    rows = [
        r.model_copy(update={"status": closing, "error": why}) if r.status == "running" else r
        for r in await store.list_tool_calls(run_id)
    ]
    happened, compensated = effects_of(rows)
    not_run = await unexplained_calls(store, run_id, rows, tool_call_id, code)
    outcome = Outcome(
        status="failed",
        code=code,
        message=message,
        side_effects=happened,
        compensations=compensations if compensations is not None else compensated,
        artifacts=await store.artifacts_of_run(run_id),  # its partial results (DESIGN §8)
    )
    error = failure_error(code, message, compensated=bool(outcome.compensations))
    if tool_call_id is not None:
        error["tool_call_id"] = tool_call_id
    progress: dict[str, Any] = {} if usage is None else {"usage": usage}
    # One transaction (RunStore.end_failed): what the failure closes, its approvals
    # expired above all, must not outlast a state change that did not happen.
    await store.end_failed(
        run_id,
        lambda now: failure_trigger(code, now),
        expect=run.state,
        code=code,
        calls=(closing, why),
        events=[*unanswered, *not_run, (EventType.ERROR, error)],
        fields={"outcome": outcome, "pending_approval": None, **progress},
    )
    # As it ended: failed here, or by whatever else ended it meanwhile.
    return await store.get_run(run_id)


class Adapter:
    def __init__(self, store: RunStore, run: Run, node_states: dict[str, State] = NODE_STATES):
        self.store = store
        self.run_id = run.run_id
        self.state = run.state
        self.node_states = node_states
        self.values: dict[str, Any] = {}

    def _progress(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if "step_index" in self.values:
            fields["step_index"] = self.values["step_index"]
        if "usage" in self.values:
            fields["usage"] = self.values["usage"]
        return fields

    async def on_values(self, values: dict[str, Any]) -> None:
        self.values = values

    async def on_task_start(self, node: str) -> None:
        target = self.node_states.get(node)
        if target is None or target is self.state:
            return
        trigger = forward_trigger(self.state, target)
        # Only a human's decision fires `approved`: an approval's compare-and-set, or
        # calls a human approved running after a later decision of the same step sent
        # the run back to waiting_human without moving it (unknown outcomes are decided
        # each alone: "run A again", then "not B"). The approval node replaying on
        # resume, after a rejection too, fires nothing.
        if trigger is None or (trigger is Trigger.APPROVED and node != "executor"):
            return
        # Written with the node's first write (see runtime.store.journal), where the
        # store view is a drive's; at once otherwise.
        deferred = self.store.defer_transition(
            self.run_id, trigger, expect=self.state, to=target, **self._progress()
        )
        if deferred is None:
            run = await self.store.transition(
                self.run_id, trigger, expect=self.state, to=target, **self._progress()
            )
            deferred = run.state
        self.state = deferred

    async def on_stop(self, values: dict[str, Any], interrupts: list[Any]) -> Run | None:
        """Map how the graph stopped onto the lifecycle.

        Returns None for an interrupt whose approval was decided meanwhile: the
        caller resumes the graph instead of parking the run.
        """
        self.values = values or self.values
        if interrupts:
            request = interrupts[0]
            pending = PendingApproval(
                approval_id=request["approval_id"],
                tool_call_id=request["tool_call_id"],
                tool=request["tool"],
                reason=request.get("reason", ""),
                awaiting=request.get("awaiting"),
            )
            if self.state is State.PLANNING:
                # A graph that interrupts straight from planning still reads as executing first.
                await self.on_task_start("executor")
            parked = await self.store.park(
                self.run_id,
                pending.approval_id,
                self.state,
                pending_approval=pending,
                **self._progress(),
            )
            if parked is not None:
                self.state = parked.state
            return parked
        outcome = self.values.get("outcome")
        if outcome and outcome.get("status") == "succeeded":
            if self.state is State.PLANNING:
                await self.on_task_start("finish")
            happened, compensated = await side_effects(self.store, self.run_id)
            run = await self.store.transition(
                self.run_id,
                Trigger.DONE,
                expect=self.state,
                result=self.values.get("result"),
                pending_approval=None,
                outcome=Outcome(
                    status="succeeded", side_effects=happened, compensations=compensated
                ),
                **self._progress(),
            )
            self.state = run.state
            return run
        call_id: str | None = None
        if outcome:
            code, message = Code(outcome["code"]), outcome.get("message", "")
            call_id = outcome.get("tool_call_id")
        else:
            code, message = Code.INTERNAL_ERROR, "the graph ended without an outcome"
        await self.store.update_run(self.run_id, **self._progress())
        failed_run = await fail_run(self.store, self.run_id, code, message, tool_call_id=call_id)
        if failed_run is not None:
            self.state = failed_run.state
        return failed_run
