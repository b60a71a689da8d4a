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

An outcome still unrecorded when the lease may be gone is kept by the engine
(:class:`Unrecorded`): the next drive of the run in this process records it instead of
calling it unknown. Another process's drive cannot know it, and does as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from runtime.dberrors import TRANSIENT_DB_ERRORS

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_BASE_S = 0.02
"""The wait before the first retry, doubled for each further one: a pool may hold
several broken connections after a blip, each failing at once, and is drained fast."""
RETRY_MAX_S = 0.5
WITHOUT_LEASE_S = 5.0
"""How long a write is retried where no lease bounds it (a graph run outside the
engine, a unit test): a blip's length, not an outage's."""
MOST_KEPT = 256
"""Unrecorded outcomes an engine keeps at most; past it the oldest is let go (its call
is then unknown to the next drive, as it would be to another process's)."""
MOST_KEPT_BYTES = 64 * 1024 * 1024
"""Their outputs' JSON an engine keeps at most, the newest kept whatever its size: an
outage that outlasts leases while tools return megabytes must not grow the process
without end."""


@dataclass(frozen=True)
class Finished:
    """A call's outcome as its handler left it, not yet in the ledger."""

    run_id: str
    attempts: int
    """The row's attempts when its handler returned: a later claim means someone ran it
    again."""
    status: str
    output: Any
    error: dict[str, Any] | None


class Unrecorded:
    """Outcomes of calls this engine ran to their end but could not record, by
    tool_call_id, until a later drive records them (bounded: :data:`MOST_KEPT`,
    :data:`MOST_KEPT_BYTES`)."""

    def __init__(self, most: int = MOST_KEPT, most_bytes: int = MOST_KEPT_BYTES) -> None:
        self._kept: OrderedDict[str, Finished] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._most = most
        self._most_bytes = most_bytes

    def keep(self, tool_call_id: str, finished: Finished) -> None:
        self.forget(tool_call_id)
        self._kept[tool_call_id] = finished
        self._sizes[tool_call_id] = _size(finished.output)
        while len(self._kept) > 1 and (
            len(self._kept) > self._most or sum(self._sizes.values()) > self._most_bytes
        ):
            dropped = next(iter(self._kept))
            self.forget(dropped)
            log.warning("let go of the unrecorded outcome of %s: too much kept", dropped)

    def find(self, tool_call_id: str, attempts: int) -> Finished | None:
        """The outcome kept for the call's attempt ``attempts`` (one of another attempt
        is stale: the call has been run again since, and is forgotten)."""
        finished = self._kept.get(tool_call_id)
        if finished is not None and finished.attempts != attempts:
            self.forget(tool_call_id)
            return None
        return finished

    def of_run(self, run_id: str) -> list[tuple[str, Finished]]:
        """The outcomes kept for the run's calls, by tool_call_id."""
        return [(key, kept) for key, kept in self._kept.items() if kept.run_id == run_id]

    def forget(self, tool_call_id: str) -> None:
        self._kept.pop(tool_call_id, None)
        self._sizes.pop(tool_call_id, None)

    def __len__(self) -> int:
        return len(self._kept)


def _size(output: Any) -> int:
    """The output's size as the ledger would write it, roughly: measured once, on a path
    an outage alone takes. One JSON cannot hold (a cycle) is never written: it counts
    nothing, and must not replace the error that is being kept for."""
    try:
        return len(json.dumps(output, default=str))
    except (TypeError, ValueError, RecursionError):
        return 0


class WriteUnanswered(ConnectionError):
    """A retried write the database did not answer by its bound: as transient as any
    database error (the drive is retried), and not a ``TimeoutError``, which out of a
    graph means the run's own time budget ran out."""


class Recording:
    """How a drive records its calls' outcomes: the engine's :class:`Unrecorded`, and
    until when (``time.monotonic()``) the drive's lease surely holds."""

    def __init__(
        self, kept: Unrecorded | None = None, held_until: Callable[[], float] | None = None
    ) -> None:
        self.kept = kept if kept is not None else Unrecorded()
        self._held_until = held_until

    def bound(self) -> Callable[[], float]:
        """Until when (``time.monotonic()``) a write failing from now on is tried again:
        the lease's end as of its first failure (see :func:`with_retries`). Past it the
        lease may have expired, and another worker may drive the run (its fence would
        refuse the write; trying on would only hold this drive, and a shutdown waiting
        for it)."""
        if self._held_until is not None:
            return self._held_until
        deadline = time.monotonic() + WITHOUT_LEASE_S
        return lambda: deadline

    async def outcome(
        self, tool_call_id: str, finished: Finished, write: Callable[[], Awaitable[T]]
    ) -> T:
        """``write()`` of the call's ``finished`` outcome, tried again through a blip
        (:func:`with_retries`); kept for a later drive if it still fails."""
        try:
            written = await with_retries(write, self.bound(), f"the outcome of {tool_call_id}")
        except Exception:
            # Whatever failed, the outcome is true: a drive that finds the call as this
            # one left it (running, at this attempt) may record it.
            self.kept.keep(tool_call_id, finished)
            raise
        self.kept.forget(tool_call_id)
        return written


async def with_retries(
    write: Callable[[], Awaitable[T]], until: Callable[[], float], what: str
) -> T:
    """``write()``, tried again on a transient database error until ``until()``
    (monotonic) as it is at the first failure; the last error is raised. Only for a
    write safe to repeat."""
    tries = 0
    deadline: float | None = None
    while True:
        tries += 1
        try:
            if deadline is None:
                return await write()
            # A retry ends at the bound too: one waiting for a pooled connection (the
            # pool's own timeout is 30 s) would hold the drive that long past it.
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    return await write()
            except TimeoutError as exc:
                raise WriteUnanswered(f"no answer to the write of {what} by its bound") from exc
        except TRANSIENT_DB_ERRORS as exc:
            if deadline is None:
                # Not moved on by the renewals that follow: a failure that lasts (a disk
                # full for the output, not for a renewal's few bytes) would hold the
                # drive, and a cancel of its run, for ever; once the drive has failed,
                # the count of failed drives bounds it (README: the fifth ends the run).
                deadline = until()
            delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (tries - 1))
            if time.monotonic() + delay > deadline:
                raise
            log.warning("could not record %s (try %d): %r; trying again", what, tries, exc)
            await asyncio.sleep(delay)
