"""Artifacts: content-addressed bytes and their metadata."""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

from pydantic import ValidationError

from runtime.artifact_naming import is_media_type
from runtime.events import EventType
from runtime.model import Artifact
from runtime.store.codec import _dec
from runtime.store.core import StoreCore
from runtime.store.tx import Tx

log = logging.getLogger("runtime.store")

ARTIFACT_KEY = "artifact:"
"""The dedupe key prefix of a run's ``artifact`` events: the artifact's references."""
NAMINGS_READ = 16
"""A tenant's artifact events read for one that still validates (one is the rule: the
same bytes written by many runs of the tenant are named by each)."""
OPAQUE = "application/octet-stream"
"""The media type of bytes whose own is no longer known."""
ARTIFACT_LOCKS = 256
"""Lock stripes shared by writing an artifact and deleting unnamed ones (retention):
a bounded number, so one prune of many artifacts takes at most this many locks."""


def artifact_lock(artifact_id: str) -> int:
    """The lock stripe of ``artifact_id`` (the same in every process)."""
    return zlib.crc32(artifact_id.encode()) % ARTIFACT_LOCKS


def artifact_lock_key(stripe: int) -> str:
    return f"artifact-stripe:{stripe}"


@dataclass(frozen=True)
class Naming:
    """What a tenant's run called an artifact's bytes."""

    name: str
    media_type: str


async def artifacts_made(tx: Tx, run_id: str) -> list[str]:
    """The artifacts the run made, by its ``artifact`` events (keyed by artifact, which
    is all that is read of them: no row that no longer validates fails it)."""
    # By LIKE, not a range of keys: a database's collation orders ':' and ';' as it
    # likes (ICU puts ';' first, and the range was empty).
    rows = await tx.fetchall(
        "SELECT dedupe_key FROM events WHERE run_id = ? AND type = ? "
        "AND dedupe_key LIKE ? ORDER BY seq",
        (run_id, EventType.ARTIFACT.value, f"{ARTIFACT_KEY}%"),
    )
    return [str(r["dedupe_key"]).removeprefix(ARTIFACT_KEY) for r in rows]


class ArtifactQueries(StoreCore):
    """Artifact rows."""

    # -- artifacts ------------------------------------------------------------

    async def put_artifact(self, artifact: Artifact, content: bytes) -> Artifact:
        """Store content-addressed bytes once; the artifact event goes to the run's log."""
        async with self.tx() as tx:
            # Retention deletes an artifact no event names under the same lock: the row
            # is either seen here and kept, or gone and written again.
            await self._lock_key(tx, artifact_lock_key(artifact_lock(artifact.artifact_id)))
            await self._insert_once(
                tx,
                "artifacts",
                "artifact_id",
                {**artifact.model_dump(mode="json"), "content": content},
            )
            if artifact.run_id is not None:
                await self._append(
                    tx,
                    artifact.run_id,
                    EventType.ARTIFACT,
                    artifact.model_dump(mode="json", exclude={"run_id"}),
                    dedupe_key=f"{ARTIFACT_KEY}{artifact.artifact_id}",
                )
        return artifact

    async def artifacts_of_run(self, run_id: str) -> list[str]:
        """The artifacts the run made, as its log names them, oldest first."""
        async with self.read() as tx:
            return await artifacts_made(tx, run_id)

    async def artifact_for_tenant(self, artifact_id: str, tenant_id: str) -> Naming | None:
        """What a run of the tenant named the artifact (its name and media type), or None
        if none did.

        Artifacts are content-addressed across tenants, so the row names only the first
        writer and its name; every writer's run log has its own artifact event.
        """
        async with self.read() as tx:
            rows = await tx.fetchall(
                "SELECT e.run_id, e.data FROM events e JOIN runs r ON r.run_id = e.run_id "
                "WHERE e.dedupe_key = ? AND r.tenant_id = ? ORDER BY e.run_id, e.seq LIMIT ?",
                (f"{ARTIFACT_KEY}{artifact_id}", tenant_id, NAMINGS_READ),
            )
        for row in rows:
            data = _dec(row)["data"]
            try:
                artifact = Artifact.model_validate({**data, "run_id": row["run_id"]})
                # One written before media types were checked: the bytes under their
                # name, of no known type (the type as stored cannot be a header).
                media_type = artifact.media_type if is_media_type(artifact.media_type) else OPAQUE
                return Naming(artifact.name, media_type)
            except (ValidationError, TypeError):
                log.warning(
                    "artifact event of %s for %s no longer validates", row["run_id"], artifact_id
                )
        # The events name the artifact (their key) but no longer say under which name and
        # media type: the tenant's bytes are still its own, served as opaque bytes under
        # their id, never under another tenant's name for them.
        return Naming(artifact_id.replace(":", "-"), OPAQUE) if rows else None

    async def artifact_exists(self, artifact_id: str) -> bool:
        return await self.artifact_size(artifact_id) is not None

    async def artifact_size(self, artifact_id: str) -> int | None:
        """The artifact's length in bytes, without reading them (a HEAD's answer)."""
        async with self.read(runs=False) as tx:
            row = await tx.fetchone(
                "SELECT size FROM artifacts WHERE artifact_id = ?", (artifact_id,)
            )
        return None if row is None else int(row["size"])

    async def artifact_content(self, artifact_id: str) -> bytes | None:
        """The artifact's bytes alone: what serving them needs of its row."""
        async with self.read(runs=False) as tx:
            row = await tx.fetchone(
                "SELECT content FROM artifacts WHERE artifact_id = ?", (artifact_id,)
            )
        return None if row is None else bytes(row["content"] or b"")

    async def get_artifact(self, artifact_id: str) -> tuple[Artifact, bytes] | None:
        async with self.read() as tx:
            row = await tx.fetchone("SELECT * FROM artifacts WHERE artifact_id = ?", (artifact_id,))
        if row is None:
            return None
        content = bytes(row.pop("content") or b"")
        return Artifact.model_validate(row), content
