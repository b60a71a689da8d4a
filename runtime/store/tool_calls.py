"""The tool-call ledger's rows: begin, claim, finish, close, compensate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.model import ToolCall
from runtime.services import close_call, closed_as
from runtime.store.codec import _dec, _enc_col, _ts
from runtime.store.core import StoreCore
from runtime.store.records import tool_call_rows


class ToolCallQueries(StoreCore):
    """The ledger: the truth about side effects (DESIGN §7)."""

    # -- the tool-call ledger -------------------------------------------------

    async def get_tool_call(self, tool_call_id: str) -> ToolCall | None:
        async with self.read(runs=False) as tx:
            row = await tx.fetchone(
                "SELECT * FROM tool_calls WHERE tool_call_id = ?", (tool_call_id,)
            )
        return ToolCall.model_validate(_dec(row)) if row else None

    async def begin_tool_call(self, call: ToolCall, action: dict[str, Any]) -> ToolCall:
        """Record that a call is about to run (status running), with its action event.

        If the row exists already, nothing is written and the existing row is returned:
        the caller must look at its status before executing anything.
        """
        async with self.tx() as tx:
            if await self._insert_once(
                tx, "tool_calls", "tool_call_id", call.model_dump(mode="json")
            ):
                await self._append(tx, call.run_id, EventType.ACTION, action)
            row = await tx.fetchone(
                "SELECT * FROM tool_calls WHERE tool_call_id = ?", (call.tool_call_id,)
            )
        assert row is not None
        return ToolCall.model_validate(_dec(row))

    async def start_tool_call(
        self, call: ToolCall, action: dict[str, Any]
    ) -> tuple[ToolCall, bool]:
        """:meth:`begin_tool_call` and :meth:`claim_tool_call` in one transaction.

        A new row is inserted with its first attempt already counted, with its
        action event: the insert is the compare-and-set (only one driver can insert
        a key), and the commit makes the claim durable before the handler starts.
        Returns (row, True) then; (existing row, False) if the row was there, and
        the caller goes through the checks and the claim of an existing row.
        """
        values = {**call.model_dump(mode="json"), "attempts": call.attempts + 1}
        cols = list(values)
        async with self.tx() as tx:
            row = await tx.fetchone(
                f"INSERT INTO tool_calls ({', '.join(cols)}) "
                f"VALUES ({', '.join('?' for _ in cols)}) ON CONFLICT DO NOTHING RETURNING *",
                [_enc_col(c, values[c]) for c in cols],
            )
            claimed = row is not None
            if claimed:
                await self._append(tx, call.run_id, EventType.ACTION, action)
            else:
                row = await tx.fetchone(
                    "SELECT * FROM tool_calls WHERE tool_call_id = ?", (call.tool_call_id,)
                )
        assert row is not None
        return ToolCall.model_validate(_dec(row)), claimed

    async def update_tool_call(
        self,
        tool_call_id: str,
        *,
        result: dict[str, Any] | None = None,
        from_status: Sequence[str] = ("running",),
        action: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ToolCall:
        """Move a ledger row on (compare-and-set on its status), with its result event,
        or with an action event (a call run again)."""
        fields["updated_at"] = _ts()
        sets = ", ".join(f"{k} = ?" for k in fields)
        statuses = ", ".join("?" for _ in from_status)
        async with self.tx() as tx:
            row = await tx.fetchone(
                f"UPDATE tool_calls SET {sets} WHERE tool_call_id = ? "
                f"AND status IN ({statuses}) RETURNING *",
                [*(_enc_col(k, v) for k, v in fields.items()), tool_call_id, *from_status],
            )
            if row is not None and action is not None:
                await self._append(tx, row["run_id"], EventType.ACTION, action)
            if row is not None and result is not None:
                await self._append(tx, row["run_id"], EventType.RESULT, result)
        if row is None:
            current = await self.get_tool_call(tool_call_id)
            if current is None:
                raise RuntimeProblem(Code.NOT_FOUND, f"tool call {tool_call_id} not found")
            return current
        return ToolCall.model_validate(_dec(row))

    async def claim_tool_call(
        self,
        tool_call_id: str,
        seen_attempts: int,
        action: dict[str, Any] | None = None,
        retried: Sequence[dict[str, Any]] | None = None,
    ) -> ToolCall | None:
        """Count one more attempt if nobody else did since ``seen_attempts``; None if lost.

        The compare-and-set makes two drivers that both found the row running
        agree on which one of them executes it. ``action``: the event saying the call
        runs again, written with the claim; ``retried``: the row's list of attempts
        without an outcome, as it is to be from now on (None: as it is).
        """
        sets, params = "attempts = attempts + 1, updated_at = ?", [_ts()]
        if retried is not None:
            sets += ", retried = ?"
            params.append(_enc_col("retried", list(retried)))
        async with self.tx() as tx:
            row = await tx.fetchone(
                f"UPDATE tool_calls SET {sets} "
                "WHERE tool_call_id = ? AND attempts = ? AND status = 'running' RETURNING *",
                (*params, tool_call_id, seen_attempts),
            )
            if row is not None and action is not None:
                await self._append(tx, row["run_id"], EventType.ACTION, action)
        return ToolCall.model_validate(_dec(row)) if row else None

    async def interrupt_running_calls(self, run_id: str, code: Code, message: str) -> None:
        """Close the ledger rows a stopped run leaves ``running`` (see :func:`closed_as`)."""
        status = closed_as(code)
        for row in await self.list_tool_calls(run_id):
            if row.status == "running":
                error = {"code": code, "message": message}
                await close_call(self, row, status=status, error=error)

    async def claim_compensation(self, tool_call_id: str) -> bool:
        """True for exactly one caller: it alone runs the call's compensation.

        The claim holds the lease version of the drive that made it (1 off a drive): a
        drive that takes the run over from one that died mid-compensation claims it
        again, and the compensation runs again (with the call's idempotency key), rather
        than being skipped for good with nothing on the record."""
        version = self._fence[1] if self._fence is not None else 1
        async with self.tx() as tx:
            got = await tx.fetchone(
                "UPDATE tool_calls SET compensation_claimed = ? WHERE tool_call_id = ? "
                "AND compensation_claimed < ? AND compensated = 0 RETURNING tool_call_id",
                (version, tool_call_id, version),
            )
        return got is not None

    async def release_compensation(self, tool_call_id: str, *, done: bool) -> None:
        async with self.tx() as tx:
            await tx.execute(
                "UPDATE tool_calls SET compensation_claimed = ?, compensated = ?, updated_at = ? "
                "WHERE tool_call_id = ?",
                (int(done), int(done), _ts(), tool_call_id),
            )

    async def list_tool_calls(self, run_id: str) -> list[ToolCall]:
        async with self.read(runs=False) as tx:
            return await tool_call_rows(tx, run_id)
