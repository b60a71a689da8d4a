"""LISTEN on PostgreSQL (runtime.store.postgres.listen): a notice one of this process's
own sessions sent comes late on the channels that ask for it (its writer has announced
the commit in process already, with the rows), and still comes; any other, at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest

from runtime.store.core import EVENTS_CHANNEL, WORK_CHANNEL
from runtime.store.postgres import SessionPool, listen, open_pool

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pool(pg_schema_url: str) -> AsyncIterator[SessionPool]:
    opened = await open_pool(pg_schema_url, max_size=2)
    try:
        yield opened
    finally:
        await opened.close()


async def heard_in_order(
    url: str, pool: SessionPool, channel: str, late_echoes: set[str]
) -> list[str]:
    """Our pool notifies "ours", then a session of another process "theirs"."""
    heard: list[str] = []
    listening, both = asyncio.Event(), asyncio.Event()

    def on_notice(payload: str) -> None:
        if payload in ("ours", "theirs"):
            # Not another's: channels are the database's, and other tests' processes
            # may be notifying on them (a run's events) at the same time.
            heard.append(payload)
            if len(heard) == 2:
                both.set()
        elif not payload:
            listening.set()  # the call each (re)connection makes once it listens

    task = asyncio.create_task(
        listen(url, {channel: on_notice}, own_sessions=pool.sessions, late_echoes=late_echoes)
    )
    try:
        await asyncio.wait_for(listening.wait(), 10)
        async with pool.connection() as conn:
            await conn.execute("SELECT pg_notify(%s, 'ours')", (channel,))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
            await other.execute("SELECT pg_notify(%s, 'theirs')", (channel,))
        await asyncio.wait_for(both.wait(), 10)
        return heard
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_pool_knows_its_sessions(pool: SessionPool) -> None:
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
    assert row is not None and row["pid"] in pool.sessions


async def test_our_own_event_notices_come_late_and_still_come(
    pg_schema_url: str, pool: SessionPool
) -> None:
    heard = await heard_in_order(pg_schema_url, pool, EVENTS_CHANNEL, {EVENTS_CHANNEL})
    assert heard == ["theirs", "ours"]


async def test_other_channels_hear_our_own_notices_at_once(
    pg_schema_url: str, pool: SessionPool
) -> None:
    heard = await heard_in_order(pg_schema_url, pool, WORK_CHANNEL, {EVENTS_CHANNEL})
    assert heard == ["ours", "theirs"]
