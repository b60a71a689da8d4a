"""Checkpoints written before ``runtime.state.failed`` kept a failed outcome's code a
plain str hold a ``runtime.errors.Code`` as LangGraph's msgpack keeps an enum: an ext
naming the class, which LangGraph revives only for a registered type. Unregistered, it
is read back with a warning ("will be blocked in a future version") and, under
``LANGGRAPH_STRICT_MSGPACK``, not revived at all: a bare str, the warning "Blocked".
The runtime's checkpointers (``open_backend``) register it, so such a run still
resumes, and silently, on either database."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import StateGraph

from runtime.backend import open_backend, sqlite_path
from runtime.errors import Code
from runtime.state import RunState
from runtime.store.postgres import open_pool

ROOT = Path(__file__).resolve().parents[2]
THREAD = "run-from-an-early-version"
CONFIG: RunnableConfig = {"configurable": {"thread_id": THREAD}}


async def failed_the_old_way(state: RunState) -> dict[str, Any]:
    """What ``runtime.state.failed`` returned then: the enum itself."""
    return {"outcome": {"status": "failed", "code": Code.RUN_CANCELLED, "message": "cancelled"}}


def graph(saver: BaseCheckpointSaver[str]) -> Any:
    builder: StateGraph[RunState, None, RunState, RunState] = StateGraph(RunState)
    builder.add_node("fail", failed_the_old_way)
    builder.set_entry_point("fail")
    return builder.compile(checkpointer=saver)


@asynccontextmanager
async def early_saver(url: str) -> AsyncIterator[BaseCheckpointSaver[str]]:
    """LangGraph's saver on the database, with LangGraph's default serde, as early
    versions of the runtime built it."""
    if url.startswith("sqlite:///"):
        async with aiosqlite.connect(sqlite_path(url)) as conn:
            yield AsyncSqliteSaver(conn)
        return
    pool = await open_pool(url)
    try:
        yield AsyncPostgresSaver(pool)  # type: ignore[arg-type]
    finally:
        await pool.close()


async def written_by_an_early_version(url: str) -> None:
    backend = await open_backend(url)  # the tables, as the runtime makes them
    await backend.close()
    async with early_saver(url) as saver:
        await graph(saver).ainvoke({"input": "x"}, CONFIG)


async def test_the_runtimes_checkpointer_reads_an_early_versions_code_back_silently(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await written_by_an_early_version(database_url)
    # LangGraph logs each type once a process: no earlier read may have used it up.
    monkeypatch.setattr(jsonplus, "_warned_unregistered_types", set())
    monkeypatch.setattr(jsonplus, "_warned_blocked_types", set())
    caplog.set_level(logging.WARNING, logger="langgraph.checkpoint.serde")
    complaints: list[SerdeEvent] = []  # its other channel, never deduplicated
    unregister = register_serde_event_listener(complaints.append)
    backend = await open_backend(database_url)
    try:
        saved = await backend.checkpointer.aget_tuple(CONFIG)
        assert saved is not None
        # Its exact type: a StrEnum's bare str would compare equal.
        code = saved.checkpoint["channel_values"]["outcome"]["code"]
        assert type(code) is Code and code is Code.RUN_CANCELLED
        # As a drive reads it: through a graph (which adds an allow-list of its own,
        # derived from the state's types, when strict).
        state = await graph(backend.checkpointer).aget_state(CONFIG)
        assert type(state.values["outcome"]["code"]) is Code
    finally:
        await backend.close()
        unregister()
    assert [
        r.getMessage() for r in caplog.records if r.name.startswith("langgraph.checkpoint")
    ] == []
    assert complaints == []


READ_IN_A_CHILD = """
import asyncio, json, sys
from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
from runtime.backend import open_backend

async def main() -> None:
    events = []
    register_serde_event_listener(events.append)
    backend = await open_backend(sys.argv[1])
    try:
        saved = await backend.checkpointer.aget_tuple({"configurable": {"thread_id": sys.argv[2]}})
    finally:
        await backend.close()
    code = saved.checkpoint["channel_values"]["outcome"]["code"]
    print(json.dumps({"type": type(code).__qualname__, "events": events}))

asyncio.run(main())
"""


def test_it_is_revived_under_strict_msgpack_too(database_url: str) -> None:
    """LangGraph's announced default: read in a process started with it (it is read as
    LangGraph is imported)."""
    asyncio.run(written_by_an_early_version(database_url))
    done = subprocess.run(
        [sys.executable, "-c", READ_IN_A_CHILD, database_url, THREAD],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "LANGGRAPH_STRICT_MSGPACK": "true"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"type": "Code", "events": []}, done.stderr
    assert "Blocked" not in done.stderr and "unregistered" not in done.stderr, done.stderr
