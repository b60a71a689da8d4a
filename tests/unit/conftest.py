"""Helpers for the unit tests: runs built the way the engine builds them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from runtime.budget import Maxima, effective_limits
from runtime.ids import new_run_id
from runtime.lifecycle import State
from runtime.model import Run, RunContext, RunOptions, utcnow
from runtime.store.base import RunStore
from runtime.store.sqlite import SqliteRunStore
from tests.unit.node_env import NodeEnv

MakeRun = Callable[..., Coroutine[Any, Any, Run]]


def build_run(
    *,
    state: State = State.PENDING,
    idempotency_key: str | None = None,
    created_at: datetime | None = None,
    scope: list[str] | None = None,
    input: str = "do something",
    tenant_id: str = "t1",
    agent_id: str = "test-agent",
) -> Run:
    """A fresh run, as ``Engine.create_run`` builds it."""
    options = RunOptions(idempotency_key=idempotency_key)
    now = created_at or utcnow()
    return Run(
        run_id=new_run_id(),
        agent_id=agent_id,
        input=input,
        context=RunContext(user_id="u1", tenant_id=tenant_id, scope=scope or []),
        options=options,
        state=state,
        limits=effective_limits(options, Maxima()),
        created_at=now,
        updated_at=now,
    )


@pytest.fixture
def make_run() -> MakeRun:
    """``await make_run(store, **build_run_kwargs)`` inserts a run and returns it."""

    async def make(store: RunStore, request_hash: str = "hash", **kwargs: Any) -> Run:
        run, created = await store.create_run(build_run(**kwargs), request_hash)
        assert created
        return run

    return make


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteRunStore]:
    store = await SqliteRunStore.open(tmp_path / "store.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def env(data_dir: Path) -> NodeEnv:
    """A node's world without a database: a FakeStore run, the test tools, a runtime."""
    return NodeEnv(data_dir)
