"""Retention: runs that ended before the cut-off go whole (rows, log, ledger,
checkpoints), artifacts only when no other run names them; nothing else is touched."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runtime.model import Artifact, utcnow
from runtime.retention import prune
from runtime.store.retention import CHUNK
from tests.api.conftest import Api, make_settings, open_api
from tests.api.helpers import parked_demo_run

LONG_AGO = "2001-01-01T00:00:00Z"


async def finished_demo_run(api: Api) -> tuple[str, str]:
    """A demo run approved and succeeded: (run_id, its report's artifact_id)."""
    run_id, approval_id, artifact_id = await parked_demo_run(api)
    assert (await api.decide(run_id, approval_id, "approve")).status_code in (200, 202)
    assert (await api.settle(run_id))["state"] == "succeeded"
    return run_id, artifact_id


async def set_run(api: Api, run_id: str, column: str, value: str) -> None:
    async with api.engine_services.store.tx() as tx:
        await tx.execute(f"UPDATE runs SET {column} = ? WHERE run_id = ?", (value, run_id))


async def ended_long_ago(api: Api, run_id: str) -> None:
    await set_run(api, run_id, "ended_at", LONG_AGO)


async def rows_of(api: Api, run_id: str) -> dict[str, int]:
    store = api.engine_services.store
    counts: dict[str, int] = {}
    for table in ("runs", "events", "steps", "tool_calls", "approvals"):
        async with store.read(runs=False) as tx:
            row = await tx.fetchone(
                f"SELECT COUNT(*) AS n FROM {table} WHERE run_id = ?", (run_id,)
            )
        counts[table] = int((row or {})["n"])
    return counts


async def checkpoint_of(api: Api, run_id: str) -> Any:
    return await api.engine.checkpointer.aget_tuple({"configurable": {"thread_id": run_id}})


async def test_an_ended_run_goes_whole_and_a_shared_artifact_stays(api: Api) -> None:
    old, report = await finished_demo_run(api)
    recent, same_report = await finished_demo_run(api)
    assert same_report == report  # the same question, the same report: one artifact
    parked, _, _ = await parked_demo_run(api)
    for run_id in (old, parked):
        await ended_long_ago(api, run_id)  # a parked run has no end: it must stay anyway
    await set_run(api, parked, "created_at", LONG_AGO)
    store = api.engine_services.store
    assert all(n > 0 for n in (await rows_of(api, old)).values())
    assert await checkpoint_of(api, old) is not None
    cutoff = utcnow() - timedelta(days=1)
    assert await store.count_ended_runs(cutoff) == 1

    pruned = await prune(store, api.engine.checkpointer, cutoff)

    assert pruned.runs == [old] and pruned.artifacts == 0
    assert set((await rows_of(api, old)).values()) == {0}
    assert await checkpoint_of(api, old) is None
    assert (await api.client.get(f"/runs/{old}")).status_code == 404
    # The recent run still names the report: it stays, and is still served.
    assert await store.artifact_exists(report)
    assert (await api.client.get(f"/artifacts/{report}")).status_code == 200
    for kept in (recent, parked):
        assert (await api.client.get(f"/runs/{kept}")).status_code == 200
        assert await checkpoint_of(api, kept) is not None
    assert (await api.client.get(f"/runs/{parked}")).json()["state"] == "waiting_human"

    # The parked run names the report too: it stays while that run does.
    await ended_long_ago(api, recent)
    again = await prune(store, api.engine.checkpointer, cutoff)
    assert again.runs == [recent] and again.artifacts == 0
    assert await store.artifact_exists(report)
    # Once the last run naming it goes, so does the artifact; a third prune finds nothing.
    assert (await api.client.post(f"/runs/{parked}/cancel", json={})).status_code == 200
    assert (await api.settle(parked))["state"] == "failed"
    await ended_long_ago(api, parked)
    last = await prune(store, api.engine.checkpointer, cutoff, batch=1)
    assert last.runs == [parked] and last.artifacts == 1
    assert not await store.artifact_exists(report)
    assert (await prune(store, api.engine.checkpointer, cutoff)).runs == []


async def test_a_run_written_after_the_prune_picked_it_is_not_deleted(api: Api) -> None:
    run_id, _ = await finished_demo_run(api)
    store = api.engine_services.store
    cutoff = utcnow() - timedelta(days=1)
    await ended_long_ago(api, run_id)
    picked = await store.ended_runs(cutoff, limit=10)
    assert picked == [run_id]
    # Meanwhile its end moved past the cut-off (as a run can only by a write of ours):
    await set_run(api, run_id, "ended_at", "2999-01-01T00:00:00Z")

    assert await store.delete_ended_runs(picked, cutoff) == ([], 0)
    assert (await rows_of(api, run_id))["events"] > 0


async def test_a_worker_prunes_by_itself_when_retention_is_set(
    database_url: str, data_dir: Path
) -> None:
    # Kept for a tenth of a second, pruned every second (jittered, the least allowed).
    settings = make_settings(
        database_url, data_dir, retention_days=0.1 / 86400, retention_interval_s=1.0
    )
    async with open_api(settings) as api:
        run = await api.create(agent_id="typo_fixer", input="x")
        assert (await api.settle(run["run_id"]))["state"] == "succeeded"
        parked, _, _ = await parked_demo_run(api)
        deadline = asyncio.get_running_loop().time() + 20
        while (await api.client.get(f"/runs/{run['run_id']}")).status_code != 404:
            assert asyncio.get_running_loop().time() < deadline, "never pruned"
            await asyncio.sleep(0.05)
        assert await checkpoint_of(api, run["run_id"]) is None
        assert (await api.client.get(f"/runs/{parked}")).json()["state"] == "waiting_human"


async def test_a_run_with_more_artifacts_than_a_statement_lists_goes_whole(api: Api) -> None:
    run_id, report = await finished_demo_run(api)
    store = api.engine_services.store
    many = [f"art-bulk-{i:04d}" for i in range(CHUNK + 20)]
    for artifact_id in many:  # more than one IN list, and over every lock stripe
        artifact = Artifact(
            artifact_id=artifact_id, media_type="text/plain", size=1, name="a", run_id=run_id,
            created_at=utcnow(),
        )  # fmt: skip
        await store.put_artifact(artifact, b"x")
    await ended_long_ago(api, run_id)

    pruned = await prune(store, api.engine.checkpointer, utcnow() - timedelta(days=1))

    assert pruned.runs == [run_id] and pruned.artifacts == len(many) + 1  # and the report
    assert not any([await store.artifact_exists(a) for a in (many[0], many[-1], report)])


async def test_a_trace_whose_run_is_pruned_as_it_is_sent_is_cut_off_not_closed(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Closed, its JSON would read as the whole record with events missing."""
    from runtime.events import EventType
    from server.api.trace import EVENTS_PER_CHUNK, LogGone

    run_id, _ = await finished_demo_run(api)
    store = api.engine_services.store
    for i in range(EVENTS_PER_CHUNK + 10):  # a second page of the log
        await store.append_event(run_id, EventType.ERROR, {"i": i})
    await ended_long_ago(api, run_id)
    shown_events, pages = store.shown_events, 0

    async def pruned_after_the_first_page(of: str, after: int = 0, limit: int = 1000) -> Any:
        nonlocal pages
        pages += 1
        if pages == 2:
            pruned = await prune(store, api.engine.checkpointer, utcnow() - timedelta(days=1))
            assert pruned.runs == [run_id]
        return await shown_events(of, after, limit=limit)

    monkeypatch.setattr(store, "shown_events", pruned_after_the_first_page)
    with caplog.at_level(logging.WARNING, logger="server.api.problems"), pytest.raises(LogGone):
        await api.client.get(f"/runs/{run_id}/trace")
    assert pages == 2
    # Intended, not a bug: one warning line, no ERROR with a traceback.
    [said] = [r for r in caplog.records if r.name == "server.api.problems"]
    assert said.levelname == "WARNING" and said.exc_info is None
    assert "was pruned while its trace was sent" in said.getMessage()


async def test_a_run_whose_checkpoints_are_pruned_first_is_gone_not_made_up(api: Api) -> None:
    """A prune deletes a run's checkpoints, then its rows (a prune stopped in between
    leaves it so until the next): its checkpoint answered 200 with a made-up empty
    state (step 0, no calls) for a run whose steps said otherwise."""
    run_id, _ = await finished_demo_run(api)
    await api.engine.checkpointer.adelete_thread(run_id)

    answer = await api.client.get(f"/runs/{run_id}/checkpoint")
    # A step /steps still lists: "decided no step 0" said the opposite of the record.
    context = await api.client.get(f"/runs/{run_id}/planner-context/0")

    for gone in (answer, context):
        assert gone.status_code == 404 and gone.json()["code"] == "RUN_NOT_FOUND", gone.text
        assert "being pruned" in gone.json()["detail"]


def test_a_trace_cut_off_by_pruning_is_logged_as_a_warning_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What uvicorn logs for an exception in a response already under way: an ERROR with
    a traceback, as for a bug; a trace cut off by retention is none."""
    import logging

    from server.api.trace import LogGone
    from server.serving import quiet_pruned_traces

    quiet_pruned_traces()
    errors = logging.getLogger("uvicorn.error")
    try:
        raise LogGone("run r was pruned while its trace was sent")
    except LogGone as exc:
        with caplog.at_level(logging.INFO, logger="uvicorn.error"):
            errors.error("Exception in ASGI application\n", exc_info=exc)
            errors.error("Exception in ASGI application\n", exc_info=RuntimeError("a bug"))
    cut, bug = caplog.records
    assert (cut.levelname, cut.exc_info) == ("WARNING", None)
    assert cut.getMessage() == "trace cut off: run r was pruned while its trace was sent"
    assert bug.levelname == "ERROR" and bug.exc_info is not None
