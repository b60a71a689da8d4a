"""Server-sent events over the per-run event log: replay from a seq, then follow live."""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

from runtime.aio import within
from runtime.dberrors import DATABASE_ERRORS, TRANSIENT_DB_ERRORS
from runtime.errors import Code, RuntimeProblem
from runtime.eventbus import EventBus
from runtime.events import is_terminal_event
from runtime.lifecycle import TERMINAL
from runtime.model import Event, UnreadableEvent
from runtime.store.base import RunStore
from runtime.store.records import ShownEvent, shown
from server.settings import one_line

log = logging.getLogger(__name__)

LOG_PAGE = 500
"""Events read from the log at once."""
UNREADABLE = "unreadable"
"""The ``event:`` name of a stored event that no longer validates: not a type of the
vocabulary, the marked form of one whose row cannot be read (its type as stored is
in its data). Its ``id:`` is its seq all the same, so that a reconnect resumes past it."""


def format_event(event: ShownEvent) -> bytes:
    name = UNREADABLE if isinstance(event, UnreadableEvent) else event.type
    data = json.dumps(event.model_dump(mode="json"), ensure_ascii=False)
    return f"id: {event.seq}\nevent: {name}\ndata: {data}\n\n".encode()


async def event_stream(
    store: RunStore,
    bus: EventBus,
    run_id: str,
    after: int,
    keepalive_s: float,
    stopping: asyncio.Event | None = None,
    allowed: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[bytes]:
    """Everything after ``after``, then live events; ends after the terminal state event,
    or once ``stopping`` is set (the server shutting down: it wakes every stream, and the
    client reconnects with Last-Event-ID, as the ``retry`` line tells it to), or once
    ``allowed``, asked again every ``keepalive_s``, says the caller's credential no
    longer holds (a key revoked, a token expired: a parked run's stream may stay open
    for days, and its reconnect gets the 401), or once the database fails a read (the
    reconnect finds it back, or gets a 503)."""
    yield b"retry: 1000\n\n"
    loop = asyncio.get_running_loop()
    recheck_at = loop.time() + keepalive_s
    try:
        with bus.subscribe(run_id) as waiter:
            woken = False
            while True:
                if stopping is not None and stopping.is_set():
                    return
                if allowed is not None and loop.time() >= recheck_at:
                    if not await allowed():
                        return
                    recheck_at = loop.time() + keepalive_s
                # Events this process committed came with their wake-up: no read of the log.
                committed_here = waiter.rows_after(after) if woken else None
                waiter.clear()
                events: list[ShownEvent]
                if committed_here is not None:
                    events = shown(committed_here, Event, UnreadableEvent)
                else:
                    events = await store.shown_events(run_id, after, limit=LOG_PAGE)
                for event in events:
                    yield format_event(event)
                    after = event.seq
                    if isinstance(event, Event) and is_terminal_event(event.type, event.data):
                        return
                if len(events) == LOG_PAGE:
                    continue  # more is waiting in the log
                if not events or any(isinstance(e, UnreadableEvent) for e in events):
                    # Nothing new: the run may have ended before `after` (a reconnect past
                    # its end), where no terminal event is left to send; or the terminal
                    # event was one that cannot be read, and would not end the stream.
                    run = await store.get_run(run_id)
                    if run is None or run.state in TERMINAL:
                        # The terminal event may have committed after our read of the log.
                        if run is not None and await store.shown_events(run_id, after, limit=1):
                            continue
                        return
                # Cleared before the read, so an event committed since then has set it: no
                # second read to find out there is nothing more (one read per new commit).
                woken = False
                while True:
                    if not await within(keepalive_s, waiter.wait()):
                        yield b": keepalive\n\n"
                        break
                    if stopping is not None and stopping.is_set():
                        return
                    if waiter.news_after(after):
                        woken = True
                        break
                    waiter.clear()
    except DATABASE_ERRORS as exc:
        # The response has started: no problem document can follow. Ended cleanly, the
        # client reconnects after the `retry` line's second, with its Last-Event-ID,
        # and is answered a 503 if the database is still away.
        if isinstance(exc, TRANSIENT_DB_ERRORS):  # a blip: the reconnect is the remedy
            log.warning(
                "the event stream of %s ended on a database error: %s", run_id, one_line(exc)
            )
        else:  # a schema or a query at fault, not the connection: its traceback is wanted
            log.exception("the event stream of %s ended on a database error", run_id)


class StreamSlots:
    """Open event streams per caller in this process, so one caller cannot hold them all."""

    def __init__(self) -> None:
        self.open: Counter[tuple[str, str]] = Counter()

    def acquire(self, holder: tuple[str, str], limit: int) -> Callable[[], None]:
        """Take a slot or raise TOO_MANY_STREAMS; the returned release is idempotent."""
        if self.open[holder] >= limit:
            raise RuntimeProblem(
                Code.TOO_MANY_STREAMS,
                f"{limit} event streams or waiting requests are open for this caller;"
                " close one first",
                retry_after=5,
            )
        self.open[holder] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open[holder] -= 1
                if self.open[holder] <= 0:
                    del self.open[holder]

        return release

    def hold(
        self, stream: AsyncIterator[bytes], release: Callable[[], None]
    ) -> AsyncIterator[bytes]:
        """The stream, giving its slot back when it ends or is dropped unstarted."""

        async def held() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                release()

        wrapper = held()
        # A response that never starts never runs the finally: collection releases it.
        weakref.finalize(wrapper, release)
        return wrapper
