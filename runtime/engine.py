"""The engine: creates runs and drives them through their graphs; resumes, cancels, recovers.

One driver task per run at a time, under that run's lock. Graph state is
checkpointed with ``durability="sync"``: a superstep's checkpoint is written
before the next superstep starts, so a crash loses at most the superstep that
was running, and the ledger makes re-running that superstep safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

import psycopg
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from runtime.adapter import Adapter, fail_run, side_effects
from runtime.agent import AgentSpec
from runtime.budget import Maxima, effective_limits
from runtime.context import Context
from runtime.errors import Code, RuntimeProblem
from runtime.ids import content_hash, new_run_id
from runtime.ledger import StoreArtifacts
from runtime.lifecycle import TERMINAL, State, Trigger
from runtime.model import Approval, ApprovalDecision, Run, RunContext, RunCreate, Usage, utcnow
from runtime.store.base import RunStore
from runtime.tooling import ToolContext

log = logging.getLogger(__name__)

RECURSION_LIMIT = 100_000  # the run's own budgets bound the loop, not LangGraph's step cap
TRANSIENT_DB_ERRORS = (psycopg.OperationalError, sqlite3.OperationalError)


class Engine:
    def __init__(
        self,
        store: RunStore,
        checkpointer: BaseCheckpointSaver[str],
        agents: Mapping[str, AgentSpec],
        *,
        default_agent: str,
        maxima: Maxima | None = None,
    ) -> None:
        if default_agent not in agents:
            raise ValueError(f"default agent {default_agent!r} is not registered")
        self.store = store
        self.agents = dict(agents)
        self.default_agent = default_agent
        self.maxima = maxima or Maxima()
        self.graphs = {
            agent_id: spec.builder.compile(checkpointer=checkpointer, name=agent_id)
            for agent_id, spec in self.agents.items()
        }
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._cancels: dict[str, tuple[str, bool]] = {}

    # -- creating -------------------------------------------------------------

    async def create_run(self, request: RunCreate) -> tuple[Run, bool]:
        """Create a run (or find the one with the same idempotency key) and start it."""
        agent_id = request.agent_id or self.default_agent
        if agent_id not in self.agents:
            raise RuntimeProblem(Code.AGENT_NOT_FOUND, f"no agent {agent_id!r}")
        request = request.model_copy(update={"agent_id": agent_id})
        now = utcnow()
        run = Run(
            run_id=new_run_id(),
            agent_id=agent_id,
            input=request.input,
            context=request.context,
            options=request.options,
            state=State.PENDING,
            limits=effective_limits(request.options, self.maxima),
            created_at=now,
            updated_at=now,
        )
        fingerprint = content_hash(
            request.model_dump(mode="json", exclude={"options": {"idempotency_key"}})
        )
        run, created = await self.store.create_run(run, fingerprint)
        if created:
            self.schedule(run.run_id)
        return run, created

    # -- driving --------------------------------------------------------------

    def _lock(self, run_id: str) -> asyncio.Lock:
        return self._locks.setdefault(run_id, asyncio.Lock())

    def schedule(self, run_id: str, resume: Any = None) -> asyncio.Task[None]:
        task = asyncio.create_task(self._drive(run_id, resume), name=f"drive:{run_id}")
        self._tasks[run_id] = task
        task.add_done_callback(lambda t: self._forget(run_id, t))
        return task

    def _forget(self, run_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(run_id) is task:
            del self._tasks[run_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("driver of %s failed", run_id, exc_info=task.exception())

    async def wait_idle(self, run_id: str) -> None:
        """Wait until no driver is working on ``run_id`` in this process."""
        task = self._tasks.get(run_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(task)

    async def _drive(self, run_id: str, resume: Any) -> None:
        async with self._lock(run_id):
            try:
                await self._drive_locked(run_id, resume)
            except asyncio.CancelledError:
                if run_id not in self._cancels:
                    raise  # shutdown: leave the run to be recovered from its checkpoint
                reason, compensate = self._cancels.pop(run_id)
                await asyncio.shield(self._finish_cancel(run_id, reason, compensate))

    async def _drive_locked(self, run_id: str, resume: Any) -> None:
        run = await self.store.get_run(run_id)
        if run is None or run.state in TERMINAL:
            return
        graph = self.graphs[run.agent_id]
        config: dict[str, Any] = {
            "configurable": {"thread_id": run_id},
            "recursion_limit": RECURSION_LIMIT,
        }
        snapshot = await graph.aget_state(config)
        graph_input: Any
        if resume is not None:
            graph_input = resume
        elif not snapshot.values:
            graph_input = {
                "input": run.input,
                "context": run.context.model_dump(mode="json"),
                "limits": run.limits.model_dump(),
                "usage": Usage().model_dump(),
            }
        elif snapshot.interrupts:
            graph_input = await self._decided_resume(snapshot.interrupts[0].value)
            if graph_input is None:
                adapter = Adapter(self.store, run)
                await adapter.on_stop(snapshot.values, [i.value for i in snapshot.interrupts])
                return
        else:
            graph_input = None  # continue from the last checkpoint
        usage = Usage.model_validate((snapshot.values or {}).get("usage") or {})
        ctx = Context(run_id=run_id, store=self.store, active_base_s=usage.active_s)
        adapter = Adapter(self.store, run)
        remaining = run.limits.timeout_s - usage.active_s
        try:
            async with asyncio.timeout(max(remaining, 0.001)):
                async for mode, part in graph.astream(
                    graph_input,
                    config,
                    context=ctx,
                    stream_mode=["tasks", "values"],
                    durability="sync",
                ):
                    if mode == "values":
                        await adapter.on_values(part)
                    elif mode == "tasks" and "input" in part:
                        await adapter.on_task_start(part["name"])
        except TimeoutError:
            await self.store.update_run(
                run_id, usage=usage.model_copy(update={"active_s": ctx.active_s()}).model_dump()
            )
            await fail_run(
                self.store,
                run_id,
                Code.RUN_BUDGET_EXCEEDED,
                f"timeout_s {run.limits.timeout_s} reached",
            )
            return
        except TRANSIENT_DB_ERRORS:
            # The run is not lost: it stays where its checkpoint is and is resumed later.
            log.exception("database error while driving %s; leaving it to recovery", run_id)
            return
        except Exception as exc:
            log.exception("run %s failed", run_id)
            await fail_run(self.store, run_id, Code.INTERNAL_ERROR, repr(exc))
            return
        final = await graph.aget_state(config)
        await adapter.on_stop(final.values, [i.value for i in final.interrupts])

    async def _decided_resume(self, request: Mapping[str, Any]) -> Command[Any] | None:
        """The resume command for an interrupt whose approval was decided, if it was."""
        approval = await self.store.get_approval(request["approval_id"])
        if approval is None or approval.status == "pending":
            return None
        return Command(resume=_resume_payload(approval))

    async def checkpoint(self, run: Run) -> dict[str, Any]:
        """The latest checkpoint of the run's graph, in the chapter's shape (DESIGN §6)."""
        config = {"configurable": {"thread_id": run.run_id}}
        snapshot = await self.graphs[run.agent_id].aget_state(config)
        values = snapshot.values or {}
        step = values.get("step_index", 0)
        usage = values.get("usage") or {}
        memory_version = values.get("memory_version", 0)
        return {
            "run_id": run.run_id,
            "state": run.state.value,
            "step_index": step,
            "checkpoint_id": (snapshot.config or {}).get("configurable", {}).get("checkpoint_id"),
            "next": list(snapshot.next),
            "planner_context_ref": f"mem://{run.run_id}/planner-v{step}",
            "tool_calls": list(values.get("tool_calls", [])),
            "memory_snapshot": f"memory://{run.run_id}/v{memory_version}",
            "handoff_stack": list(values.get("handoff_stack", [])),
            "pending_approval": (
                run.pending_approval.model_dump(mode="json") if run.pending_approval else None
            ),
            "budget": usage,
        }

    # -- approvals ------------------------------------------------------------

    async def decide(
        self,
        run_id: str,
        approval_id: str,
        decision: str,
        *,
        decided_by: str,
        comment: str | None,
    ) -> tuple[Approval, bool]:
        """Decide an approval once; returns (approval, whether this call decided it)."""
        approval = await self.store.get_approval(approval_id)
        if approval is None or approval.run_id != run_id:
            raise RuntimeProblem(Code.APPROVAL_NOT_FOUND, f"no approval {approval_id} on {run_id}")
        status: ApprovalDecision = "approved" if decision == "approve" else "rejected"
        if approval.status == "pending":
            # Wait for this process's driver to park the run before deciding.
            await self.wait_idle(run_id)
            async with self._lock(run_id):
                approval, won = await self.store.decide_approval(
                    approval_id,
                    status,
                    decided_by=decided_by,
                    comment=comment,
                    run_trigger=Trigger.APPROVED if status == "approved" else None,
                    run_fields={"pending_approval": None} if status == "approved" else None,
                )
            if won:
                self.schedule(run_id, Command(resume=_resume_payload(approval)))
                return approval, True
        if approval.status != status:
            raise RuntimeProblem(
                Code.APPROVAL_CONFLICT,
                f"approval {approval_id} is already {approval.status}",
                approval_status=approval.status,
            )
        return approval, False

    # -- cancelling -----------------------------------------------------------

    async def cancel(self, run_id: str, reason: str, *, compensate: bool = False) -> Run:
        run = await self.store.get_run(run_id)
        if run is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run_id}")
        if run.state in TERMINAL:
            if run.outcome is not None and run.outcome.code is Code.RUN_CANCELLED:
                return run
            raise RuntimeProblem(Code.RUN_STATE_CONFLICT, f"run is already {run.state.value}")
        await self.store.request_cancel(run_id, reason)
        task = self._tasks.get(run_id)
        if task is not None and not task.done():
            self._cancels[run_id] = (reason, compensate)
            task.cancel()
            await self.wait_idle(run_id)
        async with self._lock(run_id):
            await self._finish_cancel(run_id, reason, compensate)
        final = await self.store.get_run(run_id)
        assert final is not None
        return final

    async def _finish_cancel(self, run_id: str, reason: str, compensate: bool) -> None:
        run = await self.store.get_run(run_id)
        if run is None or run.state in TERMINAL:
            return
        for approval in await self.store.list_approvals(run_id=run_id, status="pending"):
            await self.store.decide_approval(
                approval.approval_id, "expired", decided_by="runtime", comment="run cancelled"
            )
        compensated = await self._compensate(run) if compensate else None
        await fail_run(
            self.store, run_id, Code.RUN_CANCELLED, reason or "cancelled", compensations=compensated
        )

    async def _compensate(self, run: Run) -> list[str]:
        """Run each declared compensation of a side effect that happened, once."""
        done: list[str] = []
        tools = self.agents[run.agent_id].tools
        happened, already = await side_effects(self.store, run.run_id)
        for row in await self.store.list_tool_calls(run.run_id):
            spec = tools.resolve(row.tool, row.version)
            if row.tool_call_id in already:
                done.append(row.tool_call_id)
                continue
            if row.tool_call_id not in happened or row.status != "succeeded":
                continue
            if spec is None or spec.compensate is None:
                continue
            tctx = ToolContext(
                run_id=run.run_id,
                tool_call_id=row.tool_call_id,
                idempotency_key=row.idempotency_key,
                context=RunContext.model_validate(run.context.model_dump()),
                artifacts=StoreArtifacts(self.store, run.run_id),
            )
            try:
                await spec.compensate(spec.args_model.model_validate(row.args), row.output, tctx)
            except Exception:
                log.exception("compensation of %s failed", row.tool_call_id)
                continue
            await self.store.update_tool_call(
                row.tool_call_id, from_status=("succeeded",), compensated=True
            )
            done.append(row.tool_call_id)
        return done

    # -- recovery and shutdown ------------------------------------------------

    async def recover(self) -> list[str]:
        """Pick up every run this process should be driving after a (re)start."""
        resumed: list[str] = []
        for run_id in await self.store.runs_in_states(
            [State.PENDING, State.PLANNING, State.EXECUTING]
        ):
            reason = await self.store.cancel_requested(run_id)
            if reason is not None:
                async with self._lock(run_id):
                    await self._finish_cancel(run_id, reason, False)
                continue
            self.schedule(run_id)
            resumed.append(run_id)
        for run_id in await self.store.runs_in_states([State.WAITING_HUMAN]):
            # A rejection decided just before a crash still has to reach its graph.
            decided = [
                a
                for a in await self.store.list_approvals(run_id=run_id)
                if a.status in ("approved", "rejected")
            ]
            pending = await self.store.list_approvals(run_id=run_id, status="pending")
            if decided and not pending:
                self.schedule(run_id)
                resumed.append(run_id)
        return resumed

    async def shutdown(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _resume_payload(approval: Approval) -> dict[str, Any]:
    return {
        "approval_id": approval.approval_id,
        "decision": "approve" if approval.status == "approved" else "reject",
        "comment": approval.comment,
        "decided_by": approval.decided_by,
    }
