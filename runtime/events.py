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


LEGACY_HANDOFF = "handoff"
"""The type the first versions gave a handoff's start and return, before DESIGN §4's
seven (9b42d48); no migration rewrote their rows: :func:`legacy_handoff` reads them."""

SUMMARY_CHARS = 300


def handoff_tool(agent_id: str) -> str:
    """The ``tool`` of the observation that brings a sub-agent's result back to its caller."""
    return f"handoff_to_{agent_id}"


def legacy_handoff(data: Any) -> tuple[EventType, dict[str, Any]] | None:
    """A stored ``handoff`` event's data as the ``action`` (its start) or ``result`` (its
    return) that a handoff is now, so an old run's trace reads as a new one's; None
    where it is not one the first versions wrote (it stays unreadable). The ``handoff``
    object keeps the stored fields, and says the row was stored as a handoff."""
    if not isinstance(data, dict) or data.get("phase") not in ("start", "return"):
        return None
    hid, start = data.get("handoff_id"), data["phase"] == "start"
    callee = data.get("to_agent" if start else "from_agent")  # the sub-agent
    if not (isinstance(hid, str) and isinstance(callee, str)):
        return None
    detail = {k: v for k, v in data.items() if k not in ("handoff_id", "summary")}
    detail["stored_as"] = LEGACY_HANDOFF
    if start:
        return EventType.ACTION, {
            "tool_call_id": hid,
            "tool": handoff_tool(callee),
            "version": None,
            "args": summarize({"task": data.get("task")}),
            "handoff": detail,
        }
    artifacts = data.get("artifacts")
    one = artifacts[0] if isinstance(artifacts, list) and len(artifacts) == 1 else None
    return EventType.RESULT, {
        "tool_call_id": hid,
        "tool": handoff_tool(callee),
        # The first versions wrote a return only for a sub-agent's accepted finish.
        "status": "succeeded",
        "artifact_id": one,
        "error": None,
        "output": data.get("summary"),
        "handoff": detail,
    }


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
