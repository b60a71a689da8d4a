"""What a node (and the ledger it runs tools through) may ask of the run store.

:class:`runtime.store.base.RunStore` satisfies it; so does the in-memory fake the
node unit tests use (``tests/unit/fakes.py``). Keeping the list to the methods the
nodes and :mod:`runtime.ledger` really call is what lets a node be tested without
a database: a node that needs another store method adds it here, and the fake and
its contract test (``tests/unit/test_fake_store_contract.py``) follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from runtime.errors import Code
from runtime.events import EventType, result_event
from runtime.model import Approval, ApprovalDecision, Artifact, Step, ToolCall


class ToolCallWriter(Protocol):
    async def update_tool_call(
        self,
        tool_call_id: str,
        *,
        result: dict[str, Any] | None = None,
        from_status: Sequence[str] = ("running",),
        action: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ToolCall: ...


CUTTING_OFF = frozenset({Code.RUN_CANCELLED, Code.RUN_BUDGET_EXCEEDED})
"""Why a run stops a call it is running itself: its handler is cancelled."""


def closed_as(code: Code) -> str:
    """The status of a call a run stopped with ``code`` leaves running. ``cancelled``
    where the run's stop cancelled its handler (a cancel, the time budget); otherwise the
    handler's drive had stopped before it (a crash loop, drives failing on the
    database) and nobody can tell what it did: ``unknown``. Either way the outcome lists
    a side effect of it as one that may have happened."""
    return "cancelled" if code in CUTTING_OFF else "unknown"


async def close_call(store: ToolCallWriter, row: ToolCall, **changes: Any) -> ToolCall:
    """Move a running ledger row on by ``changes``, with its result event made from the
    row as changed: one list of changes, so the log and the ledger cannot disagree (an
    event built from a copy with the status alone said ``error: null`` twice)."""
    event = result_event(row.model_copy(update=changes))
    return await store.update_tool_call(row.tool_call_id, result=event, **changes)


class NodeStore(ToolCallWriter, Protocol):
    # -- the event log and steps (planner, guard, handoff) --------------------

    async def append_event(
        self, run_id: str, type_: EventType, data: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None: ...

    async def get_step(self, run_id: str, step_index: int) -> Step | None: ...

    async def record_step(self, step: Step) -> Step: ...

    # -- approvals (approval, executor, finish) -------------------------------

    async def ensure_approval(self, approval: Approval, request: dict[str, Any]) -> Approval: ...

    async def get_approval(self, approval_id: str) -> Approval | None: ...

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[Approval]: ...

    async def decide_approval(
        self,
        approval_id: str,
        decision: ApprovalDecision,
        *,
        decided_by: str,
        comment: str | None,
        via: str | None = None,
        run_id: str | None = None,
    ) -> tuple[Approval, bool]: ...

    # -- the tool-call ledger (executor, runtime.ledger, finish) --------------
    # (update_tool_call is ToolCallWriter's.)

    async def get_tool_call(self, tool_call_id: str) -> ToolCall | None: ...

    async def begin_tool_call(self, call: ToolCall, action: dict[str, Any]) -> ToolCall: ...

    async def start_tool_call(
        self, call: ToolCall, action: dict[str, Any]
    ) -> tuple[ToolCall, bool]: ...

    async def claim_tool_call(
        self,
        tool_call_id: str,
        seen_attempts: int,
        action: dict[str, Any] | None = None,
        retried: Sequence[dict[str, Any]] | None = None,
    ) -> ToolCall | None: ...

    async def list_tool_calls(self, run_id: str) -> list[ToolCall]: ...

    # -- artifacts (runtime.ledger.StoreArtifacts, finish) --------------------

    async def put_artifact(self, artifact: Artifact, content: bytes) -> Artifact: ...

    async def artifact_exists(self, artifact_id: str) -> bool: ...
