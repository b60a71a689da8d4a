"""In-process wake-ups for event streams: the store announces each committed event here.

The event table is the truth and the replay source; this only tells a waiting
SSE stream that there is something new to read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class EventBus:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def publish(self, run_id: str, seq: int) -> None:
        for waiter in self._waiters.get(run_id, ()):
            waiter.set()

    def publish_all(self) -> None:
        """Wake every stream: something may have been missed (a reconnect)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.set()

    @contextmanager
    def subscribe(self, run_id: str) -> Iterator[asyncio.Event]:
        waiter = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[run_id]
