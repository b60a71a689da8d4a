"""asyncio helpers the runtime shares."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Hashable
from typing import TypeVar

T = TypeVar("T")


async def to_the_end(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even if the caller is cancelled meanwhile, then raise
    the cancellation: for a step whose work must be over before the caller's
    cancellation goes on (a COMMIT that still holds a lock, an outcome on its way to
    the ledger that a cancel is about to look at)."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller sees
        raise


async def within(timeout_s: float, step: Awaitable[object]) -> bool:
    """Await ``step`` for at most ``timeout_s`` seconds; whether it finished.

    In the awaiting task, under ``asyncio.timeout``: Python 3.11's ``asyncio.wait_for``
    runs the step in a task of its own and loses a cancel of the caller that lands as
    the step finishes (a waiter woken by the very shutdown that cancels it), and the
    caller goes on as if nobody had asked."""
    try:
        async with asyncio.timeout(timeout_s):
            await step
    except TimeoutError:
        return False
    return True


class KeyedLock:
    """An asyncio lock per key, made on first use and dropped once nobody holds it or
    waits for it (keys may be many: a lock per user)."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
