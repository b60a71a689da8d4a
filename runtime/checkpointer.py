"""LangGraph's PostgreSQL checkpointer as the runtime uses it: on a pool, concurrently.

``AsyncPostgresSaver`` has two costs the runtime does not need:

* every operation takes the saver's one ``asyncio.Lock``, on a pool too, where each
  operation has a connection of its own: twenty drives' checkpoint writes wait in one
  line behind each other's round trips (langchain-ai/langgraph#7259; #7269 proposes
  the same change upstream);
* ``aput`` and ``aput_writes`` serialise on a worker thread (``asyncio.to_thread``): a
  thread hop and back per write, two per superstep. The runtime keeps graph state
  small (large outputs are artifacts, DESIGN §6), so serialising is microseconds, and
  LangGraph's own ``AsyncSqliteSaver`` does it on the event loop too.

The two methods below are the upstream ones (langgraph-checkpoint-postgres 3.2) with
``to_thread`` taken out, and their statements serialised first and then sent through
``_write`` (the fence, below). ``tests/unit/test_checkpointer.py`` checks that they write
what the upstream saver writes, and holds a hash of the upstream methods mirrored here:
an upgrade that changes them fails there until this file is brought in line.

Without the lock, each operation takes a connection of the pool for itself: drives
wait for one in the pool's queue (psycopg_pool, FIFO) instead of behind the lock.

One thing the runtime needs that the upstream saver cannot know: a drive's checkpoint
writes are fenced by its lease (:data:`LEASE`, set by the engine in the drive's task,
which LangGraph's checkpoint tasks inherit). A worker paused past its lease (a
SIGSTOP, a long GC, a partition) may wake in the middle of a node that writes nothing
of ours, and LangGraph would then save a checkpoint on the run's thread after the new
holder's, newer by id: the next drive would resume the stale worker's branch. The
fence, sent last in the checkpoint's own pipeline, fails the whole transaction unless
the lease is still the drive's, and holds the run row FOR SHARE from there to the
commit, which follows at once: a takeover's lease bump cannot commit in between (a
claim, SKIP LOCKED, passes the row over until its next sweep). Last, not first: a
worker frozen while it sends its checkpoint would otherwise hold the row with a
session that no idle timeout ends, mid-pipeline, and nobody could take the run over
nor cancel it.

psycopg syncs a pipeline however its block is left, and in autocommit a sync commits
what was sent: a pipeline cut between the checkpoint's statements and the fence (the
heartbeat cancelling the drive of a lease it found lost, a chaos probe showed) would
commit the checkpoint unfenced. So a fenced write is serialised before its pipeline
opens, and if anything cuts it short there (an error, a cancel) a failing statement
goes before the sync. (A cancel that lands inside psycopg's own wait makes psycopg
cancel the statement in the server, which fails the transaction too.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg import AsyncCursor, errors
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from runtime.store.tx import LeaseLost

LEASE: ContextVar[tuple[str, int] | None] = ContextVar("checkpoint_lease", default=None)
"""(run_id, lease version) of the drive whose task this is (None outside a drive)."""

LEASE_FENCE_SQL = (
    "SELECT 1 / count(*) AS held FROM "
    "(SELECT 1 FROM runs WHERE run_id = %s AND lease_version = %s FOR SHARE) AS f"
)
"""Fails (division by zero) unless the lease is held: the transaction fails with it."""

ABANDON_SQL = "SELECT 'checkpoint write abandoned'::int"
"""Fails (not by a division): sent before the sync of a write that went wrong, so that
the sync commits none of it."""

Statement = tuple[str, Sequence[Any], bool]
"""A checkpoint write's statement: query, parameters (a list of them where ``many``), many."""


class PooledPostgresSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` without the shared lock on a pool, serialising inline, and
    fenced by the lease of the drive that writes."""

    async def _write(self, thread_id: str, statements: list[Statement]) -> None:
        """Send ``statements``, serialised already, in one pipeline (one transaction),
        fenced where a drive of the run ``thread_id`` writes."""
        lease = LEASE.get()
        if lease is None or lease[0] != thread_id:
            async with self._cursor(pipeline=True) as cur:
                await self._send(cur, statements)
            return
        try:
            await self._write_fenced(lease, statements)
        except errors.DivisionByZero as exc:  # nothing else in a checkpoint write divides
            raise LeaseLost(f"lease {lease[1]} on {thread_id} is no longer held") from exc

    async def _write_fenced(self, lease: tuple[str, int], statements: list[Statement]) -> None:
        async with self._cursor(pipeline=True) as cur:
            try:
                await self._send(cur, statements)
                await cur.execute(LEASE_FENCE_SQL, lease)
            except BaseException:
                # The pipeline's sync, on the way out, must commit none of it.
                with contextlib.suppress(Exception):
                    await cur.execute(ABANDON_SQL)
                raise

    async def _send(self, cur: AsyncCursor[DictRow], statements: list[Statement]) -> None:
        for query, params, many in statements:
            if many:
                await cur.executemany(query, params)
            else:
                await cur.execute(query, params)

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        if not isinstance(self.conn, AsyncConnectionPool) or self.pipe is not None:
            # One connection shared by every caller: its lock is what keeps them apart.
            async with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        async with self.conn.connection() as conn:
            if pipeline and self.supports_pipeline:
                async with conn.pipeline(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur
            elif pipeline:
                async with (
                    conn.transaction(),
                    conn.cursor(binary=True, row_factory=dict_row) as cur,
                ):
                    yield cur
            else:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"].copy()
        thread_id = configurable.pop("thread_id")
        checkpoint_ns = configurable.pop("checkpoint_ns")
        checkpoint_id = configurable.pop("checkpoint_id", None)

        copy = checkpoint.copy()
        copy["channel_values"] = copy["channel_values"].copy()
        next_config: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        # Primitive values stay inline in the checkpoint row, the rest go to blobs.
        blob_values = {}
        for k, v in checkpoint["channel_values"].items():
            if isinstance(v, _DeltaSnapshot):
                blob_values[k] = copy["channel_values"].pop(k)
                copy["channel_values"][k] = True
            elif v is None or isinstance(v, (str, int, float, bool)):
                pass
            else:
                blob_values[k] = copy["channel_values"].pop(k)

        statements: list[Statement] = []
        if blob_versions := {k: v for k, v in new_versions.items() if k in blob_values}:
            statements.append(
                (
                    self.UPSERT_CHECKPOINT_BLOBS_SQL,
                    self._dump_blobs(thread_id, checkpoint_ns, blob_values, blob_versions),
                    True,
                )
            )
        statements.append(
            (
                self.UPSERT_CHECKPOINTS_SQL,
                (
                    thread_id,
                    checkpoint_ns,
                    checkpoint["id"],
                    checkpoint_id,
                    Jsonb(copy),
                    Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
                ),
                False,
            )
        )
        await self._write(thread_id, statements)
        return next_config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        query = (
            self.UPSERT_CHECKPOINT_WRITES_SQL
            if all(w[0] in WRITES_IDX_MAP for w in writes)
            else self.INSERT_CHECKPOINT_WRITES_SQL
        )
        params = self._dump_writes(
            config["configurable"]["thread_id"],
            config["configurable"]["checkpoint_ns"],
            config["configurable"]["checkpoint_id"],
            task_id,
            task_path,
            writes,
        )
        await self._write(config["configurable"]["thread_id"], [(query, params, True)])
