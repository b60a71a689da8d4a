"""GET /runs/{id}/trace: the full ordered audit record, however long the run's log.

The run, its steps, tool calls and approvals are read first, at one instant
(:mod:`runtime.store.records`; bounded by the run's budgets); the events up to that
instant are streamed from the log in pages, so that a run of a hundred thousand
events is served whole without ever being held in memory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from runtime.model import Run
from runtime.store.base import RunStore
from runtime.store.records import (
    RunRecord,
    ShownApproval,
    ShownEvent,
    ShownStep,
    ShownToolCall,
    log_pages,
)
from server.api.redaction import RunTools, redact_steps, redact_tool_calls

EVENTS_PER_CHUNK = 1000


class Trace(BaseModel):
    """The full ordered audit record of a run."""

    run: Run
    steps: list[ShownStep]
    tool_calls: list[ShownToolCall]
    approvals: list[ShownApproval]
    """A row that no longer validates shows in its unreadable form (``unreadable: true``)."""
    events: list[ShownEvent]
    """So is an event: read once the body has begun, one that raised would cut it off."""


def _json(value: Any) -> str:
    # As Starlette's JSONResponse writes it.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def trace_head(tools: RunTools, record: RunRecord) -> str:
    """The trace's JSON up to its events array, opened: read before anything is sent,
    so that a failing read is still a proper error response."""
    head = {
        "run": record.run.model_dump(mode="json"),
        "steps": [s.model_dump(mode="json") for s in redact_steps(tools, record.steps)],
        "tool_calls": [
            c.model_dump(mode="json") for c in redact_tool_calls(tools, record.tool_calls)
        ],
        "approvals": [a.model_dump(mode="json") for a in record.approvals],
    }
    return _json(head)[:-1] + ',"events":['


class LogGone(RuntimeError):
    """The run's log ended before the record's instant: retention pruned the run while
    its trace was being sent."""


async def trace_body(store: RunStore, record: RunRecord, head: str) -> AsyncIterator[bytes]:
    yield head.encode()
    sep, sent = "", 0
    pages = log_pages(store.shown_events, record.run.run_id, 0, EVENTS_PER_CHUNK, record.last_seq)
    async for batch in pages:
        yield (sep + ",".join(_json(e.model_dump(mode="json")) for e in batch)).encode()
        sep, sent = ",", batch[-1].seq
    if sent < record.last_seq:
        # Not "]}": a client must not take a JSON document missing events for the whole
        # record. Raised mid-body, the connection is dropped before its end.
        raise LogGone(f"run {record.run.run_id} was pruned while its trace was sent")
    yield b"]}"
