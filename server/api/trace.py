"""GET /runs/{id}/trace: the full ordered audit record, however long the run's log.

The run, its steps, tool calls and approvals are read first (bounded by the run's
budgets); the events are streamed from the log in pages, so that a run of a
hundred thousand events is served whole without ever being held in memory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from runtime.model import Approval, Run
from runtime.store.base import RunStore, event_pages
from server.api.redaction import RunTools, redact_steps, redact_tool_calls

EVENTS_PER_CHUNK = 1000


def _json(value: Any) -> str:
    # As Starlette's JSONResponse writes it.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


async def all_approvals(store: RunStore, run_id: str) -> list[Approval]:
    approvals: list[Approval] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.page_approvals(run_id=run_id, limit=500, cursor=cursor)
        approvals += page
        if cursor is None:
            return approvals


async def trace_head(store: RunStore, tools: RunTools, run: Run) -> str:
    """The trace's JSON up to its events array, opened: read before anything is sent,
    so that a failing read is still a proper error response."""
    head = {
        "run": run.model_dump(mode="json"),
        "steps": [
            s.model_dump(mode="json")
            for s in redact_steps(tools, await store.list_steps(run.run_id))
        ],
        "tool_calls": [
            c.model_dump(mode="json")
            for c in redact_tool_calls(tools, await store.list_tool_calls(run.run_id))
        ],
        "approvals": [a.model_dump(mode="json") for a in await all_approvals(store, run.run_id)],
    }
    return _json(head)[:-1] + ',"events":['


async def trace_body(store: RunStore, run_id: str, head: str) -> AsyncIterator[bytes]:
    yield head.encode()
    sep = ""
    async for batch in event_pages(store, run_id, 0, EVENTS_PER_CHUNK):
        yield (sep + ",".join(_json(e.model_dump(mode="json")) for e in batch)).encode()
        sep = ","
    yield b"]}"
