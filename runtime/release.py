"""How a drive gives its run back: the writes it deferred, then its lease.

A release that meets the database away (most often what ended the drive) is tried
again in the background until the database is back, within a lease: left alone,
the run would wait out its lease and be taken over as if its worker had died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runtime.dberrors import TRANSIENT_DB_ERRORS
from runtime.store.base import LeaseLost, RunStore

log = logging.getLogger("runtime.engine")  # a drive's, like the rest of its records

RELEASE_RETRY_MAX_S = 2.0
"""The longest wait between two tries of a release the database refused."""


def collected(task: asyncio.Future[None]) -> None:
    """Retrieve the end of work shielded from a drive that went on (see
    ``Engine._until_lease_lost``), or left by one (a release tried again): a lease lost
    is expected there, anything else logged."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, LeaseLost):
        log.warning("work a drive left running failed: %r", exc)


async def flush_quietly(store: RunStore) -> None:
    """Write what a drive deferred (a node it started) before the run changes hands.

    Lost with the lease or the database, it is written again by the next drive,
    which starts the node again."""
    try:
        await store.flush()
    except LeaseLost:  # the holder now starts the node again: nothing went wrong here
        log.info("a drive's deferred state change was left to the run's new holder")
    except Exception:  # the run must still be released
        log.warning("a drive's deferred state change was not written", exc_info=True)
    finally:
        store.close_journal()


def lease_lost(store: RunStore, run_id: str) -> None:
    # (Or, ended, the run was pruned as its drive let go.)
    log.warning("lost the lease on %s; another worker drives it now, or it was pruned", run_id)
    store.close_journal()


async def release_when_back(release: Callable[[], Awaitable[None]], lease_s: float) -> None:
    """A drive's release, which met the database away, tried again until it is back.
    Left alone, the run would wait out its lease once it is, and be taken over as if
    its worker had died: a WORKER_LOST on its record, and one more takeover towards
    making it a suspect. Past a lease, any worker may take it anyway."""
    loop = asyncio.get_running_loop()
    until = loop.time() + lease_s
    delay = 0.05
    while loop.time() + delay < until:
        await asyncio.sleep(delay)
        try:
            await release()
            return
        except TRANSIENT_DB_ERRORS:
            delay = min(delay * 2, RELEASE_RETRY_MAX_S)
    log.warning("could not give a run back within its lease; it is taken over when it ends")


@dataclass
class Releases:
    """The releases of one engine's drives."""

    store: RunStore
    owner: str
    """The engine's worker name, which its leases are held under."""
    lease_s: float
    wake: Callable[[], None]
    """Tells the engine's worker there may be a run to claim."""
    shutting_down: bool = False
    """Set by the engine's shutdown: a release that fails then is not tried again."""
    releasing: set[asyncio.Task[None]] = field(default_factory=set)
    """Releases tried again until the database is back (:func:`release_when_back`)."""

    async def release(
        self,
        run_id: str,
        version: int,
        needs_drive: bool | None,
        retry_in: float | None = None,
        failures: int | None = None,
        *,
        active_s: float | None = None,
        backoff_cancel: bool = False,
    ) -> None:
        """Give the lease back (see ``RunStore.release_lease``), now or once the
        database is back."""

        async def release() -> None:
            pending = await self.store.release_lease(
                run_id,
                self.owner,
                version,
                needs_drive=needs_drive,
                retry_in=retry_in,
                failures=failures,
                active_s=active_s,
                backoff_cancel=backoff_cancel,
            )
            if retry_in is not None and pending is not None:
                # Any worker may retry it then; this one wakes for it, not at its sweep.
                asyncio.get_running_loop().call_later(retry_in, self.wake)
            if pending:
                # Decided, cancelled or handed back while we drove it: a worker (this
                # one, most likely) claims it again. Its NOTIFY came while we held it.
                self.wake()

        try:
            await release()
        except TRANSIENT_DB_ERRORS:
            if self.shutting_down:  # its lease lapses: nothing may outlive the shutdown
                return
            task = asyncio.create_task(
                release_when_back(release, self.lease_s), name=f"release:{run_id}"
            )
            self.releasing.add(task)
            task.add_done_callback(self.releasing.discard)
            task.add_done_callback(collected)

    async def stop(self) -> None:
        """Stop the releases tried again: their leases lapse instead."""
        for task in list(self.releasing):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
