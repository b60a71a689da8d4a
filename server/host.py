"""What a serve or worker process hosts: store, checkpointer, engine, worker, listener."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from graphs.run_graph import with_hosted_tools
from runtime.agent import AgentSpec
from runtime.backend import open_backend
from runtime.engine import Engine
from runtime.eventbus import EventBus
from runtime.retention import keep_pruning
from runtime.retry import DriveRetry
from runtime.store.base import RunStore
from runtime.store.leases import CANCEL_CHANNEL, EVENTS_CHANNEL, WORK_CHANNEL
from runtime.store.postgres import listen
from runtime.worker import Worker
from server.agents import load_agents
from server.embedded import sole_host
from server.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Host:
    settings: Settings
    store: RunStore
    engine: Engine
    bus: EventBus
    worker: Worker | None


@asynccontextmanager
async def open_host(
    settings: Settings,
    agents: Mapping[str, AgentSpec] | None = None,
    *,
    run_worker: bool = True,
) -> AsyncIterator[Host]:
    """Raises :class:`server.embedded.EmbeddedInUse` where another live process
    serves the same embedded database."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with sole_host(settings.resolved_database_url):
        async with _open_host(settings, agents, run_worker=run_worker) as host:
            yield host


@asynccontextmanager
async def _open_host(
    settings: Settings, agents: Mapping[str, AgentSpec] | None, *, run_worker: bool
) -> AsyncIterator[Host]:
    url = settings.resolved_database_url
    loaded = dict(agents) if agents is not None else load_agents(settings)
    hosted = {agent_id: with_hosted_tools(spec) for agent_id, spec in loaded.items()}
    backend = await open_backend(url, pool_size=settings.db_pool_size)
    try:
        if backend.store.dialect == "sqlite":
            await backend.store.expire_all_leases()
        bus = EventBus()
        backend.store.add_listener(bus.publish)
        engine = Engine(
            backend.store,
            backend.checkpointer,
            hosted,
            default_agent=settings.default_agent,
            maxima=settings.maxima(),
            bus=bus,
            lease_s=settings.lease_seconds,
            retry=DriveRetry(
                settings.max_drive_failures,
                settings.drive_retry_seconds,
                max_takeovers=settings.max_takeovers,
            ),
            memory=backend.memory,
        )
    except BaseException:
        # Its threads (aiosqlite's) would keep a process that failed to start alive.
        await backend.close()
        raise
    listener = None
    if url.startswith(("postgresql://", "postgres://")):

        def on_event(payload: str) -> None:
            run_id, _, seq = payload.partition(" ")
            if run_id:
                bus.publish(run_id, int(seq or 0))
            else:
                bus.publish_all()

        listener = asyncio.create_task(
            listen(
                url,
                {
                    EVENTS_CHANNEL: on_event,
                    WORK_CHANNEL: engine.on_work_notice,
                    CANCEL_CHANNEL: lambda run_id: (
                        engine.on_cancel_notice(run_id) if run_id else None
                    ),
                },
                own_sessions=backend.sessions,
                late_echoes={EVENTS_CHANNEL},
            ),
            name="listen",
        )
    worker = Worker(engine, concurrency=settings.worker_concurrency) if run_worker else None
    if worker is not None:
        worker.start()
    pruning = None
    if run_worker and settings.retention_days is not None:
        pruning = asyncio.create_task(
            keep_pruning(
                backend.store,
                backend.checkpointer,
                timedelta(days=settings.retention_days),
                settings.retention_interval_s,
            ),
            name="prune",
        )
    try:
        yield Host(settings, backend.store, engine, bus, worker)
    finally:
        if pruning is not None:
            pruning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pruning
        if worker is not None:
            await worker.stop(settings.shutdown_grace_s)
        else:
            await engine.shutdown()
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await backend.close()
