"""Retention: how long ended runs are kept, and taking them away after.

A run that succeeded or failed before the cut-off goes whole: its checkpoints
(LangGraph's ``adelete_thread``), then its row, events, steps, ledger and
approvals, and the artifacts no other run names. Runs still going, or parked for a
human, are never touched, however old. Long-term memory is the user's, not a run's:
it stays (users erase it through ``DELETE /memory``).

Checkpoints go first: a prune cut short leaves an ended run without checkpoints,
which the next prune finishes; the other order could leave checkpoints that no run
row leads to. Deleting is idempotent, so several workers may prune at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from langgraph.checkpoint.base import BaseCheckpointSaver

from runtime.aio import to_the_end
from runtime.model import utcnow
from runtime.store.base import RunStore

log = logging.getLogger(__name__)

BATCH = 100
"""Runs per transaction: a large backlog is deleted in bounded steps."""


@dataclass
class Pruned:
    runs: list[str] = field(default_factory=list)
    artifacts: int = 0


async def prune(
    store: RunStore,
    checkpointer: BaseCheckpointSaver[str],
    ended_before: datetime,
    *,
    batch: int = BATCH,
) -> Pruned:
    """Delete every run that ended before ``ended_before``, in batches."""
    done = Pruned()
    while True:
        ids = await store.ended_runs(ended_before, limit=batch)
        if not ids:
            return done
        for run_id in ids:
            # Cut short, AsyncSqliteSaver's delete would leave its shared connection
            # inside a transaction holding SQLite's write lock: it runs to its end.
            await to_the_end(checkpointer.adelete_thread(run_id))
        gone, freed = await store.delete_ended_runs(ids, ended_before)
        done.runs += gone
        done.artifacts += freed
        if len(ids) < batch:
            return done


async def keep_pruning(
    store: RunStore,
    checkpointer: BaseCheckpointSaver[str],
    keep_for: timedelta,
    every_s: float,
) -> None:
    """Prune runs ended more than ``keep_for`` ago, every ``every_s`` (with jitter, so
    that workers started together do not all prune at once), until cancelled."""
    while True:
        await asyncio.sleep(every_s * (0.5 + random.random()))
        try:
            pruned = await prune(store, checkpointer, utcnow() - keep_for)
        except Exception:  # a database blip: the next round tries again
            log.warning("pruning ended runs failed", exc_info=True)
            continue
        if pruned.runs:
            log.info(
                "pruned %d runs ended before the last %s, and %d artifacts",
                len(pruned.runs),
                keep_for,
                pruned.artifacts,
            )
