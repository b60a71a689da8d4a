"""PostgreSQL: a driver's hot writes as single statements, fence included.

A fenced write used to be BEGIN, a locking read of the run row (the fence), the
write, the event's seq, its insert, NOTIFY and COMMIT: seven round trips. Here
each is one autocommit statement whose first CTE locks the run row where the
lease version is ours; every later CTE reads from it, so a stale worker's
statement changes nothing, and the lock is held until the statement commits,
as the fence of a transaction was. The unfenced calls (server side, tests)
keep the transaction path of :class:`RunStore`.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.model import Run, Step, ToolCall
from runtime.store.base import ACTIVE_STATES, RunStore, created_event, run_row, tenant_limit
from runtime.store.codec import _dec, _enc, _enc_col, _ts, event_row
from runtime.store.core import EVENTS_CHANNEL, WORK_CHANNEL
from runtime.store.tx import LeaseLost, Row

_FENCE = "f AS (SELECT run_id FROM runs WHERE run_id = %s AND lease_version = %s FOR UPDATE)"


def _event_ctes(source: str) -> str:
    """CTEs appending one event for each row of ``source`` (0 or 1 row), with its seq."""
    return (
        "r AS (UPDATE runs SET last_seq = last_seq + 1 "
        f"WHERE run_id IN (SELECT run_id FROM {source}) RETURNING run_id, last_seq), "
        "e AS (INSERT INTO events (run_id, seq, type, ts, data) "
        "SELECT run_id, last_seq, %s, %s, %s FROM r)"
    )


def _event_params(type_: EventType, data: dict[str, Any]) -> list[Any]:
    """type, ts, data of the event the statement appends (its seq comes back in ``_seq``)."""
    return [type_.value, _ts(), _enc(data)]


def _result_select(source: str) -> str:
    """The statement's answer: fence held?, the event's seq, and the row of ``source``."""
    return (
        "SELECT (SELECT count(*) FROM f) AS _fenced, (SELECT last_seq FROM r) AS _seq, "
        "(SELECT pg_notify(%s, run_id || ' ' || last_seq)::text FROM r) AS _notified, "
        f"{source}.* FROM (SELECT 1) AS _one LEFT JOIN {source} ON true"
    )


class PgSingleStatements(RunStore):
    """Mixed into the PostgreSQL store before :class:`RunStore`."""

    pool: AsyncConnectionPool[AsyncConnection[DictRow]]

    async def _once(self, query: str, params: list[Any]) -> Row:
        row = await self._pipelined(query, params)
        assert row is not None, "the final SELECT always returns one row"
        return dict(row)

    async def _pipelined(self, query: str, params: list[Any]) -> Row | None:
        raise NotImplementedError  # the PostgreSQL store's

    def _fence_of(self, run_id: str) -> int | None:
        if self._fence is None or self._fence[0] != run_id:
            return None
        return self._fence[1]

    def _check(self, row: Row, run_id: str, version: int, event: list[Any] | None = None) -> None:
        """Raise if the fence failed; announce the event the statement appended, if any.

        ``event``: its :func:`_event_params`."""
        if not row.pop("_fenced"):
            raise LeaseLost(f"lease {version} on {run_id} is no longer held")
        seq = row.pop("_seq", None)
        row.pop("_notified", None)
        if seq is not None:
            rows = [event_row(run_id, int(seq), *event)] if event is not None else []
            self._notify({run_id: int(seq)}, {run_id: rows})

    async def create_run(
        self, run: Run, request_hash: str, *, max_active: int | None = None
    ) -> tuple[Run, bool]:
        if run.options.idempotency_key is not None:
            return await super().create_run(run, request_hash, max_active=max_active)
        # Without a key (most runs) nothing is to be found first: the run, its first
        # event, and both NOTIFYs in one statement; with a tenant cap, behind the
        # tenant's lock in the same pipeline (one transaction: the count's snapshot
        # is taken after the lock is held, so it sees every run created before).
        values = {**run_row(run, request_hash), "last_seq": 1}
        cols = list(values)
        event = [EventType.STATE.value, _ts(), _enc(created_event(run))]
        query = (
            "WITH c AS (SELECT count(*) AS n FROM runs WHERE tenant_id = %s "
            "AND state IN (%s, %s, %s)), "
            f"ins AS (INSERT INTO runs ({', '.join(cols)}) "
            f"SELECT {', '.join('%s' for _ in cols)} WHERE %s OR (SELECT n FROM c) < %s "
            "RETURNING run_id), "
            "e AS (INSERT INTO events (run_id, seq, type, ts, data) "
            "SELECT run_id, 1, %s, %s, %s FROM ins) "
            "SELECT (SELECT count(*) FROM ins) AS inserted, "
            "(SELECT pg_notify(%s, run_id || ' 1')::text FROM ins) AS _events, "
            "(SELECT pg_notify(%s, run_id)::text FROM ins) AS _work"
        )
        params = [
            run.context.tenant_id,
            *ACTIVE_STATES,
            *(_enc_col(c, values[c]) for c in cols),
            max_active is None,
            max_active or 0,
            *event,
            EVENTS_CHANNEL,
            WORK_CHANNEL,
        ]
        async with self.pool.connection() as conn:
            if max_active is None:
                cur = await conn.execute(query, params)
            else:
                async with conn.pipeline():
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtext(%s))",
                        (f"tenant-runs:{run.context.tenant_id}",),
                    )
                    cur = await conn.execute(query, params)
            row = await cur.fetchone()
        assert row is not None
        if not row["inserted"]:
            assert max_active is not None, "only the cap keeps a run without a key out"
            raise tenant_limit(max_active)
        self._notify({run.run_id: 1}, {run.run_id: [event_row(run.run_id, 1, *event)]})
        return run, True

    async def record_step(self, step: Step) -> Step:
        version = self._fence_of(step.run_id)
        if version is None:
            return await super().record_step(step)
        row = await self._once(
            f"WITH {_FENCE}, ins AS (INSERT INTO steps "
            "(run_id, step_index, decision, started_at, ended_at) "
            "SELECT %s, %s, %s, %s, %s FROM f ON CONFLICT DO NOTHING RETURNING step_index) "
            "SELECT (SELECT count(*) FROM f) AS _fenced, (SELECT count(*) FROM ins) AS inserted",
            [
                step.run_id,
                version,
                step.run_id,
                step.step_index,
                _enc(step.decision),
                _enc(step.started_at),
                _enc(step.ended_at),
            ],
        )
        self._check(row, step.run_id, version)
        if row["inserted"]:
            return step
        stored = await self.get_step(step.run_id, step.step_index)
        assert stored is not None
        return stored

    async def start_tool_call(
        self, call: ToolCall, action: dict[str, Any]
    ) -> tuple[ToolCall, bool]:
        version = self._fence_of(call.run_id)
        if version is None:
            return await super().start_tool_call(call, action)
        values = {**call.model_dump(mode="json"), "attempts": call.attempts + 1}
        cols = list(values)
        event = _event_params(EventType.ACTION, action)
        row = await self._once(
            f"WITH {_FENCE}, ins AS (INSERT INTO tool_calls ({', '.join(cols)}) "
            f"SELECT {', '.join('%s' for _ in cols)} FROM f "
            f"ON CONFLICT DO NOTHING RETURNING *), {_event_ctes('ins')} " + _result_select("ins"),
            [
                call.run_id,
                version,
                *(_enc_col(c, values[c]) for c in cols),
                *event,
                EVENTS_CHANNEL,
            ],
        )
        self._check(row, call.run_id, version, event)
        if row.get("tool_call_id") is not None:
            return ToolCall.model_validate(_dec(row)), True
        existing = await self.get_tool_call(call.tool_call_id)
        assert existing is not None
        return existing, False

    async def update_tool_call(
        self,
        tool_call_id: str,
        *,
        result: dict[str, Any] | None = None,
        from_status: Any = ("running",),
        action: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ToolCall:
        if self._fence is None or result is None or action is not None:
            return await super().update_tool_call(
                tool_call_id, result=result, from_status=from_status, action=action, **fields
            )
        run_id, version = self._fence
        fields["updated_at"] = _ts()
        sets = ", ".join(f"{k} = %s" for k in fields)
        statuses = ", ".join("%s" for _ in from_status)
        event = _event_params(EventType.RESULT, result)
        row = await self._once(
            f"WITH {_FENCE}, u AS (UPDATE tool_calls SET {sets} WHERE tool_call_id = %s "
            f"AND run_id IN (SELECT run_id FROM f) AND status IN ({statuses}) RETURNING *), "
            f"{_event_ctes('u')} " + _result_select("u"),
            [
                run_id,
                version,
                *(_enc_col(k, v) for k, v in fields.items()),
                tool_call_id,
                *from_status,
                *event,
                EVENTS_CHANNEL,
            ],
        )
        self._check(row, run_id, version, event)
        if row.get("tool_call_id") is not None:
            return ToolCall.model_validate(_dec(row))
        current = await self.get_tool_call(tool_call_id)
        if current is None:
            raise RuntimeProblem(Code.NOT_FOUND, f"tool call {tool_call_id} not found")
        if current.run_id != run_id:  # not this view's run: no fence of ours applies
            fields.pop("updated_at")
            return await super().update_tool_call(
                tool_call_id, result=result, from_status=from_status, **fields
            )
        return current
