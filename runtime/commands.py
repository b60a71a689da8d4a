"""What the API asks of runs besides creating them: wait for one, decide its approval,
cancel it, read its checkpoint. Mixed into :class:`runtime.engine.Engine`, whose
drives these wait on or stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.aio import within
from runtime.errors import Code, RuntimeProblem
from runtime.eventbus import EventBus
from runtime.lifecycle import TERMINAL, State
from runtime.model import Approval, ApprovalDecision, Run
from runtime.retry import DriveRetry
from runtime.store.base import RunStore

HISTORY_PAGE = 16
"""Checkpoints read at a time when looking back through a run's history."""


@dataclass
class Drive:
    task: asyncio.Task[None]
    version: int
    started: bool = False
    """Whether its task has begun: one cancelled before its first step never runs,
    so never finishes the cancel nor gives its lease back."""
    lease_lost: bool = False
    """Its lease went to another worker (the heartbeat found it): stop acting for the run."""
    ending: bool = False
    """Past its work, giving the lease back: a cancel notice has nothing to stop."""
    active_s: Callable[[], float] | None = None
    """The run's active seconds so far, once the drive runs its graph (the heartbeat
    records them: a crash must not give the run its unsaved time back)."""
    renewed: float = field(default_factory=time.monotonic)
    """When (``time.monotonic()``) the lease was last granted or renewed: it holds for the
    lease's length from then. (A claim's grant is learnt a round trip after the database
    made it: a margin that does not matter, as the fence, not this clock, keeps a lapsed
    drive's writes out.)"""
    isolated: bool = False
    """Its run is a suspect (its workers keep dying): until it checkpoints a step or
    ends, this process drives nothing else (see ``LeaseQueries.claim_suspect``)."""


class RunCommands:
    store: RunStore
    bus: EventBus
    drives: dict[str, Drive]
    """The drives this process runs, by run."""
    graphs: Mapping[str, Any]
    """The compiled graph of each agent (compiled by the engine, with its checkpointer)."""
    default_agent: str
    lease_s: float
    owner: str
    retry: DriveRetry
    taking_cancels: int
    """Cancels this process is taking a lease for, to stop the run at once."""
    renews_leases: bool
    """Whether a worker of this process keeps the leases of its drives alive."""
    _cancelling: set[str]
    """Runs whose drive is being stopped by a cancel."""
    _stopped: bool
    """Whether the shutdown's grace has ended (every drive is being stopped)."""

    def wake(self) -> None:
        """Tell the worker there may be a run to claim (the engine's)."""
        raise NotImplementedError

    def start_drive(self, run_id: str, version: int) -> None:
        """Drive a run this process has just leased (the engine's)."""
        raise NotImplementedError

    def isolating(self) -> bool:
        """Whether a suspect has this process to itself (the engine's): a cancel's drive
        beside it could be what kills the worker, and the suspect would be blamed."""
        raise NotImplementedError

    async def wait_settled(self, run_id: str, within_s: float = 60.0) -> Run:
        """Wait until the run is terminal or parked, with no drive of this process on it."""
        async with asyncio.timeout(within_s):
            with self.bus.subscribe(run_id) as waiter:
                while True:
                    waiter.clear()
                    drive = self.drives.get(run_id)
                    if drive is not None:
                        # Driven here: nothing is settled before the drive ends, so wait
                        # for that rather than re-reading the run at every event.
                        await asyncio.wait({drive.task})
                        continue
                    run = await self.settled_now(run_id)
                    if run is not None:
                        return run
                    await within(0.5, waiter.wait())

    async def settled_now(self, run_id: str) -> Run | None:
        """The run if it is terminal or parked, with no drive of this process on it;
        None while it moves."""
        found = await self.store.get_run_drive(run_id)
        if found is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run_id}")
        run, needs_drive = found
        parked = run.state is State.WAITING_HUMAN and not needs_drive
        return run if (run.state in TERMINAL or parked) and run_id not in self.drives else None

    # -- approvals ------------------------------------------------------------

    async def decide(
        self,
        run_id: str,
        approval_id: str,
        decision: str,
        *,
        decided_by: str,
        comment: str | None,
        via: str | None = None,
    ) -> tuple[Approval, bool]:
        """Decide an approval once; returns (approval, whether this call decided it).

        ``via`` (how the decider authenticated) goes into the decision's audit event."""
        status: ApprovalDecision = "approved" if decision == "approve" else "rejected"
        try:
            approval, won = await self.store.decide_approval(
                approval_id, status, decided_by=decided_by, comment=comment, via=via, run_id=run_id
            )
        except RuntimeProblem as exc:
            if exc.code is Code.APPROVAL_NOT_FOUND:
                raise RuntimeProblem(
                    Code.APPROVAL_NOT_FOUND, f"no approval {approval_id} on {run_id}"
                ) from None
            raise
        if won:
            self.wake()
            return approval, True
        if approval.status == "expired":  # only a run's end expires its approvals
            raise RuntimeProblem(
                Code.RUN_STATE_CONFLICT,
                f"run {run_id} has ended: its approval {approval_id} expired undecided",
                approval_status=approval.status,
            )
        if approval.status != status:
            raise RuntimeProblem(
                Code.APPROVAL_CONFLICT,
                f"approval {approval_id} is already {approval.status}",
                approval_status=approval.status,
            )
        return approval, False

    # -- cancelling -----------------------------------------------------------

    async def cancel(
        self,
        run_id: str,
        reason: str,
        *,
        compensate: bool = False,
        wait_s: float | None = None,
        requested_by: str | None = None,
    ) -> Run:
        """Ask for the run to stop; whoever drives it stops it and records what happened.

        Returns once the run is terminal, or after ``wait_s`` (the lease time by
        default) with the run as it is; the cancellation still goes through.
        """
        run = await self.store.get_run(run_id)
        if run is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run_id}")
        if run.state in TERMINAL:
            return await self._cancelled(run, compensate)
        if not await self.store.request_cancel(run_id, reason, compensate, requested_by):
            ended = await self.store.get_run(run_id)  # it ended as we looked
            assert ended is not None
            return await self._cancelled(ended, compensate)
        self.on_cancel_notice(run_id)
        if run_id not in self.drives and self.renews_leases and not self.isolating():
            # Nobody drives it (queued behind full workers, parked, or its worker died):
            # stop it here and now rather than wait for a free slot somewhere. The
            # lease keeps any worker's claim off it; the drive only finishes the cancel.
            # Not a suspect: only a worker with nothing else to drive takes that; and
            # no suspect is claimed here meanwhile (the worker waits for this).
            self.taking_cancels += 1
            try:
                version = await self.store.take_lease(
                    run_id, self.owner, self.lease_s, self.retry.max_takeovers
                )
            finally:
                self.taking_cancels -= 1
            if version is not None and not self.renews_leases:
                # The worker stopped as the lease was taken: its shutdown is over, and a
                # drive started now would run unwatched, its lease never renewed.
                await self.store.give_back_claim(run_id, self.owner, version)
            elif version is not None:
                self.start_drive(run_id, version)
        self.wake()
        with contextlib.suppress(TimeoutError):
            ended = await self._wait_terminal(
                run_id, wait_s if wait_s is not None else self.lease_s
            )
            # It may have ended otherwise before the cancel reached it (succeeded, say).
            return await self._cancelled(ended, compensate)
        final = await self.store.get_run(run_id)
        assert final is not None
        return await self._cancelled(final, compensate) if final.state in TERMINAL else final

    async def _cancelled(self, run: Run, compensate: bool) -> Run:
        """An ended run as the answer to a cancel: itself if a cancel ended it as asked,
        a conflict if it ended otherwise, or without the compensation now asked for
        (nobody would carry it out)."""
        if run.outcome is None or run.outcome.code is not Code.RUN_CANCELLED:
            raise RuntimeProblem(Code.RUN_STATE_CONFLICT, f"run is already {run.state.value}")
        if compensate:
            intent = await self.store.cancel_requested(run.run_id)
            if intent is None or not intent[1]:
                raise RuntimeProblem(
                    Code.RUN_STATE_CONFLICT,
                    "run was cancelled without compensation; it is too late to ask for it",
                )
        return run

    def on_cancel_notice(self, run_id: str) -> None:
        """A cancel was requested (here or in another process): stop our drive of it."""
        drive = self.drives.get(run_id)
        # A drive yet to start reads the cancel (committed before this notice) itself.
        # (Nor one that has ended: an entry left behind would outlive the drive.)
        if (
            drive is not None
            and drive.started
            and not drive.ending
            and run_id not in self._cancelling
        ):
            self._cancelling.add(run_id)
            drive.task.cancel()

    async def _wait_terminal(self, run_id: str, within_s: float) -> Run:
        async with asyncio.timeout(within_s):
            with self.bus.subscribe(run_id) as waiter:
                while True:
                    waiter.clear()
                    run = await self.store.get_run(run_id)
                    if run is not None and run.state in TERMINAL and run_id not in self.drives:
                        return run
                    await within(0.5, waiter.wait())

    # -- reading --------------------------------------------------------------

    def _graph(self, run: Run) -> Any:
        """The compiled graph that reads the run's checkpoints: its agent's, or where this
        process does not host that agent (retired, or another server's), the default
        agent's. Every run graph's state is a RunState (``AgentSpec.builder``), so its
        values read the same, and a graph of ``build_run_graph`` names its nodes as any
        other does. The checkpoint is part of a run's record: it was a 422."""
        return self.graphs.get(run.agent_id) or self.graphs[self.default_agent]

    async def checkpoint(self, run: Run) -> dict[str, Any]:
        """The latest checkpoint of the run's graph, in the chapter's shape (DESIGN §6)."""
        config = {"configurable": {"thread_id": run.run_id}}
        snapshot = await self._graph(run).aget_state(config)
        checkpoint_id = (snapshot.config or {}).get("configurable", {}).get("checkpoint_id")
        if checkpoint_id is None:
            _unless_pruning(run)
        values = snapshot.values or {}
        step = values.get("step_index", 0)
        memory_version = values.get("memory_version", 0)
        stack = list(values.get("handoff_stack", []))
        ended = run.state in TERMINAL
        view: dict[str, Any] = {
            "run_id": run.run_id,
            "state": run.state.value,
            "step_index": step,
            "checkpoint_id": checkpoint_id,
            # An ended run goes on nowhere; a run ended from outside its graph (a cancel,
            # its time budget) or inside a sub-agent keeps the graph's last word on it.
            "next": [] if ended else list(snapshot.next),
            "planner_context_ref": f"mem://{run.run_id}/planner-v{step}",
            # Only where that step was planned: a run that never planned has none to show.
            "planner_context_url": (
                f"/runs/{run.run_id}/planner-context/{step}"
                if (values.get("usage") or {}).get("steps", 0) > step
                else None
            ),
            "tool_calls": list(values.get("tool_calls", [])),
            "memory_snapshot": f"memory://{run.run_id}/v{memory_version}",
            "handoff_stack": [] if ended else stack,
            "pending_approval": (
                run.pending_approval.model_dump(mode="json") if run.pending_approval else None
            ),
            "budget": run.usage.model_dump() if ended else values.get("usage") or {},
        }
        if ended and stack:
            view["ended_inside"] = stack  # the handoffs its end answered (its log has them)
        return view

    async def state_before_planning(self, run: Run, step: int) -> dict[str, Any] | None:
        """The graph state the planner was handed to decide step ``step`` (from the
        checkpoint written just before that planner task), or None if there is none.

        The history is read newest first, a page at a time (SQLite's saver holds its
        connection, which every drive writes checkpoints through, while it reads one),
        and only back to the first checkpoint from before that step."""
        graph = self._graph(run)
        config: Any = {"configurable": {"thread_id": run.run_id}}
        before = None
        while True:
            page = [
                s async for s in graph.aget_state_history(config, before=before, limit=HISTORY_PAGE)
            ]
            if before is None and not page:
                _unless_pruning(run)
            for snapshot in page:
                values = snapshot.values or {}
                planned = int((values.get("usage") or {}).get("steps", 0))
                if planned < step:
                    return None  # older checkpoints are from before it
                if planned == step and snapshot.next == ("planner",):
                    return dict(values)
            if len(page) < HISTORY_PAGE:
                return None
            before = page[-1].config


def _unless_pruning(run: Run) -> None:
    """Of a run found with no checkpoint: one that ended after it had some is being
    pruned (checkpoints first, then its rows, or a prune was stopped in between). Gone,
    not a made-up empty state, nor a step its record lists said to be none."""
    if run.state in TERMINAL and run.usage.steps > 0:
        raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run.run_id} is being pruned")
