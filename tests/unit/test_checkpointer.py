"""runtime.checkpointer.PooledPostgresSaver against LangGraph's own AsyncPostgresSaver, on a
real PostgreSQL: it writes the same checkpoints, and one blocked write holds up no other."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Interrupt, interrupt
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from runtime.checkpointer import PooledPostgresSaver
from runtime.store.postgres import open_pool

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pool(pg_schema_url: str) -> AsyncIterator[AsyncConnectionPool[AsyncConnection[DictRow]]]:
    opened = await open_pool(pg_schema_url)
    try:
        await AsyncPostgresSaver(opened).setup()  # type: ignore[arg-type]
        yield opened
    finally:
        await opened.close()


class State(TypedDict, total=False):
    n: int
    note: str | None
    items: Annotated[list[dict[str, Any]], operator.add]
    answer: Any


async def first(state: State) -> dict[str, Any]:
    return {"n": state.get("n", 0) + 1, "items": [{"k": "a", "v": [1, 2.5, None]}]}


async def ask(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "ok?", "n": state["n"]})
    return {"answer": answer, "note": "asked", "items": [{"k": "b", "v": "é" * 300}]}


def graph(saver: AsyncPostgresSaver) -> Any:
    builder: StateGraph[State, None, State, State] = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("ask", ask)
    builder.add_edge(START, "first")
    builder.add_edge("first", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def plain(value: Any) -> Any:
    """An interrupt's id comes from its task's, which comes from the checkpoint's."""
    if isinstance(value, list) and value and all(isinstance(i, Interrupt) for i in value):
        return [i.value for i in value]
    return value


async def history(saver: AsyncPostgresSaver, thread: str) -> list[tuple[Any, ...]]:
    """Each checkpoint of a thread, without what differs by construction (ids, times)."""
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    return [
        (
            t.checkpoint["channel_values"],
            # A version is "<counter>.<random>": the counter is what must agree.
            sorted((k, str(v).split(".")[0]) for k, v in t.checkpoint["channel_versions"].items()),
            t.metadata.get("step"),
            t.metadata.get("source"),
            sorted((channel, repr(plain(value))) for _, channel, value in t.pending_writes or []),
            t.parent_config is None,
        )
        async for t in saver.alist(config)
    ]


async def row_counts(pool: AsyncConnectionPool[AsyncConnection[DictRow]], thread: str) -> list[int]:
    counts = []
    async with pool.connection() as conn:
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            cur = await conn.execute(
                f"SELECT COUNT(*) AS n FROM {table} WHERE thread_id = %s", (thread,)
            )
            row = await cur.fetchone()
            counts.append(row["n"] if row else -1)
    return counts


async def test_it_writes_what_langgraphs_saver_writes(
    pool: AsyncConnectionPool[AsyncConnection[DictRow]],
) -> None:
    ours, theirs = PooledPostgresSaver(pool), AsyncPostgresSaver(pool)  # type: ignore[arg-type]
    for saver, thread in ((ours, "t-ours"), (theirs, "t-theirs")):
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        compiled = graph(saver)
        await compiled.ainvoke({"n": 0}, config, durability="sync")
        assert (await compiled.aget_state(config)).next == ("ask",)
        await compiled.ainvoke(Command(resume={"yes": True}), config, durability="sync")
    assert await history(ours, "t-ours") == await history(theirs, "t-theirs")
    assert await row_counts(pool, "t-ours") == await row_counts(pool, "t-theirs")
    # Each reads what the other wrote.
    assert await history(theirs, "t-ours") == await history(ours, "t-theirs")
    final = await graph(theirs).aget_state({"configurable": {"thread_id": "t-ours"}})
    assert final.values["answer"] == {"yes": True} and len(final.values["items"]) == 2


# What runtime.checkpointer mirrors of the upstream saver, as read when it was written.
MIRRORED = {
    "aput": "c685c7a8c88b7431",
    "aput_writes": "a2970ab04a7d7d5d",
    "_cursor": "217e0ac4b09b8778",
}


def test_the_upstream_methods_it_mirrors_are_unchanged() -> None:
    """A new langgraph-checkpoint-postgres that changes them (a new kind of channel value,
    the lock dropped upstream as langchain-ai/langgraph#7269 proposes) stops here: read
    the new code, mirror it in runtime/checkpointer.py (or drop the override) and record
    the new hashes."""
    now = {
        name: hashlib.sha256(
            inspect.getsource(getattr(AsyncPostgresSaver, name)).encode()
        ).hexdigest()[:16]
        for name in MIRRORED
    }
    assert now == MIRRORED


def put_args(thread: str) -> tuple[RunnableConfig, Any]:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return config, empty_checkpoint()


@pytest.mark.parametrize("saver_class", [PooledPostgresSaver, AsyncPostgresSaver])
async def test_a_blocked_write_holds_up_no_other_on_a_pool(
    pool: AsyncConnectionPool[AsyncConnection[DictRow]],
    pg_schema_url: str,
    saver_class: type[AsyncPostgresSaver],
) -> None:
    saver = saver_class(pool)  # type: ignore[arg-type]
    config, blocked_checkpoint = put_args("t-blocked")
    # Another session writes the same checkpoint and has not committed: our upsert of
    # that key waits for it, as it would behind any slow or locked write.
    with psycopg.connect(pg_schema_url) as other:
        other.execute(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, "
            "metadata) VALUES ('t-blocked', '', %s, '{}', '{}')",
            (blocked_checkpoint["id"],),
        )
        blocked = asyncio.create_task(saver.aput(config, blocked_checkpoint, {}, {}))
        await asyncio.sleep(0.2)
        assert not blocked.done()
        free = asyncio.create_task(saver.aput(*put_args("t-free"), {}, {}))
        if saver_class is PooledPostgresSaver:
            await asyncio.wait_for(free, 10)
        else:
            # LangGraph's saver takes one lock for every operation, on a pool too
            # (langchain-ai/langgraph#7259): the free write waits for the blocked one.
            await asyncio.sleep(0.5)
            assert not free.done()
        other.rollback()
    await asyncio.wait_for(asyncio.gather(blocked, free), 30)


async def test_the_servers_pool_is_sized_by_its_setting(pg_schema_url: str, tmp_path: Path) -> None:
    from server.host import open_host
    from server.settings import Settings

    settings = Settings(data_dir=tmp_path, database_url=pg_schema_url, db_pool_size=3)
    async with open_host(settings, run_worker=False) as host:
        saver = host.engine.checkpointer
        assert isinstance(saver, PooledPostgresSaver)
        assert isinstance(saver.conn, AsyncConnectionPool) and saver.conn.max_size == 3
