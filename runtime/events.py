"""The fixed event vocabulary (DESIGN §4). Events are platform facts, never model tokens."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from runtime.lifecycle import TERMINAL

if TYPE_CHECKING:  # runtime.model's Event checks its type against this vocabulary
    from runtime.model import ToolCall


class EventType(StrEnum):
    """Exactly DESIGN §4's seven: a graph's new kind of work maps onto these (a handoff
    to a sub-agent is an ``action`` and a ``result``, tool ``handoff_to_<agent>``)."""

    STATE = "state"
    ACTION = "action"
    RESULT = "result"
    APPROVAL_REQUEST = "approval_request"
    APPROVAL_RESULT = "approval_result"
    ARTIFACT = "artifact"
    ERROR = "error"


SUMMARY_CHARS = 300


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A short, bounded rendering of a value for events and planner observations."""
    import json

    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def result_event(row: ToolCall) -> dict[str, Any]:
    """The ``result`` event of a ledger row that finished (or was closed)."""
    output = summarize(row.output) if row.output is not None else None
    return result_data(
        row.tool_call_id, row.tool, row.status, output, row.artifact_id, row.error, row.retried
    )


def result_data(
    tool_call_id: str,
    tool: str,
    status: str,
    output: str | None,
    artifact_id: str | None,
    error: dict[str, Any] | None,
    retried: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """A ``result`` event's data; ``retried``: why the attempts before its last have no
    outcome of their own, where there were some (absent otherwise)."""
    event: dict[str, Any] = {
        "tool_call_id": tool_call_id,
        "tool": tool,
        "status": status,
        "output": output,
        "artifact_id": artifact_id,
        "error": error,
    }
    if retried:
        event["retried"] = list(retried)
    return event


def is_terminal_event(event_type: str, data: dict[str, Any]) -> bool:
    # A state event's data is not checked on reading: one with no state it went to,
    # or not one of ours, does not end a stream (nor fail it).
    to = data.get("to")
    return event_type == EventType.STATE and isinstance(to, str) and to in TERMINAL
