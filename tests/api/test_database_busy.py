"""A database that cannot serve a request is a 503 the client may retry, not a 500."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from tests.api.conftest import Api, make_settings, open_api
from tests.api.helpers import parked_demo_run, problem


async def test_a_pool_with_no_free_connection_is_a_503(pg_schema_url: str, data_dir: Path) -> None:
    """The race probe saw a 500 with a traceback when every connection of the pool stayed
    busy through its wait (psycopg_pool.PoolTimeout) under 25 event streams."""
    async with open_api(make_settings(pg_schema_url, data_dir, db_pool_size=2)) as api:
        run = await api.create(agent_id="typo_fixer", input="x")
        await api.settle(run["run_id"])
        pool = api.engine_services.store.pool  # type: ignore[attr-defined]
        pool.timeout = 0.3  # the wait a request's statement gets for a connection
        held = [await pool.getconn() for _ in range(pool.max_size)]
        try:
            busy = await api.client.get(f"/runs/{run['run_id']}")
        finally:
            for conn in held:
                await pool.putconn(conn)

        body = problem(busy, 503, "UNAVAILABLE")
        assert busy.headers["retry-after"] == "1" and "try again" in body["detail"]
        assert (await api.client.get(f"/runs/{run['run_id']}")).status_code == 200


NO_END = """
CREATE FUNCTION no_end() RETURNS trigger AS $$ BEGIN
  IF NEW.outcome::text LIKE '%RUN_CANCELLED%' THEN
    RAISE EXCEPTION 'no space' USING ERRCODE = 'disk_full';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER no_end BEFORE UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION no_end();
"""


async def test_a_cancel_whose_end_cannot_be_written_backs_off_then_ends(
    pg_schema_url: str, data_dir: Path
) -> None:
    """The drive carrying out a cancel fails on the database (a full disk, say): it is
    a failed drive, counted and retried after a backoff, not a loop of drives that
    claim, fail and hand back at once (the review measured 1,000 in 3 s); and past the
    failures that fail a run CHECKPOINT_ERROR it is retried still: the cancel, and any
    compensation asked for, would be lost."""
    settings = make_settings(
        pg_schema_url,
        data_dir,
        lease_seconds=2.0,
        max_drive_failures=2,
        drive_retry_seconds=0.2,
    )
    async with open_api(settings) as api:
        run = await api.create(agent_id="slow_worker", input="sleep 30")
        run_id = run["run_id"]
        await api.wait_event(run_id, lambda e: e["data"].get("tool") == "sleep")
        async with await psycopg.AsyncConnection.connect(pg_schema_url, autocommit=True) as db:
            await db.execute(NO_END)
            await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})
            await asyncio.sleep(3)
            cur = await db.execute(
                "SELECT state, lease_version, drive_failures FROM runs WHERE run_id = %s",
                (run_id,),
            )
            state, leases, failures = await cur.fetchone()  # type: ignore[misc]
            await db.execute("DROP TRIGGER no_end ON runs")

        assert state == "executing" and failures >= 2
        assert leases <= 8, f"{leases} leases in 3 s: the drives did not back off"
        final = await api.settle(run_id)
        for _ in range(100):  # the next retry, after its backoff
            if final["state"] == "failed":
                break
            await asyncio.sleep(0.1)
            final = (await api.client.get(f"/runs/{run_id}")).json()
        assert (final["state"], final["outcome"]["code"]) == ("failed", "RUN_CANCELLED"), final


async def test_a_stream_whose_read_the_database_fails_ends_cleanly(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Its response has started: no problem document can follow, and the error was an
    unhandled one (a 500 in the log) with a body cut off mid-chunk. It ends instead,
    whole, and the client reconnects with its Last-Event-ID."""
    run_id, _, _ = await parked_demo_run(api)
    async with api.engine_services.store.tx() as tx:  # a real error on the log's read
        await tx.execute("ALTER TABLE events RENAME TO events_away")
    try:
        resp = await asyncio.wait_for(
            api.client.get(f"/runs/{run_id}/events", headers={"Accept": "text/event-stream"}), 10
        )
    finally:
        async with api.engine_services.store.tx() as tx:
            await tx.execute("ALTER TABLE events_away RENAME TO events")
    assert resp.status_code == 200
    assert resp.text == "retry: 1000\n\n"
    assert "ended on a database error" in caplog.text
    assert "unhandled" not in caplog.text
    assert await api.events(run_id)  # the log is read again as the reconnect would
