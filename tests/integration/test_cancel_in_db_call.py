"""A cancel that lands in a database call: psycopg, leaving a pipeline it was cancelled
in, raises ``OperationalError: cannot exit pipeline mode while busy`` instead of the
``CancelledError`` (seen by the race probe under load). That is the cancel, not the
database failing: it must not be logged as a database error, counted towards the
drive failures that end a run CHECKPOINT_ERROR, nor wait out a backoff."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runtime.backend import open_backend
from runtime.checkpointer import PooledPostgresSaver
from runtime.engine import Engine
from runtime.model import RunCreate
from runtime.worker import Worker
from server.agents import load_agents
from server.settings import Settings
from tests.integration.scale_out import EAST


class CancelledInPipeline(PooledPostgresSaver):
    """The engine's saver, whose checkpoint write after ``hold`` is set waits, and turns
    a cancel into the error psycopg raises for one landing mid-pipeline."""

    hold = False
    holding: asyncio.Event

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if self.hold:
            self.hold = False
            self.holding.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise psycopg.OperationalError("cannot exit pipeline mode while busy") from None
        return await super().aput(config, checkpoint, metadata, new_versions)


async def cancel_in_a_checkpoint_write(url: str, data_dir: Path) -> tuple[Any, int]:
    settings = Settings(
        data_dir=data_dir, database_url=url, extra_agents=["tests.agents:build_agents"]
    )
    backend = await open_backend(url)
    store: Any = backend.store
    saver = CancelledInPipeline(store.pool)
    saver.holding = asyncio.Event()
    engine = Engine(
        store, saver, load_agents(settings), default_agent=settings.default_agent, lease_s=5
    )
    worker = Worker(engine, concurrency=2)
    worker.start()
    try:
        context = {"user_id": "u-ops-001", "tenant_id": "demo-retail", **EAST}
        run, _ = await engine.create_run(
            RunCreate.model_validate(
                {"agent_id": "slow_worker", "input": "sleep 0", "context": context}
            )
        )
        saver.hold = True
        await asyncio.wait_for(saver.holding.wait(), 10)
        final = await engine.cancel(run.run_id, "stop", wait_s=10)
        found = await store.get_run_to_drive(run.run_id)
        return final, found.failures
    finally:
        await worker.stop()
        await backend.close()


def test_a_cancel_turned_into_a_database_error_is_still_a_cancel(
    pg_schema_url: str, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="runtime"):
        final, failures = asyncio.run(cancel_in_a_checkpoint_write(pg_schema_url, data_dir))

    assert final.state.value == "failed" and final.outcome.code.value == "RUN_CANCELLED", final
    assert failures == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "interrupted a database call" in caplog.text
