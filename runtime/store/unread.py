"""Ending a run as failed in one transaction: what its failure closes (its running
calls, its pending approvals) with the state change; and the last resort of a run whose
failure cannot be recorded, ended so without reading the rows that no longer validate."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from runtime.errors import Code, RuntimeProblem, failure_error
from runtime.events import EventType, result_data
from runtime.lifecycle import TERMINAL, TRANSITIONS, State, Trigger
from runtime.model import Outcome
from runtime.store.artifacts import artifacts_made
from runtime.store.codec import _dec, _enc_col, _ts
from runtime.store.core import StoreCore
from runtime.store.tx import Row

log = logging.getLogger(__name__)


class _Ended(Exception):
    """Raised inside a transaction to roll it back: the run has ended already."""


class UnreadFailures(StoreCore):
    """Failing a run in one transaction, read or unread."""

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
        try:
            async with self.read() as tx:
                made = await artifacts_made(tx, run_id)
        except Exception:  # the last resort: what its log says of them is no reason to stop
            log.warning("the artifacts of %s could not be listed", run_id, exc_info=True)
            made = []
        outcome = Outcome(
            status="failed",
            code=code,
            message=message,
            side_effects=happened,
            compensations=compensated,
            artifacts=made,
        )
        error = failure_error(code, message, compensated=bool(compensated))
        unread_error = {
            "code": Code.TOOL_OUTCOME_UNKNOWN.value,
            "message": f"the run ended ({code}) while the call ran: it may have happened",
        }
        return await self.end_failed(
            run_id,
            trigger_for,
            expect=None,
            code=code,
            calls=("unknown", unread_error),
            events=[(EventType.ERROR, error)],
            fields={"outcome": outcome, "pending_approval": None},
        )

    async def end_failed(
        self,
        run_id: str,
        trigger_for: Callable[[State], Trigger],
        *,
        expect: State | None,
        code: Code,
        calls: tuple[str, dict[str, Any]],
        events: Sequence[tuple[EventType, dict[str, Any]]],
        fields: dict[str, Any],
    ) -> bool:
        """End the run as failed, in one transaction under the view's lease fence: its
        calls left ``running`` closed (``calls``: their status and error), each with its
        ``result`` event; its pending approvals expired (as the run ended with ``code``),
        each with its ``approval_result`` event; then ``events`` and the state event to failed
        (``trigger_for``: the trigger from the state the run is in), with ``fields``.
        False if the run had ended already; RUN_STATE_CONFLICT if it is not in ``expect``.

        One transaction, because what it closes is read by a graph that goes on: were
        the approvals expired and the state change then lost (a database blip, a worker
        killed), the drive that retries resumes the graph, which reads an expired
        approval as a human's rejection (a call closed, as having run), and goes on.
        """
        status, error = calls
        comment = f"run ended: {code}"
        # Written first, on their own: a transaction carrying them would lock the run
        # row before the approvals, the order decide_approval takes them in reverse.
        await self.flush()
        try:
            async with self.tx() as tx:
                # The approvals first, as decide_approval locks them, and on the inner
                # connection: through ``tx`` the fence would lock the run row first (see
                # park). The fence is checked by the run's lock below, before the commit.
                expired = await tx.inner.fetchall(
                    "UPDATE approvals SET status = 'expired', decided_by = 'runtime', "
                    "comment = ?, decided_at = ? WHERE run_id = ? AND status = 'pending' "
                    "RETURNING approval_id, tool_call_id, created_at",
                    (comment, _ts(), run_id),
                )
                row = await self._lock_run(tx, run_id, "state")
                if row is None:
                    raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")
                # After the run's lock, as every fenced ledger write takes them: before it,
                # a worker that lost the lease would hold the calls the new holder's write
                # of an outcome waits for, while waiting for the run row that write holds
                # (a deadlock, whose victim was the holder's outcome). Left running, the
                # next reader would take a call of an ended run as one still under way.
                closed = await tx.inner.fetchall(
                    "UPDATE tool_calls SET status = ?, error = ?, updated_at = ? "
                    "WHERE run_id = ? AND status = 'running' "
                    "RETURNING tool_call_id, tool, artifact_id, step_index, call_index, retried",
                    (status, _enc_col("error", error), _ts(), run_id),
                )
                current = State(row["state"])
                if current in TERMINAL:
                    raise _Ended  # undoes the two updates: whatever ended it closed them
                if expect is not None and current is not expect:
                    raise RuntimeProblem(
                        Code.RUN_STATE_CONFLICT, f"run is {current.value}, not {expect.value}"
                    )
                trigger = trigger_for(current)
                if (current, trigger) not in TRANSITIONS:
                    # Only a run that never started lacks the trigger (pending has no
                    # plan_error): it passes through planning, as every run does.
                    await self._transition(tx, run_id, Trigger.START, current, (), {})
                    current = State.PLANNING
                    trigger = trigger_for(current)
                # The calls' results, then the approvals', then the failure's own.
                results = [*_results(closed, status, error), *_expired(expired, comment)]
                await self._transition(
                    tx,
                    run_id,
                    trigger,
                    current,
                    [*results, *events],
                    fields,
                    to=State.FAILED,
                )
        except _Ended:
            return False
        return True

    async def keyed_events(self, run_id: str, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` an event of the run holds as its dedupe key, read or not: an
        answer in the log that no longer validates is still an answer."""
        if not keys:
            return set()
        marks = ", ".join("?" for _ in keys)
        async with self.read() as tx:
            rows = await tx.fetchall(
                f"SELECT dedupe_key FROM events WHERE run_id = ? AND dedupe_key IN ({marks})",
                (run_id, *keys),
            )
        return {str(r["dedupe_key"]) for r in rows}

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


def _results(
    closed: list[Row], status: str, error: dict[str, Any]
) -> list[tuple[EventType, dict[str, Any]]]:
    """The ``result`` events of calls closed ``status`` (see ``result_event``: a call
    left running has no output), in the ledger's order (RETURNING has none)."""
    results: list[tuple[EventType, dict[str, Any]]] = []
    for c in sorted(closed, key=lambda c: (c["step_index"], c["call_index"])):
        retried = _dec({"retried": c.get("retried")})["retried"]
        retried = retried if isinstance(retried, list) else []
        data = result_data(
            c["tool_call_id"], c["tool"], status, None, c["artifact_id"], error, retried
        )
        results.append((EventType.RESULT, data))
    return results


def _expired(expired: list[Row], comment: str) -> list[tuple[EventType, dict[str, Any]]]:
    """The ``approval_result`` events of approvals expired, oldest first."""
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
        for a in sorted(expired, key=lambda a: (str(a["created_at"]), a["approval_id"]))
    ]
