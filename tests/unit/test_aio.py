"""runtime.aio: a step outlives its caller's cancellation, which comes after; locks by key."""

from __future__ import annotations

import asyncio

import pytest

from runtime.aio import KeyedLock, to_the_end, within


async def test_the_step_ends_before_the_cancellation_goes_on() -> None:
    events: list[str] = []

    async def step() -> str:
        await asyncio.sleep(0.05)
        events.append("step done")
        return "done"

    async def caller() -> None:
        try:
            await to_the_end(step())
        except asyncio.CancelledError:
            events.append("caller cancelled")
            raise

    task = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["step done", "caller cancelled"]


async def test_a_step_that_fails_after_a_cancel_still_ends_in_the_cancellation() -> None:
    ended: list[str] = []

    async def step() -> None:
        await asyncio.sleep(0.05)
        ended.append("step")
        raise RuntimeError("the store went away")

    task = asyncio.create_task(to_the_end(step()))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0.01)
    task.cancel()  # a second cancel: it still waits for the step
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == ["step"]


async def test_without_a_cancel_it_is_the_step() -> None:
    async def step() -> int:
        return 7

    assert await to_the_end(step()) == 7


async def test_a_cancel_landing_as_the_wait_ends_is_not_lost() -> None:
    """Python 3.11's wait_for returns the step's result when the caller's cancel and
    the step's end meet; ``within`` delivers the cancel."""
    event = asyncio.Event()

    async def waiter() -> str:
        await within(10.0, event.wait())
        return "went on"

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0)  # waiting on the event
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_within_says_whether_the_step_finished() -> None:
    event = asyncio.Event()
    assert not await within(0.01, event.wait())
    event.set()
    assert await within(0.01, event.wait())


async def test_a_keyed_lock_excludes_per_key_and_forgets_keys_nobody_holds() -> None:
    locks = KeyedLock()
    inside = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    both_at_once = False

    async def hold(key: str) -> None:
        nonlocal both_at_once
        async with locks.hold(key):
            inside[key] += 1
            most[key] = max(most[key], inside[key])
            both_at_once = both_at_once or (inside["a"] > 0 and inside["b"] > 0)
            await asyncio.sleep(0.01)
            inside[key] -= 1

    await asyncio.gather(*(hold(k) for k in "abababab"))

    assert most == {"a": 1, "b": 1} and both_at_once  # one holder a key; keys apart
    assert len(locks) == 0
