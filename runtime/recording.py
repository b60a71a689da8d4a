"""Recording a finished call's outcome through a database blip.

Once a handler has returned, its outcome is known only to this process until the
ledger holds it. A write that fails on a database error then (a failover, sessions
ended, a connection the pool still held broken) used to fail the drive, and the next
drive, finding the call ``running`` with its attempt counted, could only call its
outcome unknown and ask a human: an effect that surely happened, offered to be run
again. So the write is tried again, on a fresh pooled connection each time (psycopg's
pool discards a broken one as it comes back), for as long as the drive's lease surely
holds. Repeating it is safe: it moves the row on only from ``running``, under the
lease's fence, and a write after the lease went to another worker is refused
(:class:`LeaseLost`, never retried).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_BASE_S = 0.02
"""The wait before the first retry, doubled for each further one: a pool may hold
several broken connections after a blip, each failing at once, and is drained fast."""
RETRY_MAX_S = 0.5
WITHOUT_LEASE_S = 5.0
"""How long a write is retried where no lease bounds it (a graph run outside the
engine, a unit test): a blip's length, not an outage's."""


class Recording:
    """How a drive records its calls' outcomes: until when (``time.monotonic()``) the
    drive's lease surely holds."""

    def __init__(self, held_until: Callable[[], float] | None = None) -> None:
        self._held_until = held_until

    def bound(self) -> Callable[[], float]:
        """Until when (``time.monotonic()``) a write failing from now on is tried again:
        the lease's end, which a renewal meanwhile moves on. Past it the lease may have
        expired, and another worker may drive the run (its fence would refuse the write;
        trying on would only hold this drive, and a shutdown waiting for it)."""
        if self._held_until is not None:
            return self._held_until
        deadline = time.monotonic() + WITHOUT_LEASE_S
        return lambda: deadline


async def with_retries(
    write: Callable[[], Awaitable[T]], until: Callable[[], float], what: str
) -> T:
    """``write()``, tried again on a transient database error until ``until()``
    (monotonic); the last error is raised. Only for a write safe to repeat."""
    from runtime.retry import TRANSIENT_DB_ERRORS  # here: runtime.retry imports the ledger

    tries = 0
    while True:
        tries += 1
        try:
            return await write()
        except TRANSIENT_DB_ERRORS as exc:
            delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (tries - 1))
            if time.monotonic() + delay > until():
                raise
            log.warning("could not record %s (try %d): %r; trying again", what, tries, exc)
            await asyncio.sleep(delay)
