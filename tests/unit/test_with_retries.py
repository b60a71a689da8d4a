"""``runtime.recording.with_retries``: a write tried again through a blip, up to a
bound. The write stands in for the database here (the blip tests drive real ones):
what is tested is where the retries stop."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from runtime.recording import with_retries


class Stuck:
    """A write that fails at once, then hangs as one waiting for a pooled connection
    does (psycopg_pool's own timeout is 30 s)."""

    def __init__(self) -> None:
        self.tries = 0

    async def __call__(self) -> str:
        self.tries += 1
        if self.tries == 1:
            raise psycopg.OperationalError("the connection was closed")
        await asyncio.sleep(3600)
        return "written"


async def test_a_retry_waiting_on_the_database_ends_at_the_bound() -> None:
    write = Stuck()
    bound = time.monotonic() + 0.3

    async with asyncio.timeout(10):  # the pool's wait, had the retry not been bounded
        with pytest.raises(TimeoutError):
            await with_retries(write, lambda: bound, "a test's outcome")

    assert write.tries == 2


async def test_a_retry_that_succeeds_within_the_bound_is_its_result() -> None:
    tries = 0

    async def write() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise psycopg.OperationalError("the connection was closed")
        return "written"

    assert await with_retries(write, lambda: time.monotonic() + 5, "a test's outcome") == "written"
    assert tries == 3
