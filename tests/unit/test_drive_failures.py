"""A drive that ends on a database error: retried with a backoff, and failed with
CHECKPOINT_ERROR when the failure lasts (DESIGN §8), never re-driven forever.

The database is a real PostgreSQL that refuses checkpoints the way a full disk does:
a trigger raises SQLSTATE 53100 (``disk_full``, an OperationalError to psycopg) for
every checkpoint past the one written after the counter tool ran, while the run
store's tables still take writes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from runtime.errors import Code
from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.retry import DriveRetry
from server.host import Host, open_host
from server.settings import Settings
from tests.agents import counter_lines

pytestmark = pytest.mark.postgres

MAX_FAILURES = 3
RETRY_S = 0.2
DRIVE_ERROR = "database error while driving"


def refuse_checkpoints(url: str, *, after_step: int, times: int | None) -> None:
    """Checkpoints past ``after_step`` fail with disk_full (the first ``times`` of them;
    all of them if None)."""
    # A sequence counts the refusals: nextval() is not rolled back with the failed insert.
    more = "TRUE" if times is None else f"nextval('refusals') <= {times}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE refusals")
        conn.execute(
            f"""CREATE FUNCTION refuse() RETURNS trigger AS $$
            BEGIN
                IF (NEW.metadata->>'step')::int > {after_step} AND {more} THEN
                    RAISE EXCEPTION 'could not extend file: No space left on device'
                        USING ERRCODE = 'disk_full';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql"""
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON checkpoints "
            "FOR EACH ROW EXECUTE FUNCTION refuse()"
        )


def drive_failures(url: str, run_id: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT drive_failures FROM runs WHERE run_id = %s", (run_id,))
        return int(row.fetchone()[0])  # type: ignore[index]


@pytest.fixture
async def host(pg_schema_url: str, data_dir: Path) -> AsyncIterator[Host]:
    settings = Settings(
        data_dir=data_dir,
        database_url=pg_schema_url,
        extra_agents=["tests.agents:build_agents"],
        max_drive_failures=MAX_FAILURES,
        drive_retry_seconds=RETRY_S,
    )
    async with open_host(settings) as opened:
        yield opened


async def test_a_checkpoint_the_database_keeps_refusing_fails_the_run(
    host: Host, pg_schema_url: str, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Step 3 is the executor's checkpoint: counter has run, its outcome is in the ledger.
    refuse_checkpoints(pg_schema_url, after_step=3, times=None)
    with caplog.at_level(logging.ERROR, logger="runtime.engine"):
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="0.01"))
        final = await host.engine.wait_settled(run.run_id, within_s=30)

    assert final.state is State.FAILED
    assert final.outcome is not None and final.outcome.code is Code.CHECKPOINT_ERROR
    assert "could not persist" in final.outcome.message
    # The effect that happened is reported, and happened once: no retry re-ran it.
    calls = await host.store.list_tool_calls(run.run_id)
    assert [(c.tool, c.status, c.attempts) for c in calls] == [("counter", "succeeded", 1)]
    assert final.outcome.side_effects == [calls[0].tool_call_id]
    assert len(counter_lines(data_dir)) == 1
    errors = [e.data for e in await host.store.list_events(run.run_id) if e.type == "error"]
    # The step decided after it (the sleep) never ran, and says so.
    assert [(e["code"], e.get("step_index")) for e in errors] == [
        ("CALL_NOT_RUN", 1),
        ("CHECKPOINT_ERROR", None),
    ]
    # Driven exactly MAX_FAILURES times, the waits between them doubling (the engine
    # wakes for a retry when it is due, not at its next sweep: a constant wait fails).
    failed = [r for r in caplog.records if r.getMessage().startswith(DRIVE_ERROR)]
    assert len(failed) == MAX_FAILURES, [r.getMessage() for r in failed]
    gaps = [b.created - a.created for a, b in itertools.pairwise(failed)]
    assert gaps[0] >= RETRY_S and gaps[1] >= 2 * RETRY_S, gaps
    assert gaps[0] < RETRY_S + 0.5, gaps  # retried when due, not at the 1 s sweep
    assert drive_failures(pg_schema_url, run.run_id) == 0  # ended: nothing left to count


async def test_a_database_blip_is_retried_and_the_run_goes_on(
    host: Host, pg_schema_url: str, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_checkpoints(pg_schema_url, after_step=3, times=MAX_FAILURES - 1)
    with caplog.at_level(logging.ERROR, logger="runtime.engine"):
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="0.01"))
        final = await host.engine.wait_settled(run.run_id, within_s=30)

    assert final.state is State.SUCCEEDED, final.outcome
    failed = [r for r in caplog.records if r.getMessage().startswith(DRIVE_ERROR)]
    assert len(failed) == MAX_FAILURES - 1
    calls = await host.store.list_tool_calls(run.run_id)
    assert [(c.tool, c.attempts) for c in calls] == [("counter", 1), ("sleep", 1)]
    assert len(counter_lines(data_dir)) == 1
    # The count starts again after a drive that did not fail: a later blip gets the
    # whole allowance.
    assert drive_failures(pg_schema_url, run.run_id) == 0


def test_the_wait_between_drives_stays_bounded_however_long_the_outage() -> None:
    """A cancel's drive is never given up on: its count of failures grows with the
    outage (one a minute), and a wait computed past 2**1023 overflowed, failing the
    drive without its release."""
    retry = DriveRetry()
    waits = [retry.delay(failures) for failures in (1, 2, 7, 8, 1025, 10**6)]
    assert waits == [1.0, 2.0, 60.0, 60.0, 60.0, 60.0]
