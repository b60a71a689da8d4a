"""The worker loop: claim runs that need driving, keep their leases alive, give them back.

Woken by the engine in-process and by PostgreSQL NOTIFY across processes; a
slow sweep also picks up runs whose owner died (their lease expired) and
notifications missed while the database was unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable

from runtime.aio import within
from runtime.dberrors import TRANSIENT_DB_ERRORS
from runtime.engine import Engine

log = logging.getLogger(__name__)

HEARTBEAT = "worker:heartbeat"


class Worker:
    def __init__(
        self, engine: Engine, *, concurrency: int = 8, sweep_s: float | None = None
    ) -> None:
        self.engine = engine
        self.concurrency = concurrency
        self.sweep_s = sweep_s if sweep_s is not None else min(1.0, engine.lease_s / 4)
        self._stopping = asyncio.Event()
        self._stop: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.engine.renews_leases = True
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="worker:claim"),
            asyncio.create_task(self._heartbeat_loop(), name=HEARTBEAT),
            asyncio.create_task(self._unfreeze_loop(), name="worker:unfreeze"),
        ]

    def begin_stop(self, grace_s: float = 10.0) -> None:
        """Start :meth:`stop` without waiting for it: its grace counts from now (a
        server begins it as its HTTP side drains, not after: one slow request doubled
        the shutdown)."""
        if self._stop is None:
            self._stop = asyncio.create_task(self._stopped(grace_s), name="worker:stop")

    def hurry(self) -> None:
        """End the stop's grace now, or as it begins (see ``Engine.hurry``)."""
        self.engine.hurry()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop claiming, let current drives finish for ``grace_s``, release the rest
        (the grace of the first call, where :meth:`begin_stop` came first)."""
        self.begin_stop(grace_s)
        assert self._stop is not None
        await self._stop

    async def _stopped(self, grace_s: float) -> None:
        self._stopping.set()
        self.engine.renews_leases = False  # take no more leases (a cancel's, say)
        self.engine.wake()
        # The heartbeat goes on through the grace: a grace longer than what was left of
        # a lease let another worker take over a run whose drive was still finishing.
        # Not past the grace and a lease, though: a drive that will not stop (shielded
        # work that hangs) must not keep its run from every other worker for ever.
        heartbeat = [t for t in self._tasks if t.get_name() == HEARTBEAT]
        others = [t for t in self._tasks if t not in heartbeat]
        await _cancelled(others)
        loop = asyncio.get_running_loop()
        cap = [loop.call_later(grace_s + self.engine.lease_s, t.cancel) for t in heartbeat]
        try:
            await self.engine.shutdown(grace_s)
        finally:
            for timer in cap:
                timer.cancel()
            await _cancelled(heartbeat)

    async def _claim_loop(self) -> None:
        await self._tell_of_runs_left_to_others()
        engine = self.engine
        loop = asyncio.get_running_loop()
        backoff = self.sweep_s
        next_check = 0.0  # when to look for suspects again (a sweep's pace, not a wake's)
        draining = False  # a suspect waits for a worker with nothing else to drive
        while not self._stopping.is_set():
            engine.work.clear()
            free = self.concurrency - engine.running()
            claimed: list[tuple[str, int]] = []
            due = loop.time() >= next_check
            failed = False
            try:
                idle = not (engine.running() or engine.taking_cancels)
                if idle and (due or draining):
                    next_check, draining = loop.time() + self.sweep_s, False
                    engine.claiming_suspect = True
                    try:
                        suspects = await self._claim(self._suspect())
                    finally:
                        engine.claiming_suspect = False
                    for suspect in suspects:
                        engine.start_drive(*suspect, isolated=True)
                elif due and not idle and not engine.isolating():
                    next_check = loop.time() + self.sweep_s
                    # Busy workers would keep a suspect waiting for ever: after a lease
                    # of waiting, one of them takes no more runs until it is idle.
                    draining = await engine.store.drain_for_suspect(
                        engine.owner,
                        engine.retry.max_takeovers,
                        engine.lease_s,
                        engine.lease_s,
                        agents=engine.agents.keys(),
                    )
                if not (engine.isolating() or draining):
                    claimed = await self._claim(
                        engine.store.claim_runs(
                            engine.owner,
                            free,
                            engine.lease_s,
                            engine.retry.max_takeovers,
                            agents=engine.agents.keys(),
                        )
                    )
                backoff = self.sweep_s
            except TRANSIENT_DB_ERRORS:
                log.warning("cannot claim runs: database unreachable; retrying in %.1fs", backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception:  # a worker that stops claiming in silence serves nobody
                log.exception("claiming runs failed; retrying in %.1fs", backoff)
                failed = True
            if failed:  # a bug: at the backoff's pace, not at every wake's
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            for run_id, version in claimed:
                # A run this process still drives, leased again: that drive's lease lapsed
                # (renewals failed for a lease); the new lease takes over from it at once.
                engine.start_drive(run_id, version)
            if claimed and len(claimed) == free:
                continue  # there may be more waiting
            # Full, isolating or draining: a drive that ends (or moves on) wakes us.
            engine.full = engine.running() >= self.concurrency or engine.isolating() or draining
            await within(backoff, engine.work.wait())

    async def _tell_of_runs_left_to_others(self) -> None:
        """Say, once at the start, which waiting runs are of agents this process lacks:
        its claims leave them for a process that has the agent, and where none has it
        (a server restarted without an agent module), nothing else would tell why they
        do not move."""
        try:
            waiting = await self.engine.store.waiting_agents()
        except Exception:  # the database away at the start: the claims say so and retry
            log.debug("cannot count the waiting runs by agent", exc_info=True)
            return
        for agent_id, n in sorted(waiting.items()):
            if agent_id not in self.engine.agents:
                log.warning(
                    "%d run(s) of agent %s wait for a process that has it; this one "
                    "does not (give serve and every worker the same agents)",
                    n,
                    agent_id,
                )

    async def _suspect(self) -> list[tuple[str, int]]:
        engine = self.engine
        got = await engine.store.claim_suspect(
            engine.owner, engine.lease_s, engine.retry.max_takeovers, agents=engine.agents.keys()
        )
        return [] if got is None else [got]

    async def _claim(self, claiming: Awaitable[list[tuple[str, int]]]) -> list[tuple[str, int]]:
        """A claim's leases, the claim run to its end: a worker stopping meanwhile gives
        them back at once rather than let them lapse as if it had died (a takeover
        counted against each run, and a suspect failed for it)."""
        engine = self.engine
        task = asyncio.ensure_future(claiming)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # Bounded: a stop must not hang on a database that has gone away (the
            # leases then lapse, as a dead worker's do).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(engine.lease_s):
                    for run_id, version in await task:
                        await engine.store.give_back_claim(run_id, engine.owner, version)
            task.cancel()
            raise

    async def _heartbeat_loop(self) -> None:
        """Until cancelled: it outlives the stop of claims (see :meth:`stop`)."""
        engine = self.engine
        interval = engine.lease_s / 3
        while True:
            await asyncio.sleep(interval)
            leases = [
                (run_id, d.version, None if d.active_s is None else d.active_s())
                for run_id, d in engine.drives.items()
            ]
            if not leases:
                continue
            sent = time.monotonic()  # a renewal granted holds from no earlier than this
            try:
                held = await engine.store.renew_leases(engine.owner, leases, engine.lease_s)
            except TRANSIENT_DB_ERRORS:
                log.warning("cannot renew leases: database unreachable")
                continue
            except Exception:  # a heartbeat that stops in silence: every lease lapses
                log.exception("renewing leases failed")
                continue
            for run_id, version, _ in leases:
                drive = engine.drives.get(run_id)
                if run_id in held and drive is not None and drive.version == version:
                    drive.renewed = sent
                # The drive whose lease this was: a later one of the run (claimed again once
                # that lease was released) holds a lease of its own, and keeps it.
                if run_id not in held and drive is not None and drive.version == version:
                    # Someone else owns it now (or, ended, it was pruned as its drive
                    # let go): stop without writing anything more.
                    log.warning(
                        "lease on %s is not ours any more (taken over, or the run pruned);"
                        " stopping its drive",
                        run_id,
                    )
                    drive.lease_lost = True
                    drive.task.cancel()

    async def _unfreeze_loop(self) -> None:
        """End sessions frozen mid-pipeline (``end_frozen_sessions``) once they have held
        on for two leases: the run they hold locked is then free for a claim or a
        cancel. (A live process is never mid-transaction that long: its loop would
        have missed renewing its own leases a lease before.)"""
        engine = self.engine
        while not self._stopping.is_set():
            await asyncio.sleep(engine.lease_s / 2)
            try:
                ended = await engine.store.end_frozen_sessions(2 * engine.lease_s)
            except TRANSIENT_DB_ERRORS:
                continue  # the heartbeat says so already
            except Exception:
                log.exception("could not look for frozen database sessions")
                continue
            for row in ended:
                if not row["ended"]:  # gone already, or another worker was first
                    continue
                log.warning(
                    "ended database session %s (from %s): frozen in mid-transaction for "
                    "%.0fs, its process paused or gone",
                    row["pid"],
                    row["client"],
                    row["held_s"],
                )
                engine.metrics.inc("frozen_sessions_ended_total")


async def _cancelled(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
