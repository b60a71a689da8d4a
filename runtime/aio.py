"""asyncio helpers the runtime shares."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
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
