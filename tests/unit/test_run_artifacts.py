"""A failed run's outcome names the artifacts it made (its partial results), however
it failed and whatever the database's collation."""

from __future__ import annotations

import pytest

from runtime.adapter import failure_trigger
from runtime.backend import open_backend
from runtime.errors import Code
from runtime.model import Artifact, utcnow
from runtime.store.base import RunStore
from tests.unit.conftest import build_run


async def made_an_artifact(store: RunStore) -> tuple[str, str]:
    run, _ = await store.create_run(build_run(), "hash")
    artifact = Artifact(
        artifact_id="sha256:ab12",
        media_type="text/plain",
        size=1,
        name="r.txt",
        run_id=run.run_id,
        created_at=utcnow(),
    )
    await store.put_artifact(artifact, b"x")
    return run.run_id, artifact.artifact_id


@pytest.mark.parametrize("collation", ["C", "en-x-icu"])
async def test_a_run_s_artifacts_are_named_whatever_the_collation(
    pg_schema_url: str, collation: str
) -> None:
    """By a range of keys, 'artifact:' to 'artifact;': under ICU (or a database made
    with en_US.UTF-8) ';' sorts first, and no failed run named any."""
    backend = await open_backend(pg_schema_url)
    try:
        async with backend.store.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute(
                f'ALTER TABLE events ALTER COLUMN dedupe_key TYPE text COLLATE "{collation}"'
            )
        run_id, artifact_id = await made_an_artifact(backend.store)
        assert await backend.store.artifacts_of_run(run_id) == [artifact_id]
    finally:
        await backend.close()


async def test_the_last_resort_failure_names_them_too(backend: object) -> None:
    """A run ended without its ledger read (``fail_unread``) named none."""
    store: RunStore = backend.store  # type: ignore[attr-defined]
    run_id, artifact_id = await made_an_artifact(store)
    code = Code.INTERNAL_ERROR
    assert await store.fail_unread(run_id, code, "boom", lambda s: failure_trigger(code, s))
    ended = await store.get_run(run_id)
    assert ended is not None and ended.outcome is not None
    assert ended.outcome.artifacts == [artifact_id]
