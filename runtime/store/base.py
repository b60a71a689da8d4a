"""The run store: runs, steps, the tool-call ledger, approvals, artifacts and the event log.

One SQL implementation serves both dialects; :mod:`runtime.store.sqlite` and
:mod:`runtime.store.postgres` only supply connections and transactions. Every
change that an event describes is written in the same transaction as the event.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.lifecycle import TERMINAL, TRANSITIONS, State, Trigger
from runtime.model import (
    Event,
    Run,
    Step,
)
from runtime.store.api_keys import ApiKeyQueries
from runtime.store.approvals import ApprovalQueries
from runtime.store.artifacts import ArtifactQueries
from runtime.store.audit import AuditQueries
from runtime.store.codec import _dec, _enc, _enc_col, event_of
from runtime.store.core import CANCEL_CHANNEL, ENDED, WORK_CHANNEL, StoreCore
from runtime.store.leases import LeaseQueries
from runtime.store.paging import keyset_page
from runtime.store.records import RecordQueries, event_rows, log_pages, step_rows
from runtime.store.retention import RetentionQueries
from runtime.store.tool_calls import ToolCallQueries
from runtime.store.tx import LeaseLost, Row, Tx
from runtime.store.unread import UnreadFailures

RUN_COLUMNS = (
    "run_id",
    "agent_id",
    "tenant_id",
    "user_id",
    "input",
    "context",
    "options",
    "state",
    "step_index",
    "usage",
    "limits",
    "pending_approval",
    "result",
    "outcome",
    "idempotency_key",
    "request_hash",
    "created_at",
    "updated_at",
    "ended_at",
    "needs_drive",
)


__all__ = ["DriveStart", "LeaseLost", "Row", "RunStore", "Tx"]

log = logging.getLogger(__name__)


class DriveStart(NamedTuple):
    """What a drive reads before it starts."""

    run: Run
    cancel: tuple[str, bool] | None
    """The cancel request, if any: (reason, compensate)."""
    failures: int
    """Drives in a row before this one that ended on a database error."""
    taken_from: str | None = None
    """The worker whose lease this drive's replaced after it expired unreleased."""
    active_s: float = 0.0
    """The run's active seconds as a drive last reported them with a lease renewal."""
    takeovers: int = 0
    """Leases in a row, this drive's included, that expired unreleased with no step of
    the run checkpointed in between."""


class RunStore(
    ToolCallQueries,
    ApprovalQueries,
    ArtifactQueries,
    LeaseQueries,
    ApiKeyQueries,
    AuditQueries,
    RetentionQueries,
    RecordQueries,
    UnreadFailures,
    StoreCore,
):
    """Runs, steps and events here; the ledger, approvals, artifacts, leases, API keys,
    the audit trail, retention and a run's whole record mixed in."""

    # -- runs -----------------------------------------------------------------

    async def create_run(
        self, run: Run, request_hash: str, *, max_active: int | None = None
    ) -> tuple[Run, bool]:
        """Insert a run (and its first event), or return the one with the same idempotency key.

        Returns (run, created). A reused key with a different request hash raises
        IDEMPOTENCY_CONFLICT; a tenant with ``max_active`` runs pending, planning or
        executing already gets TENANT_RUN_LIMIT (a replayed key still finds its run).
        """
        async with self.tx() as tx:
            existing = await self._run_for_key(tx, run, request_hash)
            if existing is not None:
                return existing, False
            if max_active is not None:
                await self._lock_key(tx, f"tenant-runs:{run.context.tenant_id}")
                # A request with the same key may have committed its run while this one
                # waited for the lock: that run is the answer, not the cap it now fills.
                existing = await self._run_for_key(tx, run, request_hash)
                if existing is not None:
                    return existing, False
                await self._check_active(tx, run.context.tenant_id, max_active)
            values = run_row(run, request_hash)
            inserted = await tx.fetchone(
                f"INSERT INTO runs ({', '.join(values)}) "
                f"VALUES ({', '.join('?' for _ in values)}) ON CONFLICT DO NOTHING "
                "RETURNING run_id",
                [_enc_col(k, v) for k, v in values.items()],
            )
            if inserted is None:
                # A concurrent request with the same key committed first.
                existing = await self._run_for_key(tx, run, request_hash)
                assert existing is not None
                return existing, False
            await self._append(tx, run.run_id, EventType.STATE, created_event(run))
            await self._announce(tx, WORK_CHANNEL, run.run_id)
        return run, True

    async def _check_active(self, tx: Tx, tenant_id: str, max_active: int) -> None:
        """Under the tenant's lock, taken by the caller."""
        row = await tx.fetchone(
            "SELECT COUNT(*) AS n FROM runs WHERE tenant_id = ? AND state IN (?, ?, ?)",
            (tenant_id, *ACTIVE_STATES),
        )
        if row is not None and int(row["n"]) >= max_active:
            raise tenant_limit(max_active)

    async def run_for_key(self, run: Run, request_hash: str) -> Run | None:
        """The run created already with ``run``'s idempotency key, as :meth:`create_run`
        would find it; nothing is written."""
        async with self.read() as tx:
            return await self._run_for_key(tx, run, request_hash)

    async def _run_for_key(self, tx: Tx, run: Run, request_hash: str) -> Run | None:
        key = run.options.idempotency_key
        if key is None:
            return None
        existing = await tx.fetchone(
            "SELECT * FROM runs WHERE tenant_id = ? AND idempotency_key = ?",
            (run.context.tenant_id, key),
        )
        if existing is None:
            return None
        if existing["request_hash"] != request_hash:
            raise RuntimeProblem(
                Code.IDEMPOTENCY_CONFLICT,
                "idempotency key was used with a different request",
                run_id=existing["run_id"],
            )
        return Run.model_validate(_dec(existing))

    async def get_run(self, run_id: str) -> Run | None:
        async with self.read() as tx:
            row = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return Run.model_validate(_dec(row)) if row else None

    async def get_run_drive(self, run_id: str) -> tuple[Run, bool] | None:
        """The run and whether it needs driving, in one read (for waiters)."""
        async with self.read() as tx:
            row = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return (Run.model_validate(_dec(row)), bool(row["needs_drive"])) if row else None

    async def count_live_runs(self) -> dict[str, int]:
        """Runs in each state that is not final, in the whole database (by index)."""
        live = [s.value for s in State if s not in TERMINAL]
        marks = ", ".join("?" for _ in live)
        async with self.read() as tx:
            rows = await tx.fetchall(
                f"SELECT state, COUNT(*) AS n FROM runs WHERE state IN ({marks}) GROUP BY state",
                live,
            )
        counted = {str(r["state"]): int(r["n"]) for r in rows}
        return {state: counted.get(state, 0) for state in live}

    async def list_runs(
        self,
        *,
        states: Sequence[str] = (),
        agent_ids: Sequence[str] = (),
        tenant_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Run], str | None]:
        """``states``, ``agent_ids``: runs in any of them (none: any)."""
        where, params = ["1 = 1"], []
        if tenant_id is not None:
            where.append("tenant_id = ?")
            params.append(tenant_id)
        rows, next_cursor = await keyset_page(
            self,
            "runs",
            where,
            params,
            ("created_at", "run_id"),
            limit=limit,
            cursor=cursor,
            newest_first=True,
            any_of=[("state", sorted(set(states))), ("agent_id", sorted(set(agent_ids)))],
        )
        return [Run.model_validate(_dec(r)) for r in rows], next_cursor

    async def transition(
        self,
        run_id: str,
        trigger: Trigger,
        *,
        expect: State | None = None,
        events: Sequence[tuple[EventType, dict[str, Any]]] = (),
        to: State | None = None,
        **fields: Any,
    ) -> Run:
        """Fire ``trigger`` on the run through the lifecycle table, with its state event.

        ``events`` are appended before the state event, in the same transaction.
        ``fields`` (step_index, usage, pending_approval, result, outcome) are
        written with it. ``expect`` guards against a state that moved meanwhile;
        ``to`` names the target where the trigger may lead to more than one.
        """
        if expect is not None and (expect, trigger) in TRANSITIONS:
            done = await self._transition_at_once(run_id, trigger, expect, events, fields, to)
            if done is not None:
                return Run.model_validate(_dec(done))
        async with self.tx() as tx:
            updated = await self._transition(tx, run_id, trigger, expect, events, fields, to=to)
        return Run.model_validate(_dec(updated))

    async def park(self, run_id: str, approval_id: str, expect: State, **fields: Any) -> Run | None:
        """Move the run to waiting_human for ``approval_id``, unless it was decided already.

        Locks the approval row before the run row, in the same order as
        decide_approval, so a decision cannot slip between the check and the park
        and be lost. Returns None when the approval is decided: resume instead.
        """
        # A deferred state change would lock the run row first: written before, alone.
        await self.flush()
        async with self.tx() as tx:
            # On the inner connection: through ``tx`` the lock would first check the
            # lease fence, which locks the run row, and a decision (approval, then run)
            # would deadlock with us. The fence is checked before our first write.
            approval = await tx.inner.fetchone(
                f"SELECT status FROM approvals WHERE approval_id = ?{self.for_update}",
                (approval_id,),
            )
            if approval is not None and approval["status"] != "pending":
                return None
            current = await tx.fetchone("SELECT state FROM runs WHERE run_id = ?", (run_id,))
            if current is not None and current["state"] == State.WAITING_HUMAN.value:
                await self._update_run(tx, run_id, needs_drive=0, **fields)
            else:
                await self._transition(tx, run_id, Trigger.NEED_APPROVAL, expect, (), fields)
            # A cancel asked for while the drive went on (its notice lost, or swallowed
            # by the code it interrupted): the run is not to wait for a human but to end,
            # by the next drive.
            await tx.execute(
                "UPDATE runs SET needs_drive = 1 WHERE run_id = ? AND cancel_requested IS NOT NULL",
                (run_id,),
            )
            updated = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return Run.model_validate(_dec(updated)) if updated else None

    async def update_run(self, run_id: str, **fields: Any) -> None:
        """Write progress fields that are not a state change (step_index, usage…)."""
        async with self.tx() as tx:
            await self._update_run(tx, run_id, **fields)

    async def request_cancel(
        self, run_id: str, reason: str, compensate: bool, requested_by: str | None = None
    ) -> bool:
        """Record the intent durably and wake whoever holds (or will claim) the run;
        False if the run has ended (it ended after the caller looked: nothing to stop).

        A second cancel before the first is carried out keeps the first's reason and
        requester, and asks for compensation if either did (naming who added it); once
        the drive carrying it
        out has decided not to compensate (:meth:`seal_cancel`), asking for it is a
        conflict rather than a request accepted and never done."""
        intent = {"reason": reason, "compensate": compensate, "requested_by": requested_by}
        async with self.tx() as tx:
            row = await self._lock_run(tx, run_id, f"{ENDED} AS ended, cancel_requested")
            if row is None or row["ended"]:
                return False
            if row["cancel_requested"] is not None:
                first = json.loads(row["cancel_requested"])
                if first.get("sealed") and compensate and not first["compensate"]:
                    raise RuntimeProblem(
                        Code.RUN_STATE_CONFLICT,
                        "the run is being cancelled without compensation already",
                    )
                intent = {**first, "compensate": bool(first["compensate"]) or compensate}
                if compensate and not first["compensate"]:
                    intent["compensate_requested_by"] = requested_by
            # An unowned run backing off after a failed drive is claimable at once: the
            # cancel must not wait for the retry.
            await tx.execute(
                "UPDATE runs SET cancel_requested = ?, needs_drive = 1, lease_expires_at = "
                "CASE WHEN lease_owner IS NULL THEN NULL ELSE lease_expires_at END "
                "WHERE run_id = ?",
                (_enc(intent), run_id),
            )
            await self._announce(tx, CANCEL_CHANNEL, run_id)
            await self._announce(tx, WORK_CHANNEL, run_id)
        return True

    async def seal_cancel(self, run_id: str) -> tuple[str, bool] | None:
        """The cancel intent as the drive carrying it out decides on it: (reason,
        compensate), from now on fixed (see :meth:`request_cancel`)."""
        async with self.tx() as tx:
            row = await self._lock_run(tx, run_id, "cancel_requested")
            if row is None or row["cancel_requested"] is None:
                return None
            intent = {**json.loads(row["cancel_requested"]), "sealed": True}
            await tx.execute(
                "UPDATE runs SET cancel_requested = ? WHERE run_id = ?", (_enc(intent), run_id)
            )
        return _cancel_intent(_enc(intent))

    async def cancel_requested(self, run_id: str) -> tuple[str, bool] | None:
        """(reason, compensate) if a cancel was asked for; the reason names who asked."""
        async with self.read() as tx:
            row = await tx.fetchone("SELECT cancel_requested FROM runs WHERE run_id = ?", (run_id,))
        return _cancel_intent(row["cancel_requested"]) if row is not None else None

    async def get_run_to_drive(self, run_id: str) -> DriveStart | None:
        """The run, its cancel request and its failed drives in a row, in one read."""
        async with self.read() as tx:
            row = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if row is None:
            return None
        return DriveStart(
            Run.model_validate(_dec(row)),
            _cancel_intent(row["cancel_requested"]),
            int(row["drive_failures"]),
            row["taken_from"],
            float(row["active_s"]),
            int(row["takeovers"]),
        )

    async def append_event(
        self, run_id: str, type_: EventType, data: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None:
        async with self.tx() as tx:
            seq = await self._append(tx, run_id, type_, data, dedupe_key)
        return seq

    async def list_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        async with self.read() as tx:
            rows = await event_rows(tx, run_id, after, limit)
        return [event_of(r) for r in rows]

    # -- steps ----------------------------------------------------------------

    async def get_step(self, run_id: str, step_index: int) -> Step | None:
        async with self.read(runs=False) as tx:
            row = await tx.fetchone(
                "SELECT * FROM steps WHERE run_id = ? AND step_index = ?", (run_id, step_index)
            )
        return Step.model_validate({**_dec(row), "run_id": run_id}) if row else None

    async def count_steps(self, run_id: str) -> int:
        """One past the highest step the run has recorded (0: none)."""
        async with self.read(runs=False) as tx:
            row = await tx.fetchone(
                "SELECT MAX(step_index) AS last FROM steps WHERE run_id = ?", (run_id,)
            )
        last = (row or {}).get("last")
        return 0 if last is None else int(last) + 1

    async def record_step(self, step: Step) -> Step:
        """Insert the step's decision once; a replayed planner gets the first decision back."""
        async with self.tx() as tx:
            inserted = await tx.fetchone(
                "INSERT INTO steps (run_id, step_index, decision, started_at, ended_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING step_index",
                (
                    step.run_id,
                    step.step_index,
                    _enc(step.decision),
                    _enc(step.started_at),
                    _enc(step.ended_at),
                ),
            )
        if inserted is not None:
            return step
        stored = await self.get_step(step.run_id, step.step_index)
        assert stored is not None
        return stored

    async def list_steps(self, run_id: str) -> list[Step]:
        async with self.read() as tx:
            return await step_rows(tx, run_id)


ACTIVE_STATES = (State.PENDING.value, State.PLANNING.value, State.EXECUTING.value)
"""The states a tenant's cap on active runs counts (parked and ended runs are not)."""


def run_row(run: Run, request_hash: str) -> dict[str, Any]:
    """A new run's row, by column (values not yet encoded)."""
    dumped = run.model_dump(mode="json")
    return {
        **{c: dumped.get(c) for c in RUN_COLUMNS},
        "tenant_id": run.context.tenant_id,
        "user_id": run.context.user_id,
        "idempotency_key": run.options.idempotency_key,
        "request_hash": request_hash,
        "needs_drive": 1,
    }


def created_event(run: Run) -> dict[str, Any]:
    """The data of a run's first event."""
    return {"from": None, "to": run.state.value, "trigger": Trigger.CREATE.value}


def tenant_limit(max_active: int) -> RuntimeProblem:
    return RuntimeProblem(
        Code.TENANT_RUN_LIMIT,
        f"tenant has {max_active} active runs, the most it may have at once",
        retry_after=5,
    )


async def readable_events(store: RunStore, run_id: str, after: int) -> AsyncIterator[Event]:
    """The run's log after ``after``, but for events that no longer validate: what the
    runtime reads of it to end a run, which one such event must not make unrecordable
    (the audit surface shows it, marked)."""
    async for batch in log_pages(store.shown_events, run_id, after, 1000):
        for event in batch:
            if isinstance(event, Event):
                yield event


def _cancel_intent(stored: str | None) -> tuple[str, bool] | None:
    if stored is None:
        return None
    intent = json.loads(stored)
    by = intent.get("requested_by")
    reason = f"{intent['reason']} (requested by {by})" if by else str(intent["reason"])
    if "compensate_requested_by" in intent:  # a second cancel asked for compensation
        reason += (
            f"; compensation asked for by {intent['compensate_requested_by'] or 'another cancel'}"
        )
    return reason, bool(intent["compensate"])
