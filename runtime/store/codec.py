"""How the store's rows hold values: JSON columns, timestamps, text SQLite cannot
decode, the event row's shape, and the opaque cursors of paged lists."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from enum import Enum
from typing import Any

from runtime.errors import Code, RuntimeProblem
from runtime.model import Event, utcnow

_JSON_COLUMNS = {
    "context",
    "options",
    "usage",
    "limits",
    "pending_approval",
    "result",
    "outcome",
    "decision",
    "args",
    "output",
    "error",
    "retried",
    "data",
    "detail",
}


def _enc(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "model_dump"):
        return json.dumps(value.model_dump(mode="json"), ensure_ascii=False)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, bool):
        return int(value)
    return value


def _enc_col(column: str, value: Any) -> Any:
    """``value`` as column ``column`` keeps it: in a JSON column, JSON text whatever its
    type (a tool's output may be a bare string or number, which :func:`_enc` keeps as
    is and :func:`_dec` would then read as JSON: text that is not JSON failed every read
    of the run, "42" came back a number)."""
    if (
        column in _JSON_COLUMNS
        and value is not None
        and not isinstance(value, dict | list)
        and not hasattr(value, "model_dump")
    ):
        return json.dumps(value, ensure_ascii=False, default=str)
    return _enc(value)


class Undecodable(str):
    """Text a SQLite column holds that is not UTF-8 (no writer of the runtime's makes it:
    a hand edit, another program), with U+FFFD for its bad bytes. Never read as JSON,
    so a row holding it shows in its unreadable form rather than as a 500 (PostgreSQL
    refuses such text on the way in)."""


def decode_text(raw: bytes) -> str:
    """SQLite's text as Python reads it (``text_factory``): UTF-8, or :class:`Undecodable`."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return Undecodable(raw.decode(errors="replace"))


def _dec(row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (_json(v) if k in _JSON_COLUMNS and _readable_text(v) else v) for k, v in row.items()
    }


def _readable_text(value: Any) -> bool:
    return isinstance(value, str) and not isinstance(value, Undecodable)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare string an earlier version stored as is


def event_row(run_id: str, seq: int, type_: str, ts: str, data: str) -> dict[str, Any]:
    """An events row as stored (``data`` encoded), in the events table's column order."""
    return {"run_id": run_id, "seq": seq, "type": type_, "ts": ts, "data": data}


def event_of(row: dict[str, Any]) -> Event:
    return Event.model_validate(_dec(row))


def _iso(value: datetime, *, exact: bool = False) -> str:
    """The shape pydantic writes (a zero fraction left out, so "…:51Z" sorts after
    "…:51.4Z" as text); ``exact``: microseconds always, for strings that must sort as
    their times do."""
    text = value.isoformat(timespec="microseconds") if exact else value.isoformat()
    return text.replace("+00:00", "Z")


def _ts() -> str:
    return _iso(utcnow())


def encode_cursor(*parts: str) -> str:
    return base64.urlsafe_b64encode("\x1f".join(parts).encode()).decode()


def decode_cursor(cursor: str, parts: int = 2, *, kind: str | None = None) -> list[str]:
    """The ``parts`` fields of a cursor; with ``kind``, one that :func:`encode_cursor` was
    given ``kind`` first for (another list's cursor is refused, not misread)."""
    try:
        decoded = base64.b64decode(cursor.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        decoded = ""
    fields = decoded.split("\x1f")
    if kind is not None:
        if fields[0] != kind:
            raise RuntimeProblem(Code.VALIDATION_ERROR, "cursor is not valid")
        fields = fields[1:]
    if len(fields) != parts or "\x00" in decoded:
        raise RuntimeProblem(Code.VALIDATION_ERROR, "cursor is not valid")
    return fields
