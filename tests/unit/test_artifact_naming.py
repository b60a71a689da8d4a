"""What a tool may call an artifact (runtime.artifact_naming), on both stores: one no
response header could carry, or one store keeps and the other refuses, is the tool's
ValueError, and nothing of it is written."""

from __future__ import annotations

import pytest

from runtime.events import EventType
from runtime.ids import artifact_id
from runtime.ledger import StoreArtifacts
from runtime.store.base import RunStore
from tests.unit.conftest import MakeRun

REFUSED = [
    ("text/plain; charset=报告", "report.txt"),  # not Latin-1: a 500 on every read
    ("text/plain\r\nX-Evil: 1", "report.txt"),  # a header of its own: a dropped connection
    ("text/plain\x00", "report.txt"),
    ("text/\udcff", "report.txt"),
    ("text", "report.txt"),
    ("text/plain; charset", "report.txt"),
    ("text/plain; ", "report.txt"),  # no header value ends in whitespace
    ("text/" + "x" * 300, "report.txt"),
    ("text/plain", ""),
    ("text/plain", "r" * 256),
    ("text/plain", "report\x00.txt"),  # PostgreSQL's text keeps no NUL; SQLite's did
    ("text/plain", "report\udcff.txt"),
]


@pytest.mark.parametrize(("media_type", "name"), REFUSED)
async def test_an_artifact_no_header_or_store_can_carry_is_refused_and_not_written(
    backend: object, make_run: MakeRun, media_type: str, name: str
) -> None:
    store: RunStore = backend.store  # type: ignore[attr-defined]
    run = await make_run(store)
    content = f"{media_type!r} {name!r}".encode()

    with pytest.raises(ValueError, match="an artifact's"):
        await StoreArtifacts(store, run.run_id).put(content, media_type, name)

    assert not await store.artifact_exists(artifact_id(content))
    events = await store.list_events(run.run_id)
    assert not [e for e in events if e.type is EventType.ARTIFACT]


@pytest.mark.parametrize(
    "media_type",
    [
        "text/plain",
        'text/plain; charset="utf-8"',
        "application/vnd.ms-excel;q=0.5;x=y",
        "text/html; charset=UTF-8;",  # an empty parameter (RFC 9110 §5.6.6), as servers send
    ],
)
async def test_a_media_type_with_parameters_is_kept_as_given(
    backend: object, make_run: MakeRun, media_type: str
) -> None:
    store: RunStore = backend.store  # type: ignore[attr-defined]
    run = await make_run(store)

    art = await StoreArtifacts(store, run.run_id).put(b"# report", media_type, "報告 ..md")

    naming = await store.artifact_for_tenant(art.artifact_id, run.context.tenant_id)
    assert naming is not None and (naming.media_type, naming.name) == (media_type, "報告 ..md")
