"""A run's whole record as of one instant: what ``GET /runs/{id}/trace`` shows.

Read statement by statement while the run moves on, a trace could show a run still
``pending`` beside the events and step of its planning. (A run ``planning`` still
counts its steps one short of its list, at one instant too: a step is charged when
its plan is ready.) Here the run row, its steps, ledger and approvals come from
one read-only transaction, and the run's ``last_seq`` then bounds the log: events
are only ever appended, so those up to it are the same when read afterwards, page
by page (a long log is not held in one transaction), unless retention prunes the
whole run meanwhile: the trace then ends without closing its JSON.

What the audit surface shows of a row that no longer validates (a value an older
version stored, a hand edit) is its :class:`runtime.model.Unreadable` form: one such
row must not hide the rest of the record (a 500), least of all from an auditor of the
run it broke. The runtime's own reads (``tool_call_rows``, ``list_events``) still
raise on it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from runtime.model import (
    Approval,
    Event,
    Run,
    Step,
    ToolCall,
    Unreadable,
    UnreadableApproval,
    UnreadableEvent,
    UnreadableStep,
    UnreadableToolCall,
    problems_of,
)
from runtime.store.codec import _dec
from runtime.store.core import StoreCore
from runtime.store.tx import Row, Tx

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
U = TypeVar("U", bound=Unreadable)

ShownStep = Step | UnreadableStep
ShownToolCall = ToolCall | UnreadableToolCall
ShownApproval = Approval | UnreadableApproval
ShownEvent = Event | UnreadableEvent
E = TypeVar("E", bound=ShownEvent)


class RunRecord(NamedTuple):
    run: Run
    last_seq: int
    """The seq of the run's last event at that instant."""
    steps: list[ShownStep]
    tool_calls: list[ShownToolCall]
    approvals: list[ShownApproval]


def shown(rows: Sequence[Row], model: type[M], unreadable: type[U]) -> list[M | U]:
    """``rows`` as ``model``, each that does not validate as ``unreadable`` (its keys
    and status as stored)."""
    out: list[M | U] = []
    for row in rows:
        try:
            out.append(model.model_validate(_dec(row)))
        except ValidationError as exc:
            problems = problems_of(exc)
            keys = {k: row[k] for k in unreadable.model_fields if k in row}
            log.warning("a stored %s does not validate: %s %s", model.__name__, keys, problems)
            keys.update(unreadable=True, problems=problems)
            out.append(unreadable.model_validate(keys))
    return out


async def _steps(tx: Tx, run_id: str) -> list[Row]:
    return await tx.fetchall("SELECT * FROM steps WHERE run_id = ? ORDER BY step_index", (run_id,))


async def _tool_calls(tx: Tx, run_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT * FROM tool_calls WHERE run_id = ? ORDER BY step_index, call_index", (run_id,)
    )


async def event_rows(tx: Tx, run_id: str, after: int, limit: int) -> list[Row]:
    return await tx.fetchall(
        "SELECT run_id, seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? "
        "ORDER BY seq LIMIT ?",
        (run_id, after, limit),
    )


async def log_pages(
    read: Callable[[str, int, int], Awaitable[list[E]]],
    run_id: str,
    after: int,
    limit: int,
    through: int | None = None,
) -> AsyncIterator[list[E]]:
    """The run's log after ``after`` (and up to ``through``), a page of at most ``limit``
    events at a time, each page as ``read(run_id, after, limit)`` gives it."""
    while through is None or after < through:
        batch = await read(run_id, after, limit)
        if through is not None:
            batch = [event for event in batch if event.seq <= through]
        if not batch:
            return
        yield batch
        after = batch[-1].seq


async def step_rows(tx: Tx, run_id: str) -> list[Step]:
    return [Step.model_validate(_dec(r)) for r in await _steps(tx, run_id)]


async def tool_call_rows(tx: Tx, run_id: str) -> list[ToolCall]:
    return [ToolCall.model_validate(_dec(r)) for r in await _tool_calls(tx, run_id)]


async def shown_step_rows(tx: Tx, run_id: str) -> list[ShownStep]:
    return shown(await _steps(tx, run_id), Step, UnreadableStep)


async def shown_tool_call_rows(tx: Tx, run_id: str) -> list[ShownToolCall]:
    return shown(await _tool_calls(tx, run_id), ToolCall, UnreadableToolCall)


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
                steps=await shown_step_rows(tx, run_id),
                tool_calls=await shown_tool_call_rows(tx, run_id),
                approvals=shown(approvals, Approval, UnreadableApproval),
            )

    async def shown_steps(self, run_id: str) -> list[ShownStep]:
        """The run's steps as the audit surface shows them (see the module's doc)."""
        async with self.read() as tx:
            return await shown_step_rows(tx, run_id)

    async def shown_events(
        self, run_id: str, after: int = 0, limit: int = 1000
    ) -> list[ShownEvent]:
        """The run's events after seq ``after`` as the audit surface shows them (see the
        module's doc)."""
        async with self.read() as tx:
            return shown(await event_rows(tx, run_id, after, limit), Event, UnreadableEvent)

    async def shown_tool_calls(self, run_id: str) -> list[ShownToolCall]:
        """The run's ledger as the audit surface shows it (see the module's doc)."""
        async with self.read(runs=False) as tx:
            return await shown_tool_call_rows(tx, run_id)
