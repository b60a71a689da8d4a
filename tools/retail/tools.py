"""The retail_analyst tools: query sales, write a report, publish it by email (outbox)."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runtime import failpoints
from runtime.model import MAX_INPUT_CHARS, utcnow
from runtime.tooling import ToolBusinessError, ToolContext, ToolSpec, ToolUnavailable
from tools.registry import ToolRegistry
from tools.retail.data import LAST_WEEK_START, connect
from tools.retail.report import Findings, render

T = TypeVar("T")
RegionId = Literal["east", "north", "south", "west"]
MAX_ADDRESS = 254
"""The longest email address there is (RFC 5321 paths less their brackets)."""
EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$")
ARTIFACT_ID = r"^sha256:[0-9a-f]{64}$"
# Lock contention and a missing file are worth retrying; anything else is a bug.
_TRANSIENT = ("locked", "busy", "unable to open")


class QuerySalesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    region: RegionId
    week_start: date | None = None
    top_n: int = Field(5, ge=1, le=50)

    @field_validator("week_start")
    @classmethod
    def _monday(cls, value: date | None) -> date | None:
        if value is not None and value.weekday() != 0:
            raise ValueError(f"week_start must be a Monday, got {value} ({value:%A})")
        return value


class WriteReportArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    findings: dict[str, Any]

    @field_validator("findings")
    @classmethod
    def _shape(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Checked here so a malformed findings dict is an argument error the planner can fix.
        Findings.model_validate(value)
        return value


class PublishReportArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    artifact_id: str = Field(pattern=ARTIFACT_ID)
    channel: Literal["email"] = "email"
    recipients: list[str] = Field(min_length=1, max_length=20)
    subject: str = Field(min_length=1, max_length=200)

    @field_validator("recipients")
    @classmethod
    def _emails(cls, value: list[str]) -> list[str]:
        bad = [r for r in value if len(r) > MAX_ADDRESS or not EMAIL.fullmatch(r)]
        if bad:
            raise ValueError(f"not an email address: {', '.join(bad)}")
        return value


def _pct(last: float, prior: float) -> float | None:
    return round((last - prior) / prior * 100, 1) if prior else None


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    try:
        return await asyncio.to_thread(fn, *args)
    except sqlite3.OperationalError as exc:
        if any(word in str(exc).lower() for word in _TRANSIENT):
            raise ToolUnavailable(f"retail database: {exc}") from exc
        raise


def query_sales(db_path: Path, region: str, week_start: date, top_n: int) -> dict[str, Any]:
    prior_start = week_start - timedelta(weeks=1)
    week_end = week_start + timedelta(days=6)
    last_from, prior_from = week_start.isoformat(), prior_start.isoformat()
    to = week_end.isoformat()
    with connect(db_path) as conn:
        days = conn.execute(
            "SELECT SUM(CASE WHEN d.date >= ? THEN 1 ELSE 0 END) AS last_days,"
            " SUM(CASE WHEN d.date < ? THEN 1 ELSE 0 END) AS prior_days FROM"
            " (SELECT DISTINCT ds.date FROM daily_sales ds JOIN stores s"
            "  ON s.store_id = ds.store_id WHERE s.region_id = ?"
            "  AND ds.date BETWEEN ? AND ?) AS d",
            (last_from, last_from, region, prior_from, to),
        ).fetchone()
        rows = conn.execute(
            "SELECT ds.sku AS sku, k.name AS name,"
            " SUM(CASE WHEN ds.date >= ? THEN ds.revenue ELSE 0 END) AS last,"
            " SUM(CASE WHEN ds.date < ? THEN ds.revenue ELSE 0 END) AS prior"
            " FROM daily_sales ds JOIN stores s ON s.store_id = ds.store_id"
            " JOIN skus k ON k.sku = ds.sku"
            " WHERE s.region_id = ? AND ds.date BETWEEN ? AND ?"
            " GROUP BY ds.sku, k.name ORDER BY ds.sku",
            (last_from, last_from, region, prior_from, to),
        ).fetchall()
    last_days, prior_days = (days["last_days"] or 0), (days["prior_days"] or 0)
    if last_days == 0:
        raise ToolBusinessError(f"no sales data for region {region} in the week of {week_start}")
    if last_days < 7:
        raise ToolBusinessError(f"the week of {week_start} is incomplete ({last_days} of 7 days)")
    if prior_days < 7:
        raise ToolBusinessError(f"no complete prior week ({prior_start}) to compare with")
    decliners = []
    for row in rows:
        last, prior = round(row["last"], 2), round(row["prior"], 2)
        delta = round(last - prior, 2)
        if delta < 0:
            decliners.append(
                {
                    "sku": row["sku"],
                    "name": row["name"],
                    "last": last,
                    "prior": prior,
                    "delta": delta,
                    "change_pct": _pct(last, prior),
                }
            )
    decliners.sort(key=lambda d: (d["delta"], d["sku"]))
    total_last = round(sum(r["last"] for r in rows), 2)
    total_prior = round(sum(r["prior"] for r in rows), 2)
    return {
        "region": region,
        "week_start": last_from,
        "prior_week_start": prior_from,
        "total_last": total_last,
        "total_prior": total_prior,
        "change_pct": _pct(total_last, total_prior),
        "top_decliners": decliners[:top_n],
    }


def _outbox_output(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "outbox_id": row["id"],
        "status": row["status"],
        "idempotency_key": row["idempotency_key"],
    }


def _find_outbox(db_path: Path, key: str) -> dict[str, Any] | None:
    with connect(db_path) as conn:
        row = conn.execute("SELECT * FROM outbox WHERE idempotency_key = ?", (key,)).fetchone()
    return None if row is None else _outbox_output(row)


def _find_or_void(db_path: Path, key: str) -> dict[str, Any] | None:
    """The message a cut-off publish queued, or None after voiding its key: a retracted,
    empty row, so that the handler's insert, if its thread is still on the way, queues
    nothing (its key is taken by another message) and the record stays true."""
    with connect(db_path) as conn:
        conn.execute(
            "INSERT INTO outbox (idempotency_key, channel, recipients, subject, body_ref,"
            " status, created_at) VALUES (?, '', '[]', '', '', 'retracted', ?)"
            " ON CONFLICT(idempotency_key) DO NOTHING",
            (key, utcnow().isoformat()),
        )
        row = conn.execute("SELECT * FROM outbox WHERE idempotency_key = ?", (key,)).fetchone()
    return None if row["channel"] == "" else _outbox_output(row)


def _enqueue(db_path: Path, key: str, args: PublishReportArgs) -> dict[str, Any]:
    recipients = json.dumps(args.recipients)
    with connect(db_path) as conn:
        conn.execute(
            "INSERT INTO outbox (idempotency_key, channel, recipients, subject, body_ref,"
            " status, created_at) VALUES (?, ?, ?, ?, ?, 'queued', ?)"
            " ON CONFLICT(idempotency_key) DO NOTHING",
            (key, args.channel, recipients, args.subject, args.artifact_id, utcnow().isoformat()),
        )
        row = conn.execute("SELECT * FROM outbox WHERE idempotency_key = ?", (key,)).fetchone()
    existing = (row["channel"], row["recipients"], row["subject"], row["body_ref"])
    if existing != (args.channel, recipients, args.subject, args.artifact_id):
        # The key names one message; reusing it for another would silently drop that one.
        raise ToolBusinessError(f"idempotency key {key} already queued a different message")
    return _outbox_output(row)


def _retract(db_path: Path, key: str) -> None:
    with connect(db_path) as conn:
        conn.execute("UPDATE outbox SET status = 'retracted' WHERE idempotency_key = ?", (key,))


def count_outbox(db_path: Path) -> int:
    with connect(db_path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def outbox_rows(db_path: Path) -> list[dict[str, Any]]:
    with connect(db_path) as conn:
        rows = conn.execute("SELECT * FROM outbox ORDER BY id").fetchall()
    return [{**dict(row), "recipients": json.loads(row["recipients"])} for row in rows]


def _sales_scopes(args: BaseModel) -> list[str]:
    assert isinstance(args, QuerySalesArgs)
    return [f"sales_region:{args.region}"]


def build_registry(db_path: Path) -> ToolRegistry:
    db_path = Path(db_path)

    async def handle_query(args: QuerySalesArgs, ctx: ToolContext) -> dict[str, Any]:
        week = args.week_start or LAST_WEEK_START
        return await _in_thread(query_sales, db_path, args.region, week, args.top_n)

    async def handle_report(args: WriteReportArgs, ctx: ToolContext) -> dict[str, Any]:
        text = render(args.title, args.question, Findings.model_validate(args.findings))
        art = await ctx.artifacts.put(text.encode(), "text/markdown", "report.md")
        return {"artifact_id": art.artifact_id, "size": art.size, "media_type": "text/markdown"}

    async def handle_publish(args: PublishReportArgs, ctx: ToolContext) -> dict[str, Any]:
        queued = await _in_thread(_enqueue, db_path, ctx.idempotency_key, args)
        # Fault injection: the outbox row is committed, the handler has not returned.
        failpoints.hit("tool.during", "publish_report")
        return queued

    async def reconcile(args: PublishReportArgs, ctx: ToolContext) -> dict[str, Any] | None:
        # After a crash the handler runs again if nothing was queued; after a cut-off
        # it does not, and its own insert may still be under way in its thread.
        find = _find_or_void if ctx.cut_off else _find_outbox
        return await _in_thread(find, db_path, ctx.idempotency_key)

    async def compensate(args: PublishReportArgs, output: Any, ctx: ToolContext) -> None:
        await _in_thread(_retract, db_path, ctx.idempotency_key)

    return ToolRegistry(
        [
            ToolSpec(
                name="query_sales",
                version="1",
                description="Revenue by SKU for one region, a week vs the week before; "
                "the SKUs that declined most come first.",
                args_model=QuerySalesArgs,
                handler=handle_query,
                risk="low",
                side_effect=False,
                idempotent=True,
                required_scopes=_sales_scopes,
            ),
            ToolSpec(
                name="write_report",
                version="1",
                description="Render query_sales findings as a Markdown report artifact.",
                args_model=WriteReportArgs,
                handler=handle_report,
                # Content-addressed: writing the same report twice stores one artifact.
                risk="low",
                side_effect=False,
                idempotent=True,
            ),
            ToolSpec(
                name="publish_report",
                version="1",
                description="Queue a report artifact for email delivery to recipients.",
                args_model=PublishReportArgs,
                handler=handle_publish,
                # Keyed by the call's idempotency key, so a retry queues nothing new.
                risk="high",
                side_effect=True,
                idempotent=True,
                reconcile=reconcile,
                compensate=compensate,
                # A human's "no" to publishing ends the run (APPROVAL_REJECTED): the report
                # artifact stays, nothing goes out.
                on_reject="fail",
            ),
        ]
    )
