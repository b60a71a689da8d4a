"""The PostgreSQL pool after its server ended its sessions (a restart, a failover)."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from runtime.store.postgres import open_pool

SESSIONS = 6


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_one_broken_session_has_the_idle_ones_checked(
    database_url: str, pg_base_url: str
) -> None:
    """Only the first statement fails: before, each idle session failed one more as it
    was next used (a drive each, and a run fails at its fifth failed drive in a row)."""
    app = f"sweep_{uuid.uuid4().hex[:12]}"
    pool = await open_pool(f"{database_url}&application_name={app}", max_size=SESSIONS)
    try:

        async def use() -> None:
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_sleep(0.05)")

        together = asyncio.Barrier(SESSIONS)

        async def hold() -> None:
            # Held at once, so the pool opens them all: the pool grows one session at a
            # time, and a short use could hand a slow-to-open one's caller a freed one.
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
                await together.wait()

        await asyncio.gather(*(hold() for _ in range(SESSIONS)))  # all of them open, idle
        assert pool.get_stats()["pool_available"] == SESSIONS
        with psycopg.connect(pg_base_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (app,),
            )

        with pytest.raises(psycopg.OperationalError):
            await use()
        assert pool.sweeping is not None
        await pool.sweeping
        for _ in range(2 * SESSIONS):
            await use()
    finally:
        await pool.close()
