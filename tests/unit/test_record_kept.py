"""What a drive does first with the outcomes its engine kept for the run's calls
(``GraphDriving._record_kept``), on a real store under the drive's lease: it writes one
whose call is as its handler left it, lets go of one the ledger has moved past, keeps
one the database refuses for now, and lets go of one that can never be written,
without failing the drive (which may be a cancel's, to end the run)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from runtime.graph_drive import GraphDriving
from runtime.lifecycle import State
from runtime.model import Run
from runtime.recording import Finished, Recording, Unrecorded
from runtime.store.base import RunStore
from tests.unit.conftest import MakeRun
from tests.unit.test_outcome_blip import BLIP_S, Blip, blip, execute, left_unrecorded, store

__all__ = ["blip", "store"]  # fixtures


class Kept(GraphDriving):
    """A drive's engine as far as ``_record_kept`` reads it: the outcomes it kept."""

    def __init__(self, kept: Unrecorded) -> None:
        self.__dict__["unrecorded"] = kept


async def drive_view(store: RunStore, run_id: str) -> RunStore:
    """The store as a drive of the run sees it: under a lease of its own."""
    async with asyncio.timeout(10):
        while True:
            version = await store.take_lease(run_id, "next-drive", 5.0)
            if version is not None:
                return store.fenced(run_id, version)
            await asyncio.sleep(0.05)  # the lease the kept call's drive left lapses


async def kept_call(store: RunStore, blip: Blip, run: Run) -> tuple[str, Finished, Unrecorded]:
    """A call left ``running`` whose outcome its engine kept: (its id, that outcome, the kept)."""
    _, recording = await left_unrecorded(store, blip, run.run_id, [])
    [(tool_call_id, finished)] = recording.kept.of_run(run.run_id)
    return tool_call_id, finished, recording.kept


async def test_a_kept_outcome_is_written_and_let_go(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    run = await make_run(store)
    tool_call_id, _, kept = await kept_call(store, blip, run)

    await Kept(kept)._record_kept(await drive_view(store, run.run_id), run)

    row = await store.get_tool_call(tool_call_id)
    assert row is not None and row.status == "succeeded" and row.output == {"shipped": "box"}
    assert len(kept) == 0


async def test_one_of_a_run_that_has_ended_is_let_go_unwritten(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    run = await make_run(store)
    tool_call_id, _, kept = await kept_call(store, blip, run)
    ended = run.model_copy(update={"state": State.FAILED})  # its ending closes the call

    await Kept(kept)._record_kept(await drive_view(store, run.run_id), ended)

    row = await store.get_tool_call(tool_call_id)
    assert row is not None and row.status == "running"
    assert len(kept) == 0


async def test_one_of_a_call_another_drive_has_ruled_on_is_let_go_unwritten(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    run = await make_run(store)
    spec, recording = await left_unrecorded(store, blip, run.run_id, [])
    # Another process's drive, not knowing the outcome, closed the call as unknown.
    ruled = await execute(store, run.run_id, spec, Recording())
    assert ruled.status == "unknown" and len(recording.kept) == 1

    await Kept(recording.kept)._record_kept(await drive_view(store, run.run_id), run)

    assert await store.get_tool_call(ruled.tool_call_id) == ruled
    assert len(recording.kept) == 0


async def test_one_whose_output_json_cannot_hold_is_written_with_a_note(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    """An output JSON cannot hold (a cycle): the drive failed on it, and a cancel's
    drive ended the run as INTERNAL_ERROR rather than cancelled; then it was let go,
    the call left running. The ledger writes a note in its place, as for a call that
    ran in this drive (test_ledger)."""
    run = await make_run(store)
    tool_call_id, finished, kept = await kept_call(store, blip, run)
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    kept.keep(tool_call_id, replace(finished, output=cycle))

    await Kept(kept)._record_kept(await drive_view(store, run.run_id), run)

    row = await store.get_tool_call(tool_call_id)
    assert row is not None and row.status == finished.status
    assert row.output == {"not_kept": "the output has no JSON form: Circular reference detected"}
    assert len(kept) == 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_one_the_database_refuses_for_now_is_kept(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    """SQLite alone: there another connection's write lock refuses the one try surely."""
    run = await make_run(store)
    tool_call_id, _, kept = await kept_call(store, blip, run)
    view = await drive_view(store, run.run_id)
    await blip.begin(BLIP_S)

    await Kept(kept)._record_kept(view, run)

    assert len(kept) == 1
    await blip.over(store)
    row = await store.get_tool_call(tool_call_id)
    assert row is not None and row.status == "running"
