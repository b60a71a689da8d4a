"""The last resort of a run whose failure cannot be recorded: ended without reading
the rows that no longer validate."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from runtime.errors import CODES, Code, Recovery, RuntimeProblem
from runtime.events import EventType
from runtime.lifecycle import TERMINAL, TRANSITIONS, State, Trigger
from runtime.model import Outcome
from runtime.store.core import StoreCore, _enc_col, _ts

log = logging.getLogger(__name__)


class _Ended(Exception):
    """Raised inside a transaction to roll it back: the run has ended already."""


class UnreadFailures(StoreCore):
    """Failing a run unread."""

    async def fail_unread(
        self, run_id: str, code: Code, message: str, trigger_for: Callable[[State], Trigger]
    ) -> bool:
        """End the run as failed with ``code``, reading none of its rows that a model
        validates: the last resort where :func:`runtime.adapter.fail_run` itself fails
        (a ledger row, an approval or an event whose stored value no longer validates).
        False if the run had ended already.

        It writes what ends the run and its streams, in one transaction under the
        view's lease fence: its pending approvals expired (with their approval_result
        events), an ``error`` event, the state event to failed (``trigger_for``: the
        trigger from the state the run is in), and an outcome whose ``side_effects``
        list every side-effecting call of the ledger as one that may have happened (by
        id alone, read as stored), its message saying so; where even those cannot be
        read, none, its message saying they are unknown. Calls left ``running`` are
        closed ``unknown`` (what the ledger says of a call that may have happened), by
        their stored status alone, each with its ``result`` event; a handoff left open
        gets no ``result`` (finding it means reading the events).
        """
        effects = await self._ledger_ids_unread(run_id)
        if effects is None:
            happened: list[str] = []
            compensated: list[str] = []
            message += "; its side effects are unknown: its tool calls could not be read"
        else:
            happened, compensated = effects
            message += "; its tool calls could not be read"
            if happened:
                message += ": every side-effecting call is listed as one that may have happened"
        outcome = Outcome(
            status="failed",
            code=code,
            message=message,
            side_effects=happened,
            compensations=compensated,
        )
        recovery = CODES[code].recovery
        if recovery is Recovery.COMPENSATE and not compensated:
            recovery = Recovery.NONE  # as fail_run: the event says what the runtime did
        error = {"code": code.value, "message": message, "recovery": recovery.value}
        comment = f"run ended: {code}"
        unread_error = {
            "code": Code.TOOL_OUTCOME_UNKNOWN.value,
            "message": f"the run ended ({code}) while the call ran: it may have happened",
        }
        try:
            async with self.tx() as tx:
                # The approvals first, as decide_approval locks them, and on the inner
                # connection: through ``tx`` the fence would lock the run row first (see
                # park). The fence is checked by the run's lock below, before the commit.
                expired = await tx.inner.fetchall(
                    "UPDATE approvals SET status = 'expired', decided_by = 'runtime', "
                    "comment = ?, decided_at = ? WHERE run_id = ? AND status = 'pending' "
                    "RETURNING approval_id, tool_call_id",
                    (comment, _ts(), run_id),
                )
                # The same way, and before the run's lock (as update_tool_call takes them):
                # left running, the next reader would take a call of an ended run as one
                # still under way.
                closed = await tx.inner.fetchall(
                    "UPDATE tool_calls SET status = 'unknown', error = ?, updated_at = ? "
                    "WHERE run_id = ? AND status = 'running' "
                    "RETURNING tool_call_id, tool, artifact_id",
                    (_enc_col("error", unread_error), _ts(), run_id),
                )
                row = await self._lock_run(tx, run_id, "state")
                if row is None:
                    raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")
                current = State(row["state"])
                if current in TERMINAL:
                    raise _Ended  # undoes the two updates: whatever ended it closed them
                trigger = trigger_for(current)
                if (current, trigger) not in TRANSITIONS:
                    # Only a run that never started (see fail_run): through planning.
                    await self._transition(tx, run_id, Trigger.START, current, (), {})
                    current = State.PLANNING
                    trigger = trigger_for(current)
                # As fail_run writes them: the calls' results, then the approvals'.
                results = [*_unknown_results(closed, unread_error), *_expired(expired, comment)]
                await self._transition(
                    tx,
                    run_id,
                    trigger,
                    current,
                    [*results, (EventType.ERROR, error)],
                    {"outcome": outcome, "pending_approval": None},
                    to=State.FAILED,
                )
        except _Ended:
            return False
        return True

    async def _ledger_ids_unread(self, run_id: str) -> tuple[list[str], list[str]] | None:
        """(the run's side-effecting calls, those compensated), by id as stored, no row
        validated; None where even that read fails."""
        try:
            async with self.read(runs=False) as tx:
                rows = await tx.fetchall(
                    "SELECT tool_call_id, compensated FROM tool_calls "
                    "WHERE run_id = ? AND side_effect = 1 ORDER BY created_at, tool_call_id",
                    (run_id,),
                )
            return (
                [str(r["tool_call_id"]) for r in rows],
                [str(r["tool_call_id"]) for r in rows if r["compensated"]],
            )
        except Exception:
            log.warning("could not read the ledger of %s to fail it", run_id, exc_info=True)
            return None


def _unknown_results(
    closed: list[dict[str, Any]], error: dict[str, Any]
) -> list[tuple[EventType, dict[str, Any]]]:
    """The ``result`` events of calls closed ``unknown`` unread (see ``result_event``)."""
    return [
        (
            EventType.RESULT,
            {
                "tool_call_id": c["tool_call_id"],
                "tool": c["tool"],
                "status": "unknown",
                "output": None,
                "artifact_id": c["artifact_id"],
                "error": error,
            },
        )
        for c in closed
    ]


def _expired(expired: list[dict[str, Any]], comment: str) -> list[tuple[EventType, dict[str, Any]]]:
    """The ``approval_result`` events of approvals expired unread."""
    return [
        (
            EventType.APPROVAL_RESULT,
            {
                "approval_id": a["approval_id"],
                "tool_call_id": a["tool_call_id"],
                "decision": "expired",
                "decided_by": "runtime",
                "comment": comment,
            },
        )
        for a in expired
    ]
