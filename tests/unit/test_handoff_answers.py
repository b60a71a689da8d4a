"""A run that fails inside a sub-agent answers each handoff still open with a ``result``,
once: a handback already in the log is the one answer, readable or not."""

from __future__ import annotations

import json
from typing import Any, Literal

from runtime.adapter import fail_run
from runtime.errors import Code
from runtime.events import EventType
from runtime.ids import handoff_key
from runtime.lifecycle import State
from runtime.store.base import RunStore
from tests.unit.conftest import MakeRun
from tests.unit.test_fencing import store_of


def move(hid: str, phase: str, from_agent: str, to_agent: str, depth: int) -> dict[str, Any]:
    """A handoff's ``action`` (start) or ``result`` (return), as nodes.handoff writes it."""
    data: dict[str, Any] = {
        "tool_call_id": hid,
        "tool": f"handoff_to_{to_agent if phase == 'start' else from_agent}",
        "handoff": {
            "phase": phase,
            "from_agent": from_agent,
            "to_agent": to_agent,
            "step_index": depth,
            "depth": depth,
        },
    }
    if phase == "return":
        data |= {"status": "succeeded", "output": {"answer": "done"}}
    return data


Phase = Literal["start", "return"]


async def nested(store: RunStore, run_id: str) -> None:
    """main hands to relay (h-1), relay to worker (h-2); worker has handed back."""
    moves: list[tuple[str, Phase, str, str, int]] = [
        ("h-1", "start", "main", "relay", 1),
        ("h-2", "start", "relay", "worker", 2),
        ("h-2", "return", "worker", "relay", 2),
    ]
    for hid, phase, frm, to, depth in moves:
        kind = EventType.ACTION if phase == "start" else EventType.RESULT
        data = move(hid, phase, frm, to, depth)
        await store.append_event(run_id, kind, data, dedupe_key=handoff_key(hid, phase))


async def answers(store: RunStore, run_id: str) -> list[str]:
    """The handoff each ``result`` of a handoff answers, in log order, read or not (one
    that no longer validates by its dedupe key)."""
    async with store.read(runs=False) as tx:
        rows = await tx.fetchall(
            "SELECT dedupe_key, data FROM events WHERE run_id = ? AND type = 'result' ORDER BY seq",
            (run_id,),
        )
    found = []
    for row in rows:
        data = json.loads(row["data"]) if isinstance(row["data"], str) else row["data"]
        if isinstance(data, dict) and "handoff" in data:
            found.append(str(data["tool_call_id"]))
        elif row["dedupe_key"] is not None:
            found.append(str(row["dedupe_key"]).split(":")[1])
    return found


async def test_an_open_handoff_is_answered_once_and_a_closed_one_not(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store, state=State.EXECUTING)
    await nested(store, run.run_id)

    await fail_run(store, run.run_id, Code.RUN_CANCELLED, "stop")

    assert await answers(store, run.run_id) == ["h-2", "h-1"]


async def test_a_handback_that_no_longer_validates_is_still_the_one_answer(
    backend: object, make_run: MakeRun
) -> None:
    """The worker's handback, edited so it no longer validates, is passed over when the
    log is read: the failure answered h-2 a second time, a return from the worker that
    had returned already."""
    store = store_of(backend)
    run = await make_run(store, state=State.EXECUTING)
    await nested(store, run.run_id)
    async with store.tx() as tx:
        await tx.execute(
            "UPDATE events SET data = ? WHERE run_id = ? AND dedupe_key = ?",
            ("[1, 2]", run.run_id, handoff_key("h-2", "return")),
        )

    ended = await fail_run(store, run.run_id, Code.RUN_CANCELLED, "stop")

    assert ended is not None and ended.state is State.FAILED
    assert await answers(store, run.run_id) == ["h-2", "h-1"]
