"""``Memory.forget`` (what ``DELETE /memory`` runs, and counts on the audit trail) on
LangGraph's in-memory store: an item an agent writes again while it is being erased is
erased and counted once; a store that keeps what it is told to delete does not hold
the erasure in a loop, nor is what it kept counted."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from langgraph.store.base import Op, PutOp, Result
from langgraph.store.memory import InMemoryStore

from runtime.memory import Memory


class Rewrites(InMemoryStore):
    """An agent writing ``key`` again just after each of the erasure's first ``times``
    deletions."""

    def __init__(self, key: str, times: int = 1) -> None:
        super().__init__()
        self.key = key
        self.times = times
        self.deletions: list[int] = []

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results = await super().abatch(ops)
        deletes = [op for op in ops if isinstance(op, PutOp) and op.value is None]
        if deletes:
            self.deletions.append(len(deletes))
            if len(self.deletions) <= self.times:
                [again] = [op for op in deletes if op.key == self.key]
                await super().abatch([PutOp(again.namespace, again.key, {"v": "again"})])
        return results


class KeepsEverything(InMemoryStore):
    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        kept = [op for op in ops if not (isinstance(op, PutOp) and op.value is None)]
        return await super().abatch(kept)


async def five_items(store: InMemoryStore) -> Memory:
    memory = Memory(store, "acme.com", "ann")
    for i in range(5):
        await memory.put(f"k{i}", {"v": i}, *(("sub",) if i % 2 else ()))
    await Memory(store, "acme.com", "bob").put("k0", {"v": "bob's"})
    return memory


@pytest.mark.parametrize("times", [1, 3])
async def test_an_item_written_again_meanwhile_is_erased_and_counted_once(times: int) -> None:
    store = Rewrites("k3", times)
    memory = await five_items(store)

    assert await memory.forget() == 5
    assert store.deletions == [5] + [1] * times  # k3 deleted again after each write
    assert await memory.items() == {} and await memory.items("sub") == {}
    assert await Memory(store, "acme.com", "bob").get("k0") == {"v": "bob's"}


async def test_a_store_that_keeps_what_it_is_told_to_delete_ends_the_erasure() -> None:
    memory = await five_items(KeepsEverything())

    assert await memory.forget() == 0


async def test_nothing_to_erase_is_zero() -> None:
    assert await Memory(InMemoryStore(), "acme.com", "ann").forget() == 0
