"""The run store: runs, steps, the tool-call ledger, approvals, artifacts and the event log.

One SQL implementation serves both dialects; :mod:`runtime.store.sqlite` and
:mod:`runtime.store.postgres` only supply connections and transactions. Every
change that an event describes is written in the same transaction as the event.
"""

from __future__ import annotations

import base64
import copy
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType, result_event
from runtime.lifecycle import State, Trigger, transition
from runtime.model import (
    Approval,
    ApprovalDecision,
    Artifact,
    Event,
    Run,
    Step,
    ToolCall,
    utcnow,
)
from runtime.store.leases import CANCEL_CHANNEL, EVENTS_CHANNEL, WORK_CHANNEL, LeaseQueries
from runtime.store.schema import MIGRATIONS

Row = dict[str, Any]
EventListener = Callable[[str, int], None]

_JSON_COLUMNS = {
    "context",
    "options",
    "usage",
    "limits",
    "pending_approval",
    "result",
    "outcome",
    "decision",
    "args",
    "output",
    "error",
    "data",
}
_RUN_COLUMNS = (
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


class Tx(Protocol):
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...
    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...


def _enc(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "model_dump"):
        return json.dumps(value.model_dump(mode="json"), ensure_ascii=False)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, bool):
        return int(value)
    return value


def _dec(row: Row) -> Row:
    return {
        k: (json.loads(v) if k in _JSON_COLUMNS and isinstance(v, str) else v)
        for k, v in row.items()
    }


def _iso(value: datetime) -> str:
    # The same shape pydantic writes, so stored timestamps sort as text.
    return value.isoformat().replace("+00:00", "Z")


def _ts() -> str:
    return _iso(utcnow())


def encode_cursor(*parts: str) -> str:
    return base64.urlsafe_b64encode("\x1f".join(parts).encode()).decode()


def decode_cursor(cursor: str, parts: int = 2) -> list[str]:
    try:
        decoded = base64.b64decode(cursor.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        decoded = ""
    fields = decoded.split("\x1f")
    if len(fields) != parts:
        raise RuntimeProblem(Code.VALIDATION_ERROR, "cursor is not valid")
    return fields


class LeaseLost(Exception):
    """This worker's lease on the run was taken over: it must stop writing to the run."""


class RunStore(LeaseQueries, ABC):
    """SQL shared by every dialect. Subclasses provide :meth:`_tx` and :meth:`close`."""

    dialect: str
    blob_type: str
    for_update: str = ""

    def __init__(self) -> None:
        self._listeners: list[EventListener] = []
        self._fence: tuple[str, int] | None = None

    # -- plumbing -------------------------------------------------------------

    @abstractmethod
    def _tx(self) -> AbstractAsyncContextManager[Tx]:
        """A transaction that commits on success and rolls back on error."""

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[Tx]:
        async with self._tx() as tx:
            if self._fence is not None:
                await self._check_fence(tx, *self._fence)
            yield tx

    def fenced(self, run_id: str, lease_version: int) -> RunStore:
        """A view of this store whose every transaction first checks the run's lease.

        A worker that lost its lease (paused, partitioned) gets :class:`LeaseLost`
        instead of writing over the new owner; the check locks the run row, so it
        holds until the transaction commits.
        """
        view = copy.copy(self)
        view._fence = (run_id, lease_version)
        return view

    async def _check_fence(self, tx: Tx, run_id: str, lease_version: int) -> None:
        row = await tx.fetchone(
            f"SELECT lease_version FROM runs WHERE run_id = ?{self.for_update}", (run_id,)
        )
        if row is None or int(row["lease_version"]) != lease_version:
            raise LeaseLost(f"lease {lease_version} on {run_id} is no longer held")

    async def _announce(self, tx: Tx, channel: str, payload: str) -> None:
        """Tell other processes, on commit (PostgreSQL NOTIFY); in-process only by default."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ping(self) -> None: ...

    def add_listener(self, listener: EventListener) -> None:
        """Called with (run_id, seq) after a transaction that appended an event commits."""
        self._listeners.append(listener)

    async def migrate(self) -> None:
        async with self.tx() as tx:
            await tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = await tx.fetchone("SELECT MAX(version) AS v FROM schema_version")
            current = (row or {}).get("v") or 0
            for version, statements in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for sql in statements:
                    await tx.execute(sql.format(blob=self.blob_type))
                await tx.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))

    def _notify(self, appended: list[tuple[str, int]]) -> None:
        for run_id, seq in appended:
            for listener in self._listeners:
                listener(run_id, seq)

    async def _append(
        self,
        tx: Tx,
        run_id: str,
        type_: EventType,
        data: dict[str, Any],
        out: list[tuple[str, int]],
        dedupe_key: str | None = None,
    ) -> int | None:
        """Append one event; with ``dedupe_key``, only if no event of the run has that key."""
        if dedupe_key is not None:
            seen = await tx.fetchone(
                "SELECT seq FROM events WHERE run_id = ? AND dedupe_key = ?", (run_id, dedupe_key)
            )
            if seen is not None:
                return None
        row = await tx.fetchone(
            "UPDATE runs SET last_seq = last_seq + 1 WHERE run_id = ? RETURNING last_seq",
            (run_id,),
        )
        if row is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")
        seq = int(row["last_seq"])
        await tx.execute(
            "INSERT INTO events (run_id, seq, type, ts, data, dedupe_key) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, seq, type_.value, _ts(), _enc(data), dedupe_key),
        )
        await self._announce(tx, EVENTS_CHANNEL, f"{run_id} {seq}")
        out.append((run_id, seq))
        return seq

    # -- runs -----------------------------------------------------------------

    async def create_run(self, run: Run, request_hash: str) -> tuple[Run, bool]:
        """Insert a run (and its first event), or return the one with the same idempotency key.

        Returns (run, created). A reused key with a different request hash raises
        IDEMPOTENCY_CONFLICT.
        """
        key = run.options.idempotency_key
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            existing = await self._run_for_key(tx, run, request_hash)
            if existing is not None:
                return existing, False
            values = {
                **run.model_dump(mode="json"),
                "tenant_id": run.context.tenant_id,
                "user_id": run.context.user_id,
                "idempotency_key": key,
                "request_hash": request_hash,
                "needs_drive": 1,
            }
            cols = ", ".join(_RUN_COLUMNS)
            marks = ", ".join("?" for _ in _RUN_COLUMNS)
            inserted = await tx.fetchone(
                f"INSERT INTO runs ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING "
                "RETURNING run_id",
                [_enc(values[c]) for c in _RUN_COLUMNS],
            )
            if inserted is None:
                # A concurrent request with the same key committed first.
                existing = await self._run_for_key(tx, run, request_hash)
                assert existing is not None
                return existing, False
            await self._append(
                tx,
                run.run_id,
                EventType.STATE,
                {"from": None, "to": run.state.value, "trigger": "create"},
                appended,
            )
            await self._announce(tx, WORK_CHANNEL, run.run_id)
        self._notify(appended)
        return run, True

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
        async with self.tx() as tx:
            row = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return Run.model_validate(_dec(row)) if row else None

    async def list_runs(
        self,
        *,
        state: str | None = None,
        agent_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Run], str | None]:
        where, params = ["1 = 1"], []
        if state:
            where.append("state = ?")
            params.append(state)
        if agent_id:
            where.append("agent_id = ?")
            params.append(agent_id)
        if cursor:
            created, run_id = decode_cursor(cursor)
            where.append("(created_at < ? OR (created_at = ? AND run_id < ?))")
            params += [created, created, run_id]
        async with self.tx() as tx:
            rows = await tx.fetchall(
                f"SELECT * FROM runs WHERE {' AND '.join(where)} "
                "ORDER BY created_at DESC, run_id DESC LIMIT ?",
                [*params, limit + 1],
            )
        runs = [Run.model_validate(_dec(r)) for r in rows[:limit]]
        more = len(rows) > limit
        last = rows[limit - 1] if more else None
        return runs, (encode_cursor(last["created_at"], last["run_id"]) if last else None)

    async def runs_in_states(self, states: Sequence[State]) -> list[str]:
        marks = ", ".join("?" for _ in states)
        async with self.tx() as tx:
            rows = await tx.fetchall(
                f"SELECT run_id FROM runs WHERE state IN ({marks}) ORDER BY created_at",
                [s.value for s in states],
            )
        return [r["run_id"] for r in rows]

    async def transition(
        self,
        run_id: str,
        trigger: Trigger,
        *,
        expect: State | None = None,
        events: Sequence[tuple[EventType, dict[str, Any]]] = (),
        **fields: Any,
    ) -> Run:
        """Fire ``trigger`` on the run through the lifecycle table, with its state event.

        ``events`` are appended before the state event, in the same transaction.
        ``fields`` (step_index, usage, pending_approval, result, outcome) are
        written with it. ``expect`` guards against a state that moved meanwhile.
        """
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            await self._transition(tx, run_id, trigger, expect, events, fields, appended)
            updated = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        self._notify(appended)
        assert updated is not None
        return Run.model_validate(_dec(updated))

    async def _transition(
        self,
        tx: Tx,
        run_id: str,
        trigger: Trigger,
        expect: State | None,
        events: Sequence[tuple[EventType, dict[str, Any]]],
        fields: dict[str, Any],
        appended: list[tuple[str, int]],
    ) -> None:
        row = await tx.fetchone(
            f"SELECT state FROM runs WHERE run_id = ?{self.for_update}", (run_id,)
        )
        if row is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")
        current = State(row["state"])
        if expect is not None and current is not expect:
            raise RuntimeProblem(
                Code.RUN_STATE_CONFLICT, f"run is {current.value}, not {expect.value}"
            )
        target = transition(current, trigger)
        for type_, data in events:
            await self._append(tx, run_id, type_, data, appended)
        if target in (State.SUCCEEDED, State.FAILED):
            fields = {**fields, "ended_at": utcnow(), "needs_drive": 0}
        elif target is State.WAITING_HUMAN:
            # Parked: nothing to drive until a human decides (decide_approval sets it again).
            fields = {**fields, "needs_drive": 0}
        await self._update_run(tx, run_id, state=target, **fields)
        await self._append(
            tx,
            run_id,
            EventType.STATE,
            {"from": current.value, "to": target.value, "trigger": trigger.value},
            appended,
        )

    async def park(self, run_id: str, approval_id: str, expect: State, **fields: Any) -> Run | None:
        """Move the run to waiting_human for ``approval_id``, unless it was decided already.

        Locks the approval row before the run row, in the same order as
        decide_approval, so a decision cannot slip between the check and the park
        and be lost. Returns None when the approval is decided: resume instead.
        """
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            approval = await tx.fetchone(
                f"SELECT status FROM approvals WHERE approval_id = ?{self.for_update}",
                (approval_id,),
            )
            if approval is not None and approval["status"] != "pending":
                return None
            current = await tx.fetchone("SELECT state FROM runs WHERE run_id = ?", (run_id,))
            if current is not None and current["state"] == State.WAITING_HUMAN.value:
                await self._update_run(tx, run_id, needs_drive=0, **fields)
            else:
                await self._transition(
                    tx, run_id, Trigger.NEED_APPROVAL, expect, (), fields, appended
                )
            updated = await tx.fetchone("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        self._notify(appended)
        return Run.model_validate(_dec(updated)) if updated else None

    async def update_run(self, run_id: str, **fields: Any) -> None:
        """Write progress fields that are not a state change (step_index, usage…)."""
        async with self.tx() as tx:
            await self._update_run(tx, run_id, **fields)

    async def _update_run(self, tx: Tx, run_id: str, **fields: Any) -> None:
        fields["updated_at"] = _ts()
        sets = ", ".join(f"{k} = ?" for k in fields)
        await tx.execute(
            f"UPDATE runs SET {sets} WHERE run_id = ?",
            [*(_enc(v) for v in fields.values()), run_id],
        )

    async def request_cancel(self, run_id: str, reason: str, compensate: bool) -> None:
        """Record the intent durably and wake whoever holds (or will claim) the run."""
        async with self.tx() as tx:
            await tx.execute(
                "UPDATE runs SET cancel_requested = ?, needs_drive = 1 WHERE run_id = ?",
                (_enc({"reason": reason, "compensate": compensate}), run_id),
            )
            await self._announce(tx, CANCEL_CHANNEL, run_id)
            await self._announce(tx, WORK_CHANNEL, run_id)

    async def cancel_requested(self, run_id: str) -> tuple[str, bool] | None:
        """(reason, compensate) if a cancel was asked for."""
        async with self.tx() as tx:
            row = await tx.fetchone("SELECT cancel_requested FROM runs WHERE run_id = ?", (run_id,))
        if row is None or row["cancel_requested"] is None:
            return None
        intent = json.loads(row["cancel_requested"])
        return str(intent["reason"]), bool(intent["compensate"])

    async def append_event(
        self, run_id: str, type_: EventType, data: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None:
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            seq = await self._append(tx, run_id, type_, data, appended, dedupe_key)
        self._notify(appended)
        return seq

    async def list_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        async with self.tx() as tx:
            rows = await tx.fetchall(
                "SELECT run_id, seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (run_id, after, limit),
            )
        return [Event.model_validate(_dec(r)) for r in rows]

    # -- steps ----------------------------------------------------------------

    async def get_step(self, run_id: str, step_index: int) -> Step | None:
        async with self.tx() as tx:
            row = await tx.fetchone(
                "SELECT * FROM steps WHERE run_id = ? AND step_index = ?", (run_id, step_index)
            )
        return Step.model_validate({**_dec(row), "run_id": run_id}) if row else None

    async def record_step(self, step: Step) -> Step:
        """Insert the step's decision once; a replayed planner gets the first decision back."""
        async with self.tx() as tx:
            await tx.execute(
                "INSERT INTO steps (run_id, step_index, decision, started_at, ended_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    step.run_id,
                    step.step_index,
                    _enc(step.decision),
                    _enc(step.started_at),
                    _enc(step.ended_at),
                ),
            )
        stored = await self.get_step(step.run_id, step.step_index)
        assert stored is not None
        return stored

    async def list_steps(self, run_id: str) -> list[Step]:
        async with self.tx() as tx:
            rows = await tx.fetchall(
                "SELECT * FROM steps WHERE run_id = ? ORDER BY step_index", (run_id,)
            )
        return [Step.model_validate(_dec(r)) for r in rows]

    # -- the tool-call ledger -------------------------------------------------

    async def get_tool_call(self, tool_call_id: str) -> ToolCall | None:
        async with self.tx() as tx:
            row = await tx.fetchone(
                "SELECT * FROM tool_calls WHERE tool_call_id = ?", (tool_call_id,)
            )
        return ToolCall.model_validate(_dec(row)) if row else None

    async def _insert_once(self, tx: Tx, table: str, key: str, data: dict[str, Any]) -> bool:
        """Insert a row unless its key exists; True if this call inserted it.

        ON CONFLICT makes a concurrent duplicate wait for the first and then do
        nothing, instead of failing on the unique key.
        """
        cols = list(data)
        inserted = await tx.fetchone(
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
            f"ON CONFLICT DO NOTHING RETURNING {key}",
            [_enc(data[c]) for c in cols],
        )
        return inserted is not None

    async def begin_tool_call(self, call: ToolCall, action: dict[str, Any]) -> ToolCall:
        """Record that a call is about to run (status running), with its action event.

        If the row exists already, nothing is written and the existing row is returned:
        the caller must look at its status before executing anything.
        """
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            if await self._insert_once(
                tx, "tool_calls", "tool_call_id", call.model_dump(mode="json")
            ):
                await self._append(tx, call.run_id, EventType.ACTION, action, appended)
            row = await tx.fetchone(
                "SELECT * FROM tool_calls WHERE tool_call_id = ?", (call.tool_call_id,)
            )
        self._notify(appended)
        assert row is not None
        return ToolCall.model_validate(_dec(row))

    async def update_tool_call(
        self,
        tool_call_id: str,
        *,
        result: dict[str, Any] | None = None,
        from_status: Sequence[str] = ("running",),
        **fields: Any,
    ) -> ToolCall:
        """Move a ledger row on (compare-and-set on its status), with its result event."""
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            row = await tx.fetchone(
                f"SELECT * FROM tool_calls WHERE tool_call_id = ?{self.for_update}",
                (tool_call_id,),
            )
            if row is None:
                raise RuntimeProblem(Code.NOT_FOUND, f"tool call {tool_call_id} not found")
            if row["status"] in from_status:
                fields["updated_at"] = _ts()
                sets = ", ".join(f"{k} = ?" for k in fields)
                await tx.execute(
                    f"UPDATE tool_calls SET {sets} WHERE tool_call_id = ?",
                    [*(_enc(v) for v in fields.values()), tool_call_id],
                )
                if result is not None:
                    await self._append(tx, row["run_id"], EventType.RESULT, result, appended)
                row = await tx.fetchone(
                    "SELECT * FROM tool_calls WHERE tool_call_id = ?", (tool_call_id,)
                )
        self._notify(appended)
        assert row is not None
        return ToolCall.model_validate(_dec(row))

    async def claim_tool_call(self, tool_call_id: str, seen_attempts: int) -> ToolCall | None:
        """Count one more attempt if nobody else did since ``seen_attempts``; None if lost.

        The compare-and-set makes two drivers that both found the row running
        agree on which one of them executes it.
        """
        async with self.tx() as tx:
            row = await tx.fetchone(
                "UPDATE tool_calls SET attempts = attempts + 1, updated_at = ? "
                "WHERE tool_call_id = ? AND attempts = ? AND status = 'running' RETURNING *",
                (_ts(), tool_call_id, seen_attempts),
            )
        return ToolCall.model_validate(_dec(row)) if row else None

    async def interrupt_running_calls(self, run_id: str, code: Code, message: str) -> None:
        """Close the ledger rows a stopped run leaves ``running``: their effect is unknown."""
        for row in await self.list_tool_calls(run_id):
            if row.status == "running":
                cancelled = row.model_copy(update={"status": "cancelled"})
                await self.update_tool_call(
                    row.tool_call_id,
                    result=result_event(cancelled),
                    status="cancelled",
                    error={"code": code, "message": message},
                )

    async def claim_compensation(self, tool_call_id: str) -> bool:
        """True for exactly one caller: it alone runs the call's compensation."""
        async with self.tx() as tx:
            got = await tx.fetchone(
                "UPDATE tool_calls SET compensation_claimed = 1 WHERE tool_call_id = ? "
                "AND compensation_claimed = 0 AND compensated = 0 RETURNING tool_call_id",
                (tool_call_id,),
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
        async with self.tx() as tx:
            rows = await tx.fetchall(
                "SELECT * FROM tool_calls WHERE run_id = ? ORDER BY step_index, call_index",
                (run_id,),
            )
        return [ToolCall.model_validate(_dec(r)) for r in rows]

    # -- approvals ------------------------------------------------------------

    async def ensure_approval(self, approval: Approval, request: dict[str, Any]) -> Approval:
        """Create the approval with its approval_request event, unless it exists already."""
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            if await self._insert_once(
                tx, "approvals", "approval_id", approval.model_dump(mode="json")
            ):
                await self._append(
                    tx, approval.run_id, EventType.APPROVAL_REQUEST, request, appended
                )
            row = await tx.fetchone(
                "SELECT * FROM approvals WHERE approval_id = ?", (approval.approval_id,)
            )
        self._notify(appended)
        assert row is not None
        return Approval.model_validate(_dec(row))

    async def get_approval(self, approval_id: str) -> Approval | None:
        async with self.tx() as tx:
            row = await tx.fetchone("SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
        return Approval.model_validate(_dec(row)) if row else None

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[Approval]:
        where, params = ["1 = 1"], []
        if status:
            where.append("status = ?")
            params.append(status)
        if run_id:
            where.append("run_id = ?")
            params.append(run_id)
        async with self.tx() as tx:
            rows = await tx.fetchall(
                f"SELECT * FROM approvals WHERE {' AND '.join(where)} "
                "ORDER BY created_at, approval_id LIMIT ?",
                [*params, limit],
            )
        return [Approval.model_validate(_dec(r)) for r in rows]

    async def decide_approval(
        self,
        approval_id: str,
        decision: ApprovalDecision,
        *,
        decided_by: str,
        comment: str | None,
    ) -> tuple[Approval, bool]:
        """Compare-and-set a pending approval to ``decision``; returns (row, won).

        Only the winner gets ``won``. In the same transaction an approval moves a
        parked run back to executing, and an approve or reject asks for a worker to
        resume the run (a run still on its way to waiting_human picks the decision
        up itself when it parks).
        """
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            row = await tx.fetchone(
                f"SELECT * FROM approvals WHERE approval_id = ?{self.for_update}", (approval_id,)
            )
            if row is None:
                raise RuntimeProblem(Code.APPROVAL_NOT_FOUND, f"approval {approval_id} not found")
            won = row["status"] == "pending"
            if won:
                now = _ts()
                await tx.execute(
                    "UPDATE approvals SET status = ?, decided_by = ?, comment = ?, "
                    "decided_at = ? WHERE approval_id = ? AND status = 'pending'",
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
                    },
                    appended,
                )
                if decision != "expired":
                    run = await tx.fetchone(
                        f"SELECT state FROM runs WHERE run_id = ?{self.for_update}",
                        (row["run_id"],),
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
                                appended,
                            )
                        else:
                            await self._update_run(tx, row["run_id"], **fields)
                        await self._announce(tx, WORK_CHANNEL, row["run_id"])
                row = await tx.fetchone(
                    "SELECT * FROM approvals WHERE approval_id = ?", (approval_id,)
                )
        self._notify(appended)
        assert row is not None
        return Approval.model_validate(_dec(row)), won

    # -- artifacts ------------------------------------------------------------

    async def put_artifact(self, artifact: Artifact, content: bytes) -> Artifact:
        """Store content-addressed bytes once; the artifact event goes to the run's log."""
        appended: list[tuple[str, int]] = []
        async with self.tx() as tx:
            await self._insert_once(
                tx,
                "artifacts",
                "artifact_id",
                {**artifact.model_dump(mode="json"), "content": content},
            )
            if artifact.run_id is not None:
                await self._append(
                    tx,
                    artifact.run_id,
                    EventType.ARTIFACT,
                    artifact.model_dump(mode="json", exclude={"run_id"}),
                    appended,
                    dedupe_key=f"artifact:{artifact.artifact_id}",
                )
        self._notify(appended)
        return artifact

    async def artifact_exists(self, artifact_id: str) -> bool:
        async with self.tx() as tx:
            row = await tx.fetchone(
                "SELECT 1 AS one FROM artifacts WHERE artifact_id = ?", (artifact_id,)
            )
        return row is not None

    async def get_artifact(self, artifact_id: str) -> tuple[Artifact, bytes] | None:
        async with self.tx() as tx:
            row = await tx.fetchone("SELECT * FROM artifacts WHERE artifact_id = ?", (artifact_id,))
        if row is None:
            return None
        content = bytes(row.pop("content") or b"")
        return Artifact.model_validate(row), content


async def iterate_events(store: RunStore, run_id: str, after: int) -> AsyncIterator[Event]:
    while True:
        batch = await store.list_events(run_id, after)
        if not batch:
            return
        for event in batch:
            yield event
        after = batch[-1].seq
