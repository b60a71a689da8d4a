"""runtime.aio.to_the_end: a step outlives its caller's cancellation, which comes after."""

from __future__ import annotations

import asyncio

import pytest

from runtime.aio import to_the_end


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
