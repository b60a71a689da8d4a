"""The in-process wake-ups: which seq a wake-up reaches, and when its events can be
sent without reading the log (only when this process committed every one of them)."""

from __future__ import annotations

from runtime.eventbus import EventBus


def row(seq: int) -> dict[str, object]:
    return {"run_id": "r", "seq": seq, "type": "state", "ts": "t", "data": "{}"}


async def test_committed_here_events_are_handed_over_in_order() -> None:
    bus = EventBus()
    with bus.subscribe("r") as waiter:
        bus.publish("r", 4, [row(4)])
        bus.publish("r", 3, [row(2), row(3)])  # commits announced out of order
        assert waiter.is_set()
        assert [r["seq"] for r in waiter.rows_after(1) or []] == [2, 3, 4]
        assert [r["seq"] for r in waiter.rows_after(3) or []] == [4]


async def test_a_gap_or_an_unknown_wake_up_means_reading_the_log() -> None:
    bus = EventBus()
    with bus.subscribe("r") as waiter:
        bus.publish("r", 3, [row(3)])
        assert waiter.rows_after(1) is None  # seq 2 was committed elsewhere
        waiter.clear()
        bus.publish("r", 2, [row(2)])
        bus.publish("r", 5, [])  # another process's NOTIFY: no rows
        assert waiter.rows_after(1) is None
        waiter.clear()
        bus.publish("r", 2, [row(2)])
        bus.publish_all()  # a reconnect: anything may have been missed
        assert waiter.rows_after(1) is None and waiter.news_after(10**9)


async def test_an_echo_or_a_nudge_is_not_news() -> None:
    bus = EventBus()
    with bus.subscribe("r") as waiter, bus.subscribe("other") as bystander:
        bus.publish("r", 7, [row(7)])
        bus.publish("r", 7)  # the same commit again, by NOTIFY
        bus.publish("r", 0)  # a drive ended
        assert not waiter.news_after(7) and waiter.news_after(6)
        assert waiter.rows_after(7) is None
        assert not bystander.is_set()
        waiter.clear()
        assert not waiter.is_set() and waiter.rows == [] and not waiter.news_after(0)
