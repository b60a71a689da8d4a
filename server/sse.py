"""Server-sent events over the per-run event log: replay from a seq, then follow live."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from runtime.eventbus import EventBus
from runtime.events import is_terminal_event
from runtime.lifecycle import TERMINAL
from runtime.model import Event
from runtime.store.base import RunStore


def format_event(event: Event) -> bytes:
    data = json.dumps(event.model_dump(mode="json"), ensure_ascii=False)
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


async def event_stream(
    store: RunStore, bus: EventBus, run_id: str, after: int, keepalive_s: float
) -> AsyncIterator[bytes]:
    """Everything after ``after``, then live events; ends after the terminal state event."""
    yield b"retry: 1000\n\n"
    with bus.subscribe(run_id) as waiter:
        while True:
            waiter.clear()
            events = await store.list_events(run_id, after)
            for event in events:
                yield format_event(event)
                after = event.seq
                if is_terminal_event(event.type, event.data):
                    return
            if not events:
                run = await store.get_run(run_id)
                if run is None or run.state in TERMINAL:
                    # The terminal event may have committed after our read of the log.
                    if run is not None and await store.list_events(run_id, after, limit=1):
                        continue
                    return
                try:
                    await asyncio.wait_for(waiter.wait(), keepalive_s)
                except TimeoutError:
                    yield b": keepalive\n\n"
