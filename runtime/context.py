"""The services a run's nodes are handed through LangGraph's ``Runtime[Context]``."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.config import get_config
from langgraph.runtime import Runtime

from runtime.recording import Recording
from runtime.services import NodeStore
from runtime.state import run_context
from runtime.store.base import RunStore


@dataclass
class Context:
    run_id: str
    """The run (and LangGraph thread) being driven."""
    store: NodeStore
    """Ledger, steps, approvals, artifacts and events: a RunStore, or a test's fake."""
    active_base_s: float = 0.0
    """Active seconds the run had used before this drive started."""
    drive_started: float = field(default_factory=time.monotonic)
    recorded_before: int | None = None
    """Steps recorded in the store when this drive started (None: unknown)."""
    agent_id: str | None = None
    """The run's agent: whose decisions a graph built without an ``agent_id`` makes."""
    recording: Recording | None = None
    """How the drive records its calls' outcomes through a database blip (None: for as
    long as :data:`runtime.recording.WITHOUT_LEASE_S`, kept by nobody)."""

    def may_have_recorded(self, step_index: int) -> bool:
        """Whether an earlier drive may have recorded this step (replay after a crash).

        A step this drive records after it started cannot be planned twice within
        the drive, and record_step keeps the first decision if it were.
        """
        return self.recorded_before is None or step_index < self.recorded_before

    def active_s(self) -> float:
        """Active time so far; time spent parked waiting for a human is not counted."""
        return self.active_base_s + (time.monotonic() - self.drive_started)


# -- outside the engine (``langgraph dev`` / LangGraph Studio) -------------------

_studio_stores: dict[asyncio.AbstractEventLoop, asyncio.Task[RunStore]] = {}
_studio_runs: set[str] = set()
"""Threads whose run row is known to exist."""


def studio_db_path() -> Path:
    # Set empty is unset, as for the server's settings.
    return Path(os.environ.get("AGENT_RUNTIME_DATA_DIR") or ".agent-runtime") / "studio.db"


async def _studio_store() -> RunStore:
    """The store for runs driven by a LangGraph server: opened once per event loop."""
    loop = asyncio.get_running_loop()
    opening = _studio_stores.get(loop)
    if opening is None or (opening.done() and opening.exception() is not None):
        from runtime.store.sqlite import SqliteRunStore

        opening = loop.create_task(SqliteRunStore.open(studio_db_path(), direct=False))
        _studio_stores[loop] = opening
    # shield: a cancelled node must not cancel the opening other nodes wait on.
    return await asyncio.shield(opening)


async def services(runtime: Runtime[Any], state: Mapping[str, Any] | None = None) -> Context:
    """The services for a node: the engine's :class:`Context`, or, when the graph is run
    by a LangGraph server (``langgraph dev``, Studio) that passes none, one for the
    LangGraph thread (run_id = thread_id) backed by ``$AGENT_RUNTIME_DATA_DIR/studio.db``,
    whose run row is created on first use so that the ledger, events and approvals work.
    """
    if isinstance(runtime.context, Context):
        return runtime.context
    from runtime.budget import Maxima, effective_limits
    from runtime.ids import content_hash
    from runtime.lifecycle import State
    from runtime.model import Run, RunOptions, Usage, utcnow

    config = get_config()
    thread_id = config.get("configurable", {}).get("thread_id")
    if not thread_id:
        raise RuntimeError("a graph run outside the engine needs a thread_id")
    run_id = str(thread_id)
    store = await _studio_store()
    state = state or {}
    agent_id = str(config.get("metadata", {}).get("graph_id") or "studio")
    if run_id not in _studio_runs and await store.get_run(run_id) is None:
        now = utcnow()
        options = RunOptions()
        run = Run(
            run_id=run_id,
            agent_id=agent_id,
            input=str(state.get("input") or ""),
            context=run_context(state),
            options=options,
            state=State.PENDING,
            limits=effective_limits(options, Maxima()),
            created_at=now,
            updated_at=now,
        )
        # A thread's nodes run one after another: nothing races this check.
        await store.create_run(run, content_hash(run.model_dump(mode="json")))
    _studio_runs.add(run_id)
    usage = Usage.model_validate(state.get("usage") or {})
    return Context(run_id=run_id, store=store, active_base_s=usage.active_s, agent_id=agent_id)
