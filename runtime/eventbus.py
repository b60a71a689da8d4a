"""In-process wake-ups for event streams: the store announces each committed event here.

The event table is the truth and the replay source; this only tells a waiting
SSE stream that there is something new to read, and up to which seq.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

Row = dict[str, Any]


class Waiter(asyncio.Event):
    """Set when the run may have something new; ``latest`` says how far it goes."""

    def __init__(self) -> None:
        super().__init__()
        self.latest: int | None = 0
        """The highest seq announced since :meth:`clear`; None: unknown (read to find out)."""
        self.rows: list[Row] = []
        """Event rows committed in this process and announced since :meth:`clear`."""

    def clear(self) -> None:
        super().clear()
        self.latest = 0
        self.rows = []

    def announce(self, seq: int | None, rows: Sequence[Row] = ()) -> None:
        if seq is None or self.latest is None:
            self.latest = None
        else:
            self.latest = max(self.latest, seq)
        self.rows.extend(rows)
        self.set()

    def rows_after(self, seq: int) -> list[Row] | None:
        """Every event after ``seq`` up to the latest announced, if this process committed
        them all (no read of the log needed); None if any is missing or it is unknown.
        """
        if self.latest is None or self.latest <= seq:
            return None
        by_seq = {int(r["seq"]): r for r in self.rows if int(r["seq"]) > seq}
        if len(by_seq) != self.latest - seq or min(by_seq) != seq + 1:
            return None
        return [by_seq[s] for s in sorted(by_seq)]

    def news_after(self, seq: int) -> bool:
        """Whether what woke us can hold an event after ``seq``.

        Each commit is announced twice on PostgreSQL (in-process, then by NOTIFY), and
        a finished drive wakes its waiters with seq 0: a stream that already sent
        ``seq`` need not read the log again for those.
        """
        return self.latest is None or self.latest > seq


class EventBus:
    def __init__(self) -> None:
        self._waiters: dict[str, set[Waiter]] = {}

    def publish(self, run_id: str, seq: int, rows: Sequence[Row] = ()) -> None:
        """``seq``: the run's last event seq now committed (0: none new, only a nudge);
        ``rows``: those events as stored, when they were committed in this process."""
        for waiter in self._waiters.get(run_id, ()):
            waiter.announce(seq, rows)

    def publish_all(self) -> None:
        """Wake every stream: something may have been missed (a reconnect)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.announce(None)

    @contextmanager
    def subscribe(self, run_id: str) -> Iterator[Waiter]:
        waiter = Waiter()
        self._waiters.setdefault(run_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[run_id]
