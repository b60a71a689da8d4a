"""A drive's deferred state changes: they ride in the same commit as its next write.

The adapter fires a transition when LangGraph starts a node ("planning", then
"executing"). Written at once, each is a commit of its own (an fsync on SQLite, a
round trip and a WAL flush on PostgreSQL) a moment before the node's own first
write: the step it records, the ledger row it claims. Deferred, the transition is
written first *inside* that write's transaction (a pipelined statement on
PostgreSQL), in the same order, under the same lease fence, and announced with it.

What changes for a reader: the state event becomes visible when the node first
writes, or :data:`FLUSH_AFTER_S` after the node started, whichever is first (a
node that thinks for seconds still shows "planning" at once). A crash before then
loses only a state event of a node that had written nothing; the next drive
fires it again when LangGraph starts the node again. The drive itself never sees
the lag: every read of the runs or events tables by its store view writes the
pending changes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.lifecycle import State, Trigger, transition
from runtime.store.codec import _ts

log = logging.getLogger(__name__)

FLUSH_AFTER_S = 0.02
"""How long a deferred state change waits for the node's first write to carry it.

Short enough that nobody watching the run notices, long enough to span a fast
node and LangGraph's checkpoint between two nodes (guard → executor)."""
RETRY_MAX_S = 1.0
"""The longest wait between two timer flushes that failed (a database blip, or a
lease lost while the node still thinks)."""


@dataclass(frozen=True)
class PendingTransition:
    run_id: str
    trigger: Trigger
    expect: State
    fields: dict[str, Any] = field(default_factory=dict)
    to: State | None = None
    """The target, where the trigger may lead to more than one state."""
    at: str = field(default_factory=_ts)
    """When the state changed (the node started): its event's ``ts``, so that the write
    carrying it, whose events were stamped before it took the change, does not show a
    later time at a lower seq."""

    @property
    def target(self) -> State:
        return transition(self.expect, self.trigger, self.to)


class Journal:
    """The pending transitions of one store view (one drive), oldest first."""

    def __init__(self, flush: Callable[[], Awaitable[None]]) -> None:
        """``flush``: writes the pending changes (the store view's own flush)."""
        self.pending: list[PendingTransition] = []
        self._flush = flush
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        """The timer's flush under way (held so that it is not garbage-collected)."""
        self._closed = False
        self._delay = FLUSH_AFTER_S

    def busy(self) -> bool:
        """Whether a write must go through :meth:`ordered` to keep the drive's order."""
        return bool(self.pending) or self._lock.locked()

    def add(self, change: PendingTransition) -> None:
        self.pending.append(change)
        self._arm()

    def _arm(self) -> None:
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._flush_later)

    def _flush_later(self) -> None:
        self._timer = None
        if self.pending:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        # The drive's next write meets the same error (a lost lease, a database
        # outage) and handles it; the changes stay pending for it, and for the timer,
        # which tries again less and less often.
        try:
            await self._flush()
        except Exception:
            log.debug("deferred state change not written yet", exc_info=True)
            self._delay = min(self._delay * 2, RETRY_MAX_S)
            if self.pending:
                self._arm()
        else:
            self._delay = FLUSH_AFTER_S

    @contextlib.asynccontextmanager
    async def ordered(self) -> AsyncIterator[list[PendingTransition]]:
        """Hold the drive's writes in order and take the pending changes for this one.

        If the write fails, they are pending again (in front of any added since) and
        the timer will try them. A write cancelled while its commit was under way may
        have committed them: writing them is idempotent (a change whose target state
        the run is already in is skipped), so putting them back is always safe.
        """
        async with self._lock:
            taken, self.pending = self.pending, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            try:
                yield taken
            except BaseException:
                self.pending[:0] = taken
                if self.pending:
                    self._arm()
                raise

    def close(self) -> None:
        """The drive is over: no timer may fire for it later."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
