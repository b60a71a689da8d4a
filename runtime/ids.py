"""Deterministic identifiers.

A node that LangGraph re-executes on resume must find its own earlier rows, so
tool-call, approval and idempotency ids are derived from the run id and the
position of the call, never drawn at random.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from runtime.model import Decision


AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""What an agent's id is made of (``runtime.agent.AgentSpec`` refuses any other): it is
written into a worker's claims as a literal (``runtime.store.leases.of_agents``), where
a ``%`` or ``?`` read as a placeholder by the driver stopped every claim of the worker;
and it goes into URLs, logs and metrics."""


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex}"


def _digest(*parts: object, n: int = 16) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()[:n]


def tool_call_id(run_id: str, step_index: int, call_index: int) -> str:
    return f"tc-{_digest(run_id, step_index, call_index)}"


def proposed_calls(run_id: str, step_index: int, decision: Decision) -> list[dict[str, Any]]:
    """Each call ``decision`` proposed at its step: its tool_call_id, call_index and tool."""
    return [
        {"tool_call_id": tool_call_id(run_id, step_index, i), "call_index": i, "tool": p.tool}
        for i, p in enumerate(decision.tool_calls)
    ]


HANDOFF_PREFIX = "ho-"
"""Of a handoff id, the tool_call_id of its action and result (a tool call's is ``tc-``)."""


def handoff_id(run_id: str, step_index: int) -> str:
    """A handoff is the step that decided it: one per step, so a replay finds the same one."""
    return f"{HANDOFF_PREFIX}{_digest('handoff', run_id, step_index)}"


def approval_id(tool_call_id: str) -> str:
    return f"ap-{_digest('approval', tool_call_id)}"


def call_approval_id(call: dict[str, Any]) -> str:
    """The approval a planned call waits on: its own, or one per unknown-outcome episode."""
    return approval_id(call.get("approval_key") or call["tool_call_id"])


def handoff_key(handoff_id: str, phase: Literal["start", "return"]) -> str:
    """The dedupe key of a handoff's event of ``phase``: its ``action`` (start) or the
    ``result`` that answers it (return), whoever writes that answer."""
    return f"handoff:{handoff_id}:{phase}"


def idempotency_key(tool_call_id: str) -> str:
    """The stable business key handed to side-effecting handlers."""
    return f"idem-{_digest('idem', tool_call_id, n=32)}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def artifact_id(content: bytes) -> str:
    return f"sha256:{hashlib.sha256(content).hexdigest()}"
