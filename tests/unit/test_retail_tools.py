"""The retail tools against a real generated SQLite database."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from runtime.ids import artifact_id
from runtime.model import Artifact, RunContext, utcnow
from runtime.tooling import ToolBusinessError, ToolContext, ToolSpec
from tools.retail import LAST_WEEK_START, build_registry, count_outbox, generate, outbox_rows
from tools.retail.data import DECLINE_FACTORS, SCHEMA, NotTheDemoDatabase, is_complete

DECLINING = set(DECLINE_FACTORS)


class FakeArtifacts:
    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}

    async def put(self, content: bytes, media_type: str, name: str) -> Artifact:
        art_id = artifact_id(content)
        self.stored[art_id] = content
        return Artifact(
            artifact_id=art_id,
            media_type=media_type,
            size=len(content),
            name=name,
            created_at=utcnow(),
        )


def make_ctx(key: str = "idem-1", sink: FakeArtifacts | None = None) -> ToolContext:
    return ToolContext(
        run_id="run-test",
        tool_call_id="tc-test",
        idempotency_key=key,
        context=RunContext(scope=["sales_region:east"]),
        artifacts=sink or FakeArtifacts(),
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "retail.db"
    generate(path)
    return path


def spec(db: Path, name: str) -> ToolSpec:
    found = build_registry(db).resolve(name)
    assert found is not None
    return found


async def call(s: ToolSpec, args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
    return await s.handler(s.args_model.model_validate(args), ctx or make_ctx())


def args_of(s: ToolSpec, raw: dict[str, Any]) -> BaseModel:
    return s.args_model.model_validate(raw)


async def test_east_decline_is_found(db: Path) -> None:
    out = await call(spec(db, "query_sales"), {"region": "east"})
    assert out["week_start"] == LAST_WEEK_START.isoformat()
    assert out["prior_week_start"] == "2026-11-09"
    top = out["top_decliners"]
    assert len(top) == 5
    assert {d["sku"] for d in top[:3]} == DECLINING
    for d in top[:3]:
        assert -60 <= d["change_pct"] <= -35
        assert d["delta"] == pytest.approx(d["last"] - d["prior"])
    assert all(abs(d["change_pct"]) < 10 for d in top[3:])
    assert [d["delta"] for d in top] == sorted(d["delta"] for d in top)
    assert out["total_last"] < out["total_prior"]


@pytest.mark.parametrize("region", ["north", "south", "west"])
async def test_other_regions_are_stable(db: Path, region: str) -> None:
    out = await call(spec(db, "query_sales"), {"region": region, "top_n": 50})
    assert abs(out["change_pct"]) < 5
    assert all(d["change_pct"] > -10 for d in out["top_decliners"])


def test_generation_is_idempotent_and_leaves_no_stray_files(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    generate(path)
    assert is_complete(path)
    before = path.stat().st_mtime_ns
    generate(path)
    assert path.stat().st_mtime_ns == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.db"]


async def test_generation_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    generate(a)
    generate(b)
    for region in ("east", "west"):
        args = {"region": region, "top_n": 20}
        assert await call(spec(a, "query_sales"), args) == await call(spec(b, "query_sales"), args)


def test_an_incomplete_demo_database_is_replaced(tmp_path: Path) -> None:
    """One whose generation did not finish: its tables, meta first, without "complete"
    (or an empty file, SQLite's empty database)."""
    half = tmp_path / "half.db"
    with contextlib.closing(sqlite3.connect(half)) as conn, conn:
        conn.executescript(SCHEMA.split("CREATE TABLE daily_sales")[0])
        conn.execute("INSERT INTO regions VALUES ('east', 'East', '华东')")
        conn.execute("ANALYZE")  # SQLite's own sqlite_stat1: nobody's data
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (half, empty):
        generate(path)
        assert is_complete(path)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda path: path.write_bytes(b"someone's notes"), "not a SQLite database"),
        (lambda path: _sqlite(path, "CREATE TABLE customers (id INTEGER)"), "customers"),
        (lambda path: _sqlite(path, "CREATE TABLE regions (id INTEGER)"), "no meta table"),
        (lambda path: path.mkdir(), "is not a file"),
    ],
    ids=["text", "another_database", "no_meta", "directory"],
)
def test_a_file_that_is_not_the_demo_database_is_never_replaced(
    tmp_path: Path, make: Callable[[Path], object], says: str
) -> None:
    path = tmp_path / "retail.db"
    make(path)
    before = _contents(path)
    with pytest.raises(NotTheDemoDatabase, match=says):
        generate(path)
    assert _contents(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["retail.db"]  # no temporary left


def _sqlite(path: Path, statement: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(statement)
        conn.execute(f"INSERT INTO {statement.split()[2]} VALUES (1)")


def _contents(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def test_query_args_are_validated(db: Path) -> None:
    s = spec(db, "query_sales")
    with pytest.raises(ValidationError, match="Monday"):
        args_of(s, {"region": "east", "week_start": "2026-11-18"})
    for bad in (
        {"region": "mars"},
        {"region": "east", "top_n": 0},
        {"region": "east", "top_n": 51},
        {"region": "east", "extra": 1},
    ):
        with pytest.raises(ValidationError):
            args_of(s, bad)
    assert s.required_scopes(args_of(s, {"region": "west"})) == ["sales_region:west"]


async def test_query_without_data_is_a_business_error(db: Path) -> None:
    s = spec(db, "query_sales")
    with pytest.raises(ToolBusinessError, match="no sales data"):
        await call(s, {"region": "east", "week_start": "2026-11-23"})
    with pytest.raises(ToolBusinessError, match="prior week"):
        await call(s, {"region": "east", "week_start": "2026-09-28"})
    older = await call(s, {"region": "east", "week_start": date(2026, 11, 9)})
    assert not DECLINING & {d["sku"] for d in older["top_decliners"] if d["change_pct"] < -10}


async def test_report_is_deterministic_markdown(db: Path) -> None:
    findings = await call(spec(db, "query_sales"), {"region": "east"})
    sink = FakeArtifacts()
    s = spec(db, "write_report")
    raw = {"title": "East | decline", "question": "Which SKUs?", "findings": findings}
    first = await call(s, raw, make_ctx(sink=sink))
    second = await call(s, raw, make_ctx(sink=FakeArtifacts()))
    assert first == second
    assert first["media_type"] == "text/markdown"
    text = sink.stored[first["artifact_id"]].decode()
    assert first["size"] == len(text.encode())
    assert text.startswith("# East \\| decline\n")
    assert "| 1 | SKU-1008 |" in text
    zh = await call(s, {**raw, "question": "上周华东区销售下滑的主要 SKU 是什么？"})
    assert zh["artifact_id"] != first["artifact_id"]


def test_report_findings_shape_is_checked(db: Path) -> None:
    with pytest.raises(ValidationError):
        args_of(
            spec(db, "write_report"),
            {"title": "t", "question": "q", "findings": {"region": "east"}},
        )


PUBLISH = {
    "artifact_id": "sha256:" + "a" * 64,
    "recipients": ["ops@example.com"],
    "subject": "East decline",
}


async def test_publish_is_idempotent_per_key(db: Path) -> None:
    s = spec(db, "publish_report")
    assert s.risk == "high" and s.side_effect and s.on_reject == "fail"
    first = await call(s, PUBLISH, make_ctx("idem-A"))
    again = await call(s, PUBLISH, make_ctx("idem-A"))
    assert (
        first
        == again
        == {"outbox_id": first["outbox_id"], "status": "queued", "idempotency_key": "idem-A"}
    )
    assert count_outbox(db) == 1
    other = await call(s, PUBLISH, make_ctx("idem-B"))
    assert other["outbox_id"] != first["outbox_id"]
    assert count_outbox(db) == 2
    row = outbox_rows(db)[0]
    assert row["recipients"] == ["ops@example.com"] and row["body_ref"] == PUBLISH["artifact_id"]


async def test_publish_key_reuse_with_other_content_is_refused(db: Path) -> None:
    s = spec(db, "publish_report")
    await call(s, PUBLISH, make_ctx("idem-A"))
    with pytest.raises(ToolBusinessError):
        await call(s, {**PUBLISH, "subject": "something else"}, make_ctx("idem-A"))
    assert count_outbox(db) == 1


async def test_reconcile_and_compensate(db: Path) -> None:
    s = spec(db, "publish_report")
    assert s.reconcile is not None and s.compensate is not None
    args = args_of(s, PUBLISH)
    assert await s.reconcile(args, make_ctx("idem-A")) is None
    out = await s.handler(args, make_ctx("idem-A"))
    assert await s.reconcile(args, make_ctx("idem-A")) == out
    assert await s.reconcile(args, make_ctx("idem-unknown")) is None
    await s.compensate(args, out, make_ctx("idem-A"))
    await s.compensate(args, out, make_ctx("idem-A"))
    await s.compensate(args, None, make_ctx("idem-unknown"))
    assert [r["status"] for r in outbox_rows(db)] == ["retracted"]
    assert count_outbox(db) == 1


def test_publish_args_are_validated(db: Path) -> None:
    s = spec(db, "publish_report")
    for bad in (
        {**PUBLISH, "artifact_id": "sha256:xyz"},
        {**PUBLISH, "recipients": []},
        {**PUBLISH, "recipients": ["not-an-email"]},
        {**PUBLISH, "recipients": [f"u{i}@example.com" for i in range(21)]},
        {**PUBLISH, "channel": "sms"},
    ):
        with pytest.raises(ValidationError):
            args_of(s, bad)


async def test_missing_database_is_not_created(tmp_path: Path) -> None:
    from runtime.tooling import ToolUnavailable

    path = tmp_path / "missing.db"
    with pytest.raises(ToolUnavailable):
        await call(spec(path, "query_sales"), {"region": "east"})
    assert not path.exists()
