"""Retention: ended runs leave the store, with every row that belongs to them.

A run is kept whole or not at all: its row, events, steps, ledger and approvals go
in one transaction. Artifacts are content-addressed and shared between runs (each
writer's log has its own ``artifact`` event); one goes only when no event of any
run still names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from runtime.lifecycle import TERMINAL
from runtime.store.artifacts import ARTIFACT_KEY, artifact_lock, artifact_lock_key
from runtime.store.codec import _iso
from runtime.store.core import StoreCore

CHUNK = 500
"""Ids per IN list: far below SQLite's 32,766 bound parameters."""


def _chunks(values: Sequence[str]) -> list[Sequence[str]]:
    return [values[i : i + CHUNK] for i in range(0, len(values), CHUNK)]


_CHILDREN = ("events", "steps", "tool_calls", "approvals")


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)


class RetentionQueries(StoreCore):
    async def ended_runs(self, ended_before: datetime, *, limit: int) -> list[str]:
        """Up to ``limit`` runs that ended (succeeded or failed) before ``ended_before``,
        the longest ended first."""
        states = [s.value for s in TERMINAL]
        async with self.read(runs=False) as tx:
            rows = await tx.fetchall(
                f"SELECT run_id FROM runs WHERE state IN ({_marks(states)}) AND ended_at < ? "
                "ORDER BY ended_at, run_id LIMIT ?",
                [*states, _iso(ended_before, exact=True), limit],
            )
        return [str(r["run_id"]) for r in rows]

    async def count_ended_runs(self, ended_before: datetime) -> int:
        states = [s.value for s in TERMINAL]
        async with self.read(runs=False) as tx:
            row = await tx.fetchone(
                f"SELECT COUNT(*) AS n FROM runs WHERE state IN ({_marks(states)}) "
                "AND ended_at < ?",
                [*states, _iso(ended_before, exact=True)],
            )
        return int((row or {}).get("n") or 0)

    async def delete_ended_runs(
        self, run_ids: Sequence[str], ended_before: datetime
    ) -> tuple[list[str], int]:
        """Delete those of ``run_ids`` that still ended before ``ended_before``, and the
        artifacts no remaining run names. (runs deleted, artifacts deleted)"""
        if not run_ids:
            return [], 0
        states = [s.value for s in TERMINAL]
        async with self.tx() as tx:
            gone = [
                str(r["run_id"])
                for r in await tx.fetchall(
                    f"DELETE FROM runs WHERE run_id IN ({_marks(run_ids)}) "
                    f"AND state IN ({_marks(states)}) AND ended_at < ? RETURNING run_id",
                    [*run_ids, *states, _iso(ended_before, exact=True)],
                )
            ]
            if not gone:
                return [], 0
            named = await tx.fetchall(
                f"SELECT DISTINCT dedupe_key FROM events WHERE run_id IN ({_marks(gone)}) "
                "AND dedupe_key LIKE ?",
                [*gone, f"{ARTIFACT_KEY}%"],
            )
            for table in _CHILDREN:
                await tx.execute(f"DELETE FROM {table} WHERE run_id IN ({_marks(gone)})", gone)
            ids = sorted(str(r["dedupe_key"]).removeprefix(ARTIFACT_KEY) for r in named)
            # The locks put_artifact takes too: an artifact being written again for
            # another run is either seen named here, or written after it is gone.
            # (In order: two prunes take them in the same order.)
            for stripe in sorted({artifact_lock(a) for a in ids}):
                await self._lock_key(tx, artifact_lock_key(stripe))
            freed = 0
            for chunk in _chunks(ids):
                rows = await tx.fetchall(
                    f"DELETE FROM artifacts WHERE artifact_id IN ({_marks(chunk)}) AND NOT EXISTS "
                    f"(SELECT 1 FROM events e WHERE e.dedupe_key = '{ARTIFACT_KEY}' "
                    "|| artifacts.artifact_id) RETURNING artifact_id",
                    list(chunk),
                )
                freed += len(rows)
        return gone, freed
