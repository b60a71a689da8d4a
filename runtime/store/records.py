"""A run's whole record as of one instant: what ``GET /runs/{id}/trace`` shows.

Read statement by statement while the run moves on, a trace could show a run still
``pending`` beside the events and step of its planning. (A run ``planning`` still
counts its steps one short of its list, at one instant too: a step is charged when
its plan is ready.) Here the run row, its steps, ledger and approvals come from
one read-only transaction, and the run's ``last_seq`` then bounds the log: events
are only ever appended, so those up to it are the same when read afterwards, page
by page (a long log is not held in one transaction), unless retention prunes the
whole run meanwhile: the trace then ends without closing its JSON.
"""

from __future__ import annotations

from typing import NamedTuple

from runtime.model import Approval, Run, Step, ToolCall
from runtime.store.core import StoreCore, Tx, _dec


class RunRecord(NamedTuple):
    run: Run
    last_seq: int
    """The seq of the run's last event at that instant."""
    steps: list[Step]
    tool_calls: list[ToolCall]
    approvals: list[Approval]


async def step_rows(tx: Tx, run_id: str) -> list[Step]:
    rows = await tx.fetchall("SELECT * FROM steps WHERE run_id = ? ORDER BY step_index", (run_id,))
    return [Step.model_validate(_dec(r)) for r in rows]


async def tool_call_rows(tx: Tx, run_id: str) -> list[ToolCall]:
    rows = await tx.fetchall(
        "SELECT * FROM tool_calls WHERE run_id = ? ORDER BY step_index, call_index", (run_id,)
    )
    return [ToolCall.model_validate(_dec(r)) for r in rows]


class RecordQueries(StoreCore):
    async def run_record(self, run_id: str) -> RunRecord | None:
        async with self.snapshot() as tx:
            row = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
            if row is None:
                return None
            approvals = await tx.fetchall(
                # The order of the approvals' pages (page_approvals).
                "SELECT * FROM approvals WHERE run_id = ? ORDER BY created_at, approval_id",
                (run_id,),
            )
            return RunRecord(
                run=Run.model_validate(_dec(row)),
                last_seq=int(row["last_seq"]),
                steps=await step_rows(tx, run_id),
                tool_calls=await tool_call_rows(tx, run_id),
                approvals=[Approval.model_validate(_dec(r)) for r in approvals],
            )
