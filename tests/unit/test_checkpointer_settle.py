"""A checkpoint write cut short on SQLite must not leave the shared file locked."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from runtime.backend import open_backend, settle_checkpointer


async def test_a_cut_short_checkpoint_write_is_rolled_back(tmp_path: Path) -> None:
    backend = await open_backend(f"sqlite:///{tmp_path / 'runtime.db'}")
    try:
        saver = backend.checkpointer
        assert isinstance(saver, AsyncSqliteSaver)
        # What AsyncSqliteSaver.aput leaves when cancelled between its INSERT and COMMIT.
        await saver.conn.execute(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, type, "
            "checkpoint, metadata) VALUES ('t', '', 'c1', 'json', x'00', x'00')"
        )
        assert saver.conn.in_transaction
        # Meanwhile the run store cannot write: the file's write lock is taken.
        other = sqlite3.connect(tmp_path / "runtime.db", timeout=0.1)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")

        await settle_checkpointer(saver)

        assert not saver.conn.in_transaction
        other.execute("BEGIN IMMEDIATE")  # the write lock is free again
        other.rollback()
        other.close()
        await asyncio.wait_for(backend.store.ping(), 5)
        async with saver.conn.execute("SELECT COUNT(*) FROM checkpoints") as cur:
            assert (await cur.fetchone()) == (0,)  # as if the process had died there
    finally:
        await backend.close()


async def test_settling_an_idle_checkpointer_changes_nothing(tmp_path: Path) -> None:
    backend = await open_backend(f"sqlite:///{tmp_path / 'runtime.db'}")
    try:
        await settle_checkpointer(backend.checkpointer)
        await settle_checkpointer(backend.checkpointer)
        assert isinstance(backend.checkpointer, AsyncSqliteSaver)
        assert not backend.checkpointer.conn.in_transaction
    finally:
        await backend.close()
