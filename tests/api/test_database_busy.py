"""A database that cannot serve a request is a 503 the client may retry, not a 500."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import make_settings, open_api
from tests.api.helpers import problem


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
