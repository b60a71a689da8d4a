"""An in-memory fake of the services nodes use: no SQLite, no PostgreSQL.

:class:`FakeStore` implements :class:`runtime.services.NodeStore`, the store methods
the nodes and :mod:`runtime.ledger` call, with the semantics they rely on:
first-writer-wins steps and approvals, compare-and-set decisions and ledger
claims, events with per-run seqs and dedupe keys, content-addressed artifacts.
``test_fake_store_contract.py`` runs the same assertions against it and the real
SQLite store, so a node test that passes on the fake is not passing on a lie.

What it leaves out on purpose: the run's lifecycle (a decided approval does not
move a parked run), leases and fencing, tenants. A node test never sees those;
tests of them use the real store.

Rows go in and come out through JSON, as they do in the database, so a node
cannot keep a reference to a stored row, and data a database could not store
fails here too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from langgraph.runtime import Runtime
from pydantic import BaseModel

from runtime.context import Context
from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.model import Approval, ApprovalDecision, Artifact, Event, Step, ToolCall, utcnow
from runtime.services import NodeStore

M = TypeVar("M", bound=BaseModel)


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str, ensure_ascii=False))


def _stored(model: M) -> M:
    return type(model).model_validate(_json(model.model_dump(mode="json")))


class FakeStore:
    """Steps, approvals, the ledger, artifacts and events of some runs, in dicts.

    Beyond :class:`NodeStore`, ``list_events``, ``list_steps`` and ``get_artifact``
    (with ``RunStore``'s signatures) are there for tests to assert what a node wrote.
    Runs must be known (``FakeStore("run-1")`` or :meth:`add_run`): like the real
    store, writing to an unknown run raises RUN_NOT_FOUND.
    """

    def __init__(self, *run_ids: str) -> None:
        self.events: dict[str, list[Event]] = {}
        self.dedupe_keys: dict[str, set[str]] = {}
        self.steps: dict[tuple[str, int], Step] = {}
        self.approvals: dict[str, Approval] = {}
        self.tool_calls: dict[str, ToolCall] = {}
        self.artifacts: dict[str, tuple[Artifact, bytes]] = {}
        for run_id in run_ids:
            self.add_run(run_id)

    def add_run(self, run_id: str) -> str:
        """A run the store knows, with the state event ``RunStore.create_run`` writes."""
        self.events[run_id] = []
        self.dedupe_keys[run_id] = set()
        self._append(run_id, EventType.STATE, {"from": None, "to": "pending", "trigger": "create"})
        return run_id

    def _require_run(self, run_id: str) -> None:
        # Checked before any write, as the database's rollback would undo it.
        if run_id not in self.events:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")

    def _append(
        self, run_id: str, type_: EventType, data: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None:
        self._require_run(run_id)
        if dedupe_key is not None:
            if dedupe_key in self.dedupe_keys[run_id]:
                return None
            self.dedupe_keys[run_id].add(dedupe_key)
        log = self.events[run_id]
        seq = len(log) + 1
        log.append(Event(run_id=run_id, seq=seq, type=type_.value, ts=utcnow(), data=_json(data)))
        return seq

    # -- the event log and steps ----------------------------------------------

    async def append_event(
        self, run_id: str, type_: EventType, data: dict[str, Any], dedupe_key: str | None = None
    ) -> int | None:
        return self._append(run_id, type_, data, dedupe_key)

    async def list_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        return [e.model_copy(deep=True) for e in self.events.get(run_id, []) if e.seq > after][
            :limit
        ]

    async def get_step(self, run_id: str, step_index: int) -> Step | None:
        step = self.steps.get((run_id, step_index))
        return _stored(step) if step else None

    async def record_step(self, step: Step) -> Step:
        key = (step.run_id, step.step_index)
        if key not in self.steps:
            self.steps[key] = _stored(step)
            return step
        return _stored(self.steps[key])

    async def list_steps(self, run_id: str) -> list[Step]:
        return [_stored(s) for (r, _), s in sorted(self.steps.items()) if r == run_id]

    # -- approvals ------------------------------------------------------------

    async def ensure_approval(self, approval: Approval, request: dict[str, Any]) -> Approval:
        if approval.approval_id not in self.approvals:
            self._append(approval.run_id, EventType.APPROVAL_REQUEST, request)
            self.approvals[approval.approval_id] = _stored(approval)
        return _stored(self.approvals[approval.approval_id])

    async def get_approval(self, approval_id: str) -> Approval | None:
        row = self.approvals.get(approval_id)
        return _stored(row) if row else None

    async def list_approvals(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[Approval]:
        rows = [
            a
            for a in self.approvals.values()
            if (status is None or a.status == status) and (run_id is None or a.run_id == run_id)
        ]
        rows.sort(key=lambda a: (a.created_at, a.approval_id))
        return [_stored(a) for a in rows[:limit]]

    async def decide_approval(
        self,
        approval_id: str,
        decision: ApprovalDecision,
        *,
        decided_by: str,
        comment: str | None,
        via: str | None = None,
        run_id: str | None = None,
    ) -> tuple[Approval, bool]:
        row = self.approvals.get(approval_id)
        if row is None or (run_id is not None and row.run_id != run_id):
            raise RuntimeProblem(Code.APPROVAL_NOT_FOUND, f"approval {approval_id} not found")
        won = row.status == "pending"
        if won:
            row = row.model_copy(
                update={
                    "status": decision,
                    "decided_by": decided_by,
                    "comment": comment,
                    "decided_at": utcnow(),
                }
            )
            self.approvals[approval_id] = row
            self._append(
                row.run_id,
                EventType.APPROVAL_RESULT,
                {
                    "approval_id": approval_id,
                    "tool_call_id": row.tool_call_id,
                    "decision": decision,
                    "decided_by": decided_by,
                    "comment": comment,
                    **({"via": via} if via else {}),
                },
            )
        return _stored(row), won

    # -- the tool-call ledger -------------------------------------------------

    async def get_tool_call(self, tool_call_id: str) -> ToolCall | None:
        row = self.tool_calls.get(tool_call_id)
        return _stored(row) if row else None

    async def begin_tool_call(self, call: ToolCall, action: dict[str, Any]) -> ToolCall:
        if call.tool_call_id not in self.tool_calls:
            self._append(call.run_id, EventType.ACTION, action)
            self.tool_calls[call.tool_call_id] = _stored(call)
        return _stored(self.tool_calls[call.tool_call_id])

    async def start_tool_call(
        self, call: ToolCall, action: dict[str, Any]
    ) -> tuple[ToolCall, bool]:
        if call.tool_call_id in self.tool_calls:
            return _stored(self.tool_calls[call.tool_call_id]), False
        self._append(call.run_id, EventType.ACTION, action)
        row = _stored(call.model_copy(update={"attempts": call.attempts + 1}))
        self.tool_calls[call.tool_call_id] = row
        return _stored(row), True

    async def claim_tool_call(
        self,
        tool_call_id: str,
        seen_attempts: int,
        action: dict[str, Any] | None = None,
        retried: Sequence[dict[str, Any]] | None = None,
    ) -> ToolCall | None:
        row = self.tool_calls.get(tool_call_id)
        if row is None or row.status != "running" or row.attempts != seen_attempts:
            return None
        if action is not None:
            self._append(row.run_id, EventType.ACTION, action)
        update: dict[str, Any] = {"attempts": row.attempts + 1, "updated_at": utcnow()}
        if retried is not None:
            update["retried"] = _json(list(retried))
        row = row.model_copy(update=update)
        self.tool_calls[tool_call_id] = row
        return _stored(row)

    async def update_tool_call(
        self,
        tool_call_id: str,
        *,
        result: dict[str, Any] | None = None,
        from_status: Sequence[str] = ("running",),
        action: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ToolCall:
        row = self.tool_calls.get(tool_call_id)
        if row is None:
            raise RuntimeProblem(Code.NOT_FOUND, f"tool call {tool_call_id} not found")
        if row.status not in from_status:
            return _stored(row)
        # Through JSON, like the columns: an Enum in an error dict comes back a string.
        moved = ToolCall.model_validate(
            {**row.model_dump(mode="json"), **_json(fields), "updated_at": utcnow()}
        )
        self.tool_calls[tool_call_id] = moved
        if action is not None:
            self._append(moved.run_id, EventType.ACTION, action)
        if result is not None:
            self._append(moved.run_id, EventType.RESULT, result)
        return _stored(moved)

    async def list_tool_calls(self, run_id: str) -> list[ToolCall]:
        rows = [r for r in self.tool_calls.values() if r.run_id == run_id]
        rows.sort(key=lambda r: (r.step_index, r.call_index))
        return [_stored(r) for r in rows]

    # -- artifacts ------------------------------------------------------------

    async def put_artifact(self, artifact: Artifact, content: bytes) -> Artifact:
        if artifact.run_id is not None:
            self._require_run(artifact.run_id)
        if artifact.artifact_id not in self.artifacts:
            self.artifacts[artifact.artifact_id] = (_stored(artifact), bytes(content))
        if artifact.run_id is not None:
            self._append(
                artifact.run_id,
                EventType.ARTIFACT,
                artifact.model_dump(mode="json", exclude={"run_id"}),
                dedupe_key=f"artifact:{artifact.artifact_id}",
            )
        return artifact

    async def artifact_exists(self, artifact_id: str) -> bool:
        return artifact_id in self.artifacts

    async def get_artifact(self, artifact_id: str) -> tuple[Artifact, bytes] | None:
        found = self.artifacts.get(artifact_id)
        return (_stored(found[0]), found[1]) if found else None


def node_runtime(store: NodeStore, run_id: str, **context: Any) -> Runtime[Context]:
    """The ``runtime`` argument a node gets from LangGraph, carrying ``store`` as its services."""
    return Runtime(context=Context(run_id=run_id, store=store, **context))


def _is_a_node_store(store: FakeStore) -> NodeStore:
    return store  # mypy proves FakeStore has every method NodeStore lists, with its signature
