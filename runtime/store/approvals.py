"""Approvals: one row per human decision, decided by compare-and-set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.lifecycle import State, Trigger
from runtime.model import Approval, ApprovalDecision, UnreadableApproval
from runtime.store.codec import _dec, _ts
from runtime.store.core import WORK_CHANNEL, StoreCore
from runtime.store.paging import keyset_page
from runtime.store.records import ShownApproval, shown
from runtime.store.tx import Row


class ApprovalQueries(StoreCore):
    """Approval rows and their decisions."""

    # -- approvals ------------------------------------------------------------

    async def ensure_approval(self, approval: Approval, request: dict[str, Any]) -> Approval:
        """Create the approval with its approval_request event, unless it exists already."""
        # The node replays on resume: the row is there then, and one read says so. Only
        # the lease holder creates a run's approvals, so nobody inserts it in between.
        existing = await self.get_approval(approval.approval_id)
        if existing is not None:
            return existing
        async with self.tx() as tx:
            row = await self._insert_once(
                tx, "approvals", "approval_id", approval.model_dump(mode="json"), returning="*"
            )
            if row is not None:
                await self._append(tx, approval.run_id, EventType.APPROVAL_REQUEST, request)
            else:
                row = await tx.fetchone(
                    "SELECT * FROM approvals WHERE approval_id = ?", (approval.approval_id,)
                )
        assert row is not None
        return Approval.model_validate(_dec(row))

    async def get_approval(self, approval_id: str) -> Approval | None:
        row = await self._approval_row(approval_id)
        return Approval.model_validate(_dec(row)) if row else None

    async def shown_approval(self, approval_id: str) -> ShownApproval | None:
        """The approval, or its unreadable form where its row no longer validates."""
        row = await self._approval_row(approval_id)
        return shown([row], Approval, UnreadableApproval)[0] if row else None

    async def _approval_row(self, approval_id: str) -> Row | None:
        async with self.read(runs=False) as tx:
            return await tx.fetchone(
                "SELECT * FROM approvals WHERE approval_id = ?", (approval_id,)
            )

    async def list_approvals(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        tenant_id: str | None = None,
        limit: int = 100,
    ) -> list[Approval]:
        """Oldest first, as the inbox pages them."""
        statuses = [status] if status else []
        rows, _ = await self._approval_rows(statuses, run_id, tenant_id, limit, None)
        return [Approval.model_validate(_dec(r)) for r in rows]

    async def page_approvals(
        self,
        *,
        statuses: Sequence[str] = (),
        run_id: str | None = None,
        tenant_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[ShownApproval], str | None]:
        """An inbox's page, oldest first (it is worked through from its oldest), each row
        that no longer validates in its unreadable form (one must not make the page a
        500); the cursor of the next page, None on the last one. ``statuses``: approvals
        in any of them (none: in any). Pending approvals are those a human may still
        decide: not those of a run whose cancel was accepted."""
        rows, next_cursor = await self._approval_rows(
            statuses, run_id, tenant_id, limit, cursor, decidable="pending" in statuses
        )
        return shown(rows, Approval, UnreadableApproval), next_cursor

    async def _approval_rows(
        self,
        statuses: Sequence[str],
        run_id: str | None,
        tenant_id: str | None,
        limit: int,
        cursor: str | None,
        *,
        decidable: bool = False,
    ) -> tuple[list[Row], str | None]:
        """``decidable``: leave out the approvals of runs whose cancel was accepted
        (they take no decision, 409): for the inbox. A run's own check of what is still
        open (the finish node's) must see them."""
        where, params = ["1 = 1"], []
        if tenant_id is not None:
            # Each approval's run by key: SQLite read every run of the tenant for an IN.
            where.append(
                "EXISTS (SELECT 1 FROM runs WHERE runs.run_id = approvals.run_id "
                "AND runs.tenant_id = ?)"
            )
            params.append(tenant_id)
        if decidable:
            # Not offered while the cancel waits for a worker to expire them.
            where.append(
                "(status <> 'pending' OR NOT EXISTS (SELECT 1 FROM runs "
                "WHERE runs.run_id = approvals.run_id AND runs.cancel_requested IS NOT NULL))"
            )
        if run_id:
            where.append("run_id = ?")
            params.append(run_id)
        return await keyset_page(
            self,
            "approvals",
            where,
            params,
            ("created_at", "approval_id"),
            limit=limit,
            cursor=cursor,
            runs=False,
            any_of=[("status", sorted(set(statuses)))],
        )

    async def decide_approval(
        self,
        approval_id: str,
        decision: ApprovalDecision,
        *,
        decided_by: str,
        comment: str | None,
        via: str | None = None,
        run_id: str | None = None,
    ) -> tuple[Approval, bool]:
        """Compare-and-set a pending approval to ``decision``; returns (row, won).

        ``run_id``: the run the caller means; an approval of another run is not found.

        Only the winner gets ``won``. In the same transaction an approval moves a
        parked run back to executing, and an approve or reject asks for a worker to
        resume the run (a run still on its way to waiting_human picks the decision
        up itself when it parks).
        """
        async with self.tx() as tx:
            # The approval first, then the run, whoever calls: on the inner connection,
            # as a fenced caller's first locking read would lock the run row first (its
            # fence) and could deadlock with a human's decision. The fence is still
            # checked before the first write.
            row = await tx.inner.fetchone(
                f"SELECT * FROM approvals WHERE approval_id = ?{self.for_update}", (approval_id,)
            )
            if row is None or (run_id is not None and row["run_id"] != run_id):
                raise RuntimeProblem(Code.APPROVAL_NOT_FOUND, f"approval {approval_id} not found")
            won = row["status"] == "pending"
            if won:
                run = None
                if decision != "expired":
                    run = await tx.fetchone(
                        "SELECT state, cancel_requested FROM runs "
                        f"WHERE run_id = ?{self.for_update}",
                        (row["run_id"],),
                    )
                    if run is not None and run["cancel_requested"] is not None:
                        # Accepted while no worker was there to carry it out: a decision
                        # now would say the run resumes, and it never will.
                        raise RuntimeProblem(
                            Code.RUN_STATE_CONFLICT,
                            f"run {row['run_id']} is being cancelled: its approvals are not"
                            " decided any more",
                        )
                now = _ts()
                decided = await tx.fetchone(
                    "UPDATE approvals SET status = ?, decided_by = ?, comment = ?, "
                    "decided_at = ? WHERE approval_id = ? AND status = 'pending' RETURNING *",
                    (decision, decided_by, comment, now, approval_id),
                )
                await self._append(
                    tx,
                    row["run_id"],
                    EventType.APPROVAL_RESULT,
                    {
                        "approval_id": approval_id,
                        "tool_call_id": row["tool_call_id"],
                        "decision": decision,
                        "decided_by": decided_by,
                        "comment": comment,
                        **({"via": via} if via else {}),
                    },
                )
                if run is not None and run["state"] == State.WAITING_HUMAN.value:
                    fields: dict[str, Any] = {"needs_drive": 1}
                    if decision == "approved":
                        await self._transition(
                            tx,
                            row["run_id"],
                            Trigger.APPROVED,
                            State.WAITING_HUMAN,
                            (),
                            {**fields, "pending_approval": None},
                        )
                    else:
                        await self._update_run(tx, row["run_id"], **fields)
                    await self._announce(tx, WORK_CHANNEL, row["run_id"])
                row = decided  # locked above: the update cannot have missed
        assert row is not None
        return Approval.model_validate(_dec(row)), won
