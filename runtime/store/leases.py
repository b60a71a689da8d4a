"""Run leases: which worker drives which run, until when, under which fencing token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.store.core import (
    CANCEL_CHANNEL,
    ENDED,
    EVENTS_CHANNEL,
    WORK_CHANNEL,
    Row,
    StoreCore,
)

__all__ = ["CANCEL_CHANNEL", "EVENTS_CHANNEL", "WORK_CHANNEL", "LeaseQueries"]

CLAIM_SPARE = 16
"""Ranked runs a claim considers beyond its ``limit``, for those another worker is
locking at that moment; a claim left short takes the rest at its next wake or sweep."""


TAKE_OVER = (
    "taken_from = CASE WHEN lease_owner = ? THEN NULL ELSE lease_owner END, "
    "takeovers = CASE WHEN lease_owner IS NULL OR lease_owner = ? "
    "THEN takeovers ELSE takeovers + 1 END"
)
"""Part of every lease grant (its two parameters: the new owner): the owner of the
lease it replaces. A released lease has none; one that expired unreleased names the
worker that died or stalled (SQL's SET reads the row as it was), and counts one more
takeover in a row. A worker taking back its own lease (it could not renew it) is
neither. A release, or a drive that checkpoints a step, counts from zero again."""

SUSPECT_ROWS = "needs_drive = 1 AND (lease_owner IS NOT NULL OR takeovers > 0)"
"""The only waiting runs that can be suspects (the predicate of their partial index)."""


def blame(runs: str) -> str:
    """The takeovers in a row a lease grant would leave ``runs`` with (a worker's own
    expired lease counted too: it may not be ours)."""
    return f"({runs}.takeovers + CASE WHEN {runs}.lease_owner IS NULL THEN 0 ELSE 1 END)"


class LeaseQueries(StoreCore):
    """Mixed into RunStore; ``now_sql`` is the database's clock in epoch seconds."""

    async def claim_runs(
        self, owner: str, limit: int, lease_s: float, max_takeovers: int | None = None
    ) -> list[tuple[str, int]]:
        """Claim up to ``limit`` runs that need driving and have no live lease, and are
        no suspects: ``max_takeovers`` or more takeovers in a row (see
        :meth:`claim_suspect`; None: suspects too).

        Returns (run_id, lease_version) pairs; the version is the fencing token.
        Uses the database's clock, so workers' clocks need not agree.
        """
        if limit <= 0:
            return []

        # Tenants take turns: a tenant's waiting runs are ranked after the runs it has
        # under a live lease, so a worker whose slots free one at a time gives the next
        # one to the tenant with the fewest, not to the oldest run of a tenant's burst.
        # The ranking reads only waiting and leased runs (partial indexes, migration 8)
        # and hands the lock a short list in order.
        # One statement: the rows are locked (skipping those another worker is claiming
        # right now) and leased together, one round trip where the dialect autocommits.
        # In a CTE, not an IN (subquery): PostgreSQL may re-run a subquery on the inner
        # side of a join, and with SKIP LOCKED each re-run can lock other rows, so more
        # than ``limit`` runs would be leased. A locking CTE runs once. The conditions
        # are repeated on the locked rows: PostgreSQL rechecks those (not the ranking's
        # snapshot) on a row another worker has just leased.
        now = self.now_sql

        def ready(runs: str) -> str:
            innocent = "" if max_takeovers is None else f" AND {blame(runs)} < {max_takeovers:d}"
            return (
                f"{runs}.needs_drive = 1 AND ({runs}.lease_expires_at IS NULL "
                f"OR {runs}.lease_expires_at < {now}){innocent}"
            )

        rows = await self.write_once(
            "WITH held AS (SELECT tenant_id, COUNT(*) AS n FROM runs "
            f"WHERE lease_owner IS NOT NULL AND lease_expires_at >= {now} GROUP BY tenant_id), "
            "waiting AS (SELECT run_id, tenant_id, updated_at, ROW_NUMBER() OVER "
            "(PARTITION BY tenant_id ORDER BY updated_at, run_id) AS n "
            f"FROM runs AS r WHERE {ready('r')}), "
            "ranked AS (SELECT w.run_id, w.updated_at, w.n + COALESCE(h.n, 0) AS turn "
            "FROM waiting AS w LEFT JOIN held AS h ON h.tenant_id = w.tenant_id "
            "ORDER BY turn, w.updated_at, w.run_id LIMIT ?), "
            "picked AS (SELECT runs.run_id FROM runs JOIN ranked ON ranked.run_id = runs.run_id "
            f"WHERE {ready('runs')} "
            f"ORDER BY ranked.turn, ranked.updated_at, runs.run_id LIMIT ?{self.skip_locked}) "
            f"UPDATE runs SET {TAKE_OVER}, lease_owner = ?, "
            f"lease_expires_at = {self.now_sql} + ?, lease_version = lease_version + 1 "
            "WHERE run_id IN (SELECT run_id FROM picked) RETURNING run_id, lease_version",
            (limit + CLAIM_SPARE, limit, owner, owner, owner, lease_s),
        )
        return [(row["run_id"], int(row["lease_version"])) for row in rows]

    async def claim_suspect(
        self, owner: str, lease_s: float, max_takeovers: int
    ) -> tuple[str, int] | None:
        """Claim the oldest waiting suspect: a run whose leases expired unreleased
        ``max_takeovers`` times in a row (this grant's included) with no step
        checkpointed in between. Every run a dead worker held is taken over, the one
        that killed it and those beside it alike: only a worker that drives nothing else
        may take a suspect, and it takes nothing else until the suspect has moved on,
        so that a suspect that kills it again has done it alone."""
        now = self.now_sql
        rows = await self.write_once(
            "WITH picked AS (SELECT run_id FROM runs "
            f"WHERE {SUSPECT_ROWS} AND (lease_expires_at IS NULL OR lease_expires_at < {now}) "
            f"AND {blame('runs')} >= {int(max_takeovers)} "
            f"ORDER BY updated_at, run_id LIMIT 1{self.skip_locked}) "
            f"UPDATE runs SET {TAKE_OVER}, lease_owner = ?, "
            f"lease_expires_at = {now} + ?, lease_version = lease_version + 1 "
            "WHERE run_id IN (SELECT run_id FROM picked) RETURNING run_id, lease_version",
            (owner, owner, owner, lease_s),
        )
        return (rows[0]["run_id"], int(rows[0]["lease_version"])) if rows else None

    async def drain_for_suspect(
        self, owner: str, max_takeovers: int, waited_s: float, lease_s: float
    ) -> bool:
        """Whether this busy worker is to stop taking runs until it is idle, to make room
        for a suspect that has waited ``waited_s`` seconds or more for an idle worker
        (see :meth:`claim_suspect`). One worker a suspect, the first to ask: its turn
        lasts ``lease_s`` and is renewed each time it asks again; the others go on."""
        now = self.now_sql
        rows = await self.write_once(
            "WITH target AS (SELECT run_id FROM runs "
            f"WHERE {SUSPECT_ROWS} AND COALESCE(lease_expires_at, 0) < {now} - ? "
            f"AND {blame('runs')} >= {int(max_takeovers)} "
            f"AND (drainer IS NULL OR drainer = ? OR drainer_until < {now}) "
            "ORDER BY CASE WHEN drainer = ? THEN 0 ELSE 1 END, updated_at, run_id "
            f"LIMIT 1{self.skip_locked}) "
            f"UPDATE runs SET drainer = ?, drainer_until = {now} + ? "
            "WHERE run_id IN (SELECT run_id FROM target) RETURNING run_id",
            (waited_s, owner, owner, owner, lease_s),
        )
        return bool(rows)

    async def give_back_claim(self, run_id: str, owner: str, version: int) -> bool:
        """Undo a lease grant whose worker stopped before driving the run: the lease it
        replaced is back as it was for the next claim to find (its owner, lapsed, and
        the takeover it counted), so the run's record reads as if this claim had not
        been (the fencing version stays past it)."""
        got = await self.write_once(
            "UPDATE runs SET lease_owner = taken_from, lease_expires_at = 0, "
            "takeovers = takeovers - CASE WHEN taken_from IS NULL THEN 0 ELSE 1 END "
            "WHERE run_id = ? AND lease_owner = ? AND lease_version = ? RETURNING run_id",
            (run_id, owner, version),
        )
        return bool(got)

    async def clear_takeovers(self, run_id: str, owner: str, version: int) -> bool:
        """The drive holding the run checkpointed a step: it is not one that kills its
        workers, whatever those before it did."""
        got = await self.write_once(
            "UPDATE runs SET takeovers = 0 WHERE run_id = ? AND lease_owner = ? "
            "AND lease_version = ? RETURNING run_id",
            (run_id, owner, version),
        )
        return bool(got)

    async def take_lease(
        self, run_id: str, owner: str, lease_s: float, max_takeovers: int | None = None
    ) -> int | None:
        """Claim one run whatever it needs (a backoff included), unless a lease on it is
        live, ours too: a drive of this process may have claimed it a moment ago; or it
        is a suspect (``max_takeovers``: see :meth:`claim_suspect`)."""
        innocent = "" if max_takeovers is None else f" AND {blame('runs')} < {int(max_takeovers)}"
        got = await self.write_once(
            f"UPDATE runs SET {TAKE_OVER}, lease_owner = ?, "
            f"lease_expires_at = {self.now_sql} + ?, lease_version = lease_version + 1 "
            "WHERE run_id = ? AND (lease_owner IS NULL OR "
            f"lease_expires_at < {self.now_sql}){innocent} RETURNING lease_version",
            (owner, owner, owner, lease_s, run_id),
        )
        return int(got[0]["lease_version"]) if got else None

    async def end_frozen_sessions(self, older_than_s: float) -> list[Row]:
        """End the database sessions of ours frozen mid-transaction for ``older_than_s``
        seconds or more (a process paused mid-pipeline, holding a run row locked); each
        row: pid, client, held_s, ended. On SQLite (one process) there are none."""
        return []

    async def renew_leases(
        self, owner: str, leases: Sequence[tuple[str, int, float | None]], lease_s: float
    ) -> set[str]:
        """Extend the leases still held, each (run_id, version, the run's active seconds
        so far, None if its drive has not started the graph); returns the run_ids held."""
        held: set[str] = set()
        async with self.tx() as tx:
            for run_id, version, active_s in leases:
                got = await tx.fetchone(
                    f"UPDATE runs SET lease_expires_at = {self.now_sql} + ?, "
                    "active_s = COALESCE(?, active_s) "
                    "WHERE run_id = ? AND lease_owner = ? AND lease_version = ? "
                    "RETURNING run_id",
                    (lease_s, active_s, run_id, owner, version),
                )
                if got is not None:
                    held.add(run_id)
        return held

    async def release_lease(
        self,
        run_id: str,
        owner: str,
        version: int,
        *,
        needs_drive: bool | None,
        retry_in: float | None = None,
        failures: int | None = None,
        active_s: float | None = None,
        backoff_cancel: bool = False,
    ) -> bool | None:
        """Give the run back; ``needs_drive`` None leaves the flag as it is; ``active_s``:
        the run's active time when its drive stopped, for the next one (as a renewal).

        ``retry_in``: the drive failed on a database error; the run is driven again
        (by any worker) no sooner than this many seconds from now (at once if a cancel
        is asked for, unless ``backoff_cancel``: the drive that failed was carrying that
        cancel out), and its ``drive_failures`` (in a row) become ``failures`` (one
        more than stored if None: the drive could not read them). Without it, zero.

        Returns whether the run needs driving now (someone may have set the flag while
        we drove it: a decision, a cancel), or None if the lease was no longer ours.
        """
        params: list[Any] = []
        sets = "lease_owner = NULL"
        if retry_in is None:
            # The drive ended by itself: the run did not kill its worker. (One that
            # failed on the database may have moved nothing on: its count stands.)
            sets += ", lease_expires_at = NULL, drive_failures = 0, takeovers = 0"
        else:
            # An unowned run whose lease_expires_at is ahead: no claim takes it before.
            sets += (
                ", lease_expires_at = CASE WHEN cancel_requested IS NULL "
                f"OR ? = 1 THEN {self.now_sql} + ? END, "
                "drive_failures = COALESCE(?, drive_failures + 1)"
            )
            params += [int(backoff_cancel), retry_in, failures]
            needs_drive = True
        # A run that has ended needs no driving, whatever a late cancel or decision set:
        # kept, the flag would have workers claim it again and again, for ever.
        keep = "needs_drive" if needs_drive is None else "?"
        sets += f", needs_drive = CASE WHEN {ENDED} THEN 0 ELSE {keep} END"
        if needs_drive is not None:
            params.append(int(needs_drive))
        if active_s is not None:
            sets += ", active_s = ?"
            params.append(active_s)
        got = await self.write_once(
            f"UPDATE runs SET {sets} WHERE run_id = ? AND lease_owner = ? "
            "AND lease_version = ? RETURNING needs_drive",
            [*params, run_id, owner, version],
        )
        return bool(got[0]["needs_drive"]) if got else None

    async def expire_all_leases(self) -> None:
        """Embedded mode is one process: at its start, no earlier lease can be alive.
        They expire, owners kept: the claim that follows says whose it was."""
        async with self.tx() as tx:
            await tx.execute("UPDATE runs SET lease_expires_at = 0 WHERE lease_owner IS NOT NULL")

    async def lease_of(self, run_id: str) -> dict[str, Any] | None:
        async with self.read() as tx:
            row = await tx.fetchone(
                "SELECT lease_owner, lease_version, needs_drive, "
                f"lease_expires_at - {self.now_sql} AS remaining_s FROM runs WHERE run_id = ?",
                (run_id,),
            )
        return dict(row) if row else None
