"""Run leases: which worker drives which run, until when, under which fencing token."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from runtime.ids import AGENT_ID
from runtime.store.core import (
    CANCEL_CHANNEL,
    ENDED,
    EVENTS_CHANNEL,
    WORK_CHANNEL,
    StoreCore,
)
from runtime.store.tx import Row

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

FEW_TENANTS = 300
"""Tenants with waiting runs up to which a claim ranks each one's first runs alone
(an index probe and a few rows apiece); past it, every waiting run (see
``LeaseQueries._ranking``). Measured with ``python -m bench.backlog``."""

PROBED_AGENTS = 64
"""Agents of a worker up to which a claim probes each tenant once per agent (one
``UNION ALL`` arm apiece: SQLite takes at most 500). A worker hosting more reads all
of each tenant's waiting runs, as a claim for every agent does."""

SUSPECT_ROWS = "needs_drive = 1 AND (lease_owner IS NOT NULL OR takeovers > 0)"
"""The only waiting runs that can be suspects (the predicate of their partial index)."""


def of_agents(runs: str, agents: Collection[str] | None) -> str:
    """`` AND `` the condition that a worker hosting ``agents`` (None: every agent) can
    drive ``runs``: of one of them, or to be cancelled (any process carries a cancel out).

    A worker without an agent (a fleet mid-deploy, workers given different agents)
    otherwise leased its runs only to hand them back, each a lease later. The ids are
    the process's own agents, written as literals (the claim's parameters are
    positional, and its conditions repeated): :data:`runtime.ids.AGENT_ID` keeps
    quotes, and what the driver would read as a placeholder, out of them."""
    if agents is None:
        return ""
    listed = ", ".join(quoted(agents))
    hosted = f"{runs}.agent_id IN ({listed}) OR " if listed else ""
    return f" AND ({hosted}{runs}.cancel_requested IS NOT NULL)"


def quoted(agents: Collection[str]) -> list[str]:
    """``agents`` as SQL literals, in order; a ValueError for one that is no agent id."""
    unsafe = [agent for agent in agents if not AGENT_ID.fullmatch(agent)]
    if unsafe:
        raise ValueError(f"not an agent id: {unsafe[0]!r}")
    return [f"'{agent}'" for agent in sorted(agents)]


def blame(runs: str) -> str:
    """The takeovers in a row a lease grant would leave ``runs`` with (a worker's own
    expired lease counted too: it may not be ours)."""
    return f"({runs}.takeovers + CASE WHEN {runs}.lease_owner IS NULL THEN 0 ELSE 1 END)"


class LeaseQueries(StoreCore):
    """Mixed into RunStore; ``now_sql`` is the database's clock in epoch seconds."""

    async def claim_runs(
        self,
        owner: str,
        limit: int,
        lease_s: float,
        max_takeovers: int | None = None,
        *,
        agents: Collection[str] | None = None,
    ) -> list[tuple[str, int]]:
        """Claim up to ``limit`` runs that need driving and have no live lease, and are
        no suspects: ``max_takeovers`` or more takeovers in a row (see
        :meth:`claim_suspect`; None: suspects too), of one of ``agents`` (None: any).

        Returns (run_id, lease_version) pairs; the version is the fencing token.
        Uses the database's clock, so workers' clocks need not agree.
        """
        if limit <= 0:
            return []

        # Tenants take turns: a tenant's waiting runs are ranked after the runs it has
        # under a live lease, so a worker whose slots free one at a time gives the next
        # one to the tenant with the fewest, not to the oldest run of a tenant's burst.
        # One statement: the rows are locked (skipping those another worker is claiming
        # right now) and leased together, one round trip where the dialect autocommits.
        now = self.now_sql

        def ready(runs: str) -> str:
            innocent = "" if max_takeovers is None else f" AND {blame(runs)} < {max_takeovers:d}"
            return (
                f"{runs}.needs_drive = 1 AND ({runs}.lease_expires_at IS NULL "
                f"OR {runs}.lease_expires_at < {now}){innocent}{of_agents(runs, agents)}"
            )

        rows = await self.write_once(
            f"{self._ranking(ready, agents, limit + CLAIM_SPARE)}, "
            f"picked AS ({self._lock_ranked(ready)}) "
            f"UPDATE runs SET {TAKE_OVER}, lease_owner = ?, "
            f"lease_expires_at = {self.now_sql} + ?, lease_version = lease_version + 1 "
            "WHERE run_id IN (SELECT run_id FROM picked) RETURNING run_id, lease_version",
            (limit + CLAIM_SPARE, limit, owner, owner, owner, lease_s),
        )
        return [(row["run_id"], int(row["lease_version"])) for row in rows]

    def _ranking(
        self, ready: Callable[[str], str], agents: Collection[str] | None, first_n: int
    ) -> str:
        """``WITH`` … ``ranked``: the claim's first ``?`` candidates in turn order.

        With few tenants waiting (:data:`FEW_TENANTS`), each one's first ``first_n``
        waiting runs of each of ``agents``, and to be cancelled, from the index on
        (tenant_id, agent_id, updated_at, run_id), never the backlog behind them: a
        burst of a hundred thousand runs, of this worker's agents or another's, costs
        a claim what ten do (with ``agents`` None or past :data:`PROBED_AGENTS`, each
        tenant's waiting runs are all read and sorted: only tests and benchmarks claim
        for every agent). A
        tenant's run past the claim's whole ranking cannot be in it: as many of its own
        runs come first. With more tenants waiting, every waiting run is ranked, which
        costs what the backlog is: walking every tenant would cost more still where
        each has a run or two (BENCHMARKS.md §6), so the walk gives up at the bound.
        """
        # The clock in a subquery: read once, it can bound an index scan, where the
        # volatile clock_timestamp() cannot (PostgreSQL then chose any index on
        # tenant_id without fresh statistics, and read every run of the tenant).
        leased = f"l.lease_owner IS NOT NULL AND l.lease_expires_at >= (SELECT {self.now_sql})"
        in_order = "(PARTITION BY w.tenant_id ORDER BY w.updated_at, w.run_id)"
        # Each tenant with a run waiting, one index probe apiece: neither dialect skips
        # through an index by itself (a loose index scan). Runs in flight or backing off
        # are stepped over inside the index (its last column): tenants that are only
        # being served do not count. The walk stops past FEW_TENANTS; ``few`` has a row
        # only if it reached the end.
        waiting_runs = (
            f"runs AS r{self.index_hint('runs_waiting_agent')} WHERE r.needs_drive = 1 "
            f"AND (r.lease_expires_at IS NULL OR r.lease_expires_at < {self.now_sql})"
        )
        walk = (
            "tenants(tenant_id, depth) AS ("
            f"SELECT (SELECT r.tenant_id FROM {waiting_runs} ORDER BY r.tenant_id LIMIT 1), 1 "
            f"UNION ALL SELECT (SELECT r.tenant_id FROM {waiting_runs} "
            "AND r.tenant_id > t.tenant_id ORDER BY r.tenant_id LIMIT 1), t.depth + 1 "
            f"FROM tenants AS t WHERE t.tenant_id IS NOT NULL AND t.depth <= {FEW_TENANTS:d}), "
            "few AS (SELECT 1 FROM tenants WHERE tenant_id IS NULL)"
        )
        # Counted per tenant, not grouped over the table: a planner without fresh
        # statistics (a backlog that arrived in the last minute) read every run for it.
        held_few = (
            "SELECT t.tenant_id, (SELECT COUNT(*) FROM runs AS l"
            f"{self.index_hint('runs_leased_until')} WHERE l.tenant_id = t.tenant_id AND {leased}) "
            "AS n FROM tenants AS t WHERE t.tenant_id IS NOT NULL"
        )

        # Each tenant's first runs, one index probe per agent (in order within it), and
        # one for cancels of any other agent: their union holds the tenant's first
        # ``first_n`` ready runs, which the window below numbers.
        if agents is None or len(agents) > PROBED_AGENTS:  # ready() filters by agent
            probes = [("", "runs_waiting_agent")]
        else:
            literals = quoted(agents)
            probes = [(f" AND {{r}}.agent_id = {a}", "runs_waiting_agent") for a in literals]
            others = f" AND {{r}}.agent_id NOT IN ({', '.join(literals)})" if literals else ""
            probes.append((f" AND {{r}}.cancel_requested IS NOT NULL{others}", "runs_cancelling"))

        def first(runs: str, columns: str, which: str, index: str) -> str:
            return (
                f"SELECT {columns} FROM runs AS {runs}{self.index_hint(index)} "
                f"WHERE {runs}.tenant_id = t.tenant_id{which.format(r=runs)} AND {ready(runs)} "
                f"ORDER BY {runs}.updated_at, {runs}.run_id LIMIT {first_n:d}"
            )

        # Which branch runs is decided by a one-row table first in a CROSS JOIN, so that
        # both dialects test it once before reading any run (SQLite tests a condition
        # on nothing but a subquery again for every row it reads).
        gate = "FROM (SELECT COUNT(*) AS c FROM few) AS g CROSS JOIN"
        if self.row_locks:
            arms = [
                f"SELECT w.run_id, w.tenant_id, w.updated_at {gate} tenants AS t "
                f"CROSS JOIN LATERAL ({first('w', 'w.*', which, index)}) AS w WHERE g.c = 1"
                for which, index in probes
            ]
        else:  # SQLite has no LATERAL: each tenant's first run ids, then their rows by key
            arms = [
                f"SELECT w.run_id, w.tenant_id, w.updated_at {gate} tenants AS t "
                f"JOIN runs AS w ON w.run_id IN ({first('q', 'q.run_id', which, index)}) "
                "WHERE g.c = 1"
                for which, index in probes
            ]
        firsts = f"FROM ({' UNION ALL '.join(arms)}) AS w"
        # Past FEW_TENANTS: every waiting run and every live lease in one window per
        # tenant, leases first, so that a waiting run's number is its turn (its
        # position plus the tenant's leases) without a join (SQLite joined the counts
        # by scanning them again for every waiting run).
        leases_then_runs = (
            f"SELECT l.run_id, l.tenant_id, l.updated_at, 0 AS waiting {gate} "
            f"runs AS l{self.index_hint('runs_leased_until')} WHERE g.c = 0 AND {leased} "
            "UNION ALL SELECT w.run_id, w.tenant_id, w.updated_at, 1 AS waiting "
            f"{gate} runs AS w WHERE g.c = 0 AND {ready('w')}"
        )
        return (
            f"WITH RECURSIVE {walk}, held_few AS ({held_few}), "
            "firsts AS (SELECT w.run_id, w.tenant_id, w.updated_at, "
            f"ROW_NUMBER() OVER {in_order} AS n {firsts}), "
            "everyone AS (SELECT w.run_id, w.updated_at, w.waiting, ROW_NUMBER() OVER "
            "(PARTITION BY w.tenant_id ORDER BY w.waiting, w.updated_at, w.run_id) AS turn "
            f"FROM ({leases_then_runs}) AS w), "
            "ranked AS (SELECT run_id, updated_at, turn FROM ("
            "SELECT w.run_id, w.updated_at, w.n + h.n AS turn FROM firsts AS w "
            "JOIN held_few AS h ON h.tenant_id = w.tenant_id "
            "UNION ALL SELECT run_id, updated_at, turn FROM everyone WHERE waiting = 1) AS u "
            "ORDER BY turn, updated_at, run_id LIMIT ?)"
        )

    def _lock_ranked(self, ready: Callable[[str], str]) -> str:
        """The first ``?`` ranked runs, locked where the dialect locks rows."""
        if not self.row_locks:
            # SQLite: the statement runs in a write transaction, no other claim between
            # the ranking and the update.
            return "SELECT run_id FROM ranked ORDER BY turn, updated_at, run_id LIMIT ?"
        # In a CTE, not an IN (subquery): PostgreSQL may re-run a subquery on the inner
        # side of a join, and with SKIP LOCKED each re-run can lock other rows, so more
        # than ``limit`` runs would be leased. A locking CTE runs once. The conditions
        # are repeated on the locked rows: PostgreSQL rechecks those (not the ranking's
        # snapshot) on a row another worker has just leased.
        return (
            "SELECT runs.run_id FROM runs JOIN ranked ON ranked.run_id = runs.run_id "
            f"WHERE {ready('runs')} "
            f"ORDER BY ranked.turn, ranked.updated_at, runs.run_id LIMIT ?{self.skip_locked}"
        )

    async def claim_suspect(
        self,
        owner: str,
        lease_s: float,
        max_takeovers: int,
        *,
        agents: Collection[str] | None = None,
    ) -> tuple[str, int] | None:
        """Claim the oldest waiting suspect: a run whose leases expired unreleased
        ``max_takeovers`` times in a row (this grant's included) with no step
        checkpointed in between. Every run a dead worker held is taken over, the one
        that killed it and those beside it alike: only a worker that drives nothing else
        may take a suspect, and it takes nothing else until the suspect has moved on,
        so that a suspect that kills it again has done it alone. Of one of ``agents``
        (None: any)."""
        now = self.now_sql
        rows = await self.write_once(
            "WITH picked AS (SELECT run_id FROM runs "
            f"WHERE {SUSPECT_ROWS} AND (lease_expires_at IS NULL OR lease_expires_at < {now}) "
            f"AND {blame('runs')} >= {int(max_takeovers)}{of_agents('runs', agents)} "
            f"ORDER BY updated_at, run_id LIMIT 1{self.skip_locked}) "
            f"UPDATE runs SET {TAKE_OVER}, lease_owner = ?, "
            f"lease_expires_at = {now} + ?, lease_version = lease_version + 1 "
            "WHERE run_id IN (SELECT run_id FROM picked) RETURNING run_id, lease_version",
            (owner, owner, owner, lease_s),
        )
        return (rows[0]["run_id"], int(rows[0]["lease_version"])) if rows else None

    async def drain_for_suspect(
        self,
        owner: str,
        max_takeovers: int,
        waited_s: float,
        lease_s: float,
        *,
        agents: Collection[str] | None = None,
    ) -> bool:
        """Whether this busy worker is to stop taking runs until it is idle, to make room
        for a suspect that has waited ``waited_s`` seconds or more for an idle worker
        (see :meth:`claim_suspect`). One worker a suspect, the first to ask: its turn
        lasts ``lease_s`` and is renewed each time it asks again; the others go on. Only
        for a suspect of one of ``agents`` (None: any), which this worker could take."""
        now = self.now_sql
        rows = await self.write_once(
            "WITH target AS (SELECT run_id FROM runs "
            f"WHERE {SUSPECT_ROWS} AND COALESCE(lease_expires_at, 0) < {now} - ? "
            f"AND {blame('runs')} >= {int(max_takeovers)}{of_agents('runs', agents)} "
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
        is a suspect (``max_takeovers``: see :meth:`claim_suspect`); or it has ended (its
        end let its lease go, and there is nothing left to drive)."""
        innocent = "" if max_takeovers is None else f" AND {blame('runs')} < {int(max_takeovers)}"
        got = await self.write_once(
            f"UPDATE runs SET {TAKE_OVER}, lease_owner = ?, "
            f"lease_expires_at = {self.now_sql} + ?, lease_version = lease_version + 1 "
            f"WHERE run_id = ? AND NOT {ENDED} AND (lease_owner IS NULL OR "
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
                # A run its drive has just ended gave its lease up with the end, and the
                # drive is on its way out: held still (no takeover bumped the version),
                # not a lease lost to stop the drive for, and nothing to extend.
                got = await tx.fetchone(
                    "UPDATE runs SET lease_expires_at = CASE WHEN lease_owner IS NULL "
                    f"THEN NULL ELSE {self.now_sql} + ? END, "
                    "active_s = CASE WHEN lease_owner IS NULL THEN active_s "
                    "ELSE COALESCE(?, active_s) END "
                    "WHERE run_id = ? AND lease_version = ? "
                    f"AND (lease_owner = ? OR (lease_owner IS NULL AND {ENDED})) "
                    "RETURNING run_id",
                    (lease_s, active_s, run_id, version, owner),
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

    async def waiting_agents(self) -> dict[str, int]:
        """How many runs wait to be driven, by agent (not those to be cancelled, which
        any worker takes)."""
        async with self.read() as tx:
            rows = await tx.fetchall(
                "SELECT agent_id, COUNT(*) AS n FROM runs WHERE needs_drive = 1 "
                "AND cancel_requested IS NULL GROUP BY agent_id"
            )
        return {row["agent_id"]: int(row["n"]) for row in rows}

    async def lease_of(self, run_id: str) -> dict[str, Any] | None:
        async with self.read() as tx:
            row = await tx.fetchone(
                "SELECT lease_owner, lease_version, needs_drive, drive_failures, "
                f"lease_expires_at - {self.now_sql} AS remaining_s FROM runs WHERE run_id = ?",
                (run_id,),
            )
        return dict(row) if row else None
