"""A drive's graph run: from the run's checkpoint (or its input) through LangGraph's
stream to where the graph parks for a human, ends, or is cut off by a cancel or its
time budget. A base of :class:`runtime.engine.Engine`, which drives runs under leases
around it, on :class:`runtime.commands.RunCommands`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, StateSnapshot

from runtime.adapter import Adapter
from runtime.aio import to_the_end
from runtime.cancelling import CallSetting, CutOff, fail_cut_off
from runtime.commands import Drive, RunCommands
from runtime.context import Context
from runtime.dberrors import DATABASE_ERRORS
from runtime.errors import Code
from runtime.ledger import StoreArtifacts, write_outcome
from runtime.lifecycle import TERMINAL
from runtime.model import Approval, Run, Usage
from runtime.recording import Recording, Unrecorded
from runtime.store.base import LeaseLost, RunStore

log = logging.getLogger("runtime.engine")

RECURSION_LIMIT = 100_000  # the run's own budgets bound the loop, not LangGraph's step cap
INTERRUPT = "__interrupt__"
"""The key of a "values" stream part that carries the graph's interrupts (LangGraph
keeps its own constant private)."""


def active_at_start(
    values: Mapping[str, Any] | None, renewed: float, recorded: Usage | None = None
) -> float:
    """The run's active time as a drive starts: its checkpoint's (``recorded``, the run
    row's, where none could be read), or what the last lease renewal recorded where a
    crash cut a step off after that checkpoint."""
    raw = (values or {}).get("usage")
    usage = Usage.model_validate(raw) if raw else (recorded or Usage())
    return max(usage.active_s, renewed)


def _stopped_at(active_s: float) -> Callable[[], float]:
    """A clock stopped at ``active_s``: the graph was cut off, the rest is not its work."""
    return lambda: active_s


@dataclass
class Progress:
    """How far a drive got, for counting the drives that fail, or lose their worker, in a row."""

    tasks: int = 0
    """Graph tasks it started."""
    cut: CutOff | None = None
    """Where the graph was when a cancel cut the drive off."""
    taken_over: bool = False
    """The run has takeovers in a row to its name, to clear once the drive moves it on."""

    @property
    def made(self) -> bool:
        # Under durability "sync" a task starts only once the superstep before it is
        # checkpointed: a second task means the drive wrote something that lasts (the
        # first may be one a checkpoint already held, started again on resume). This
        # holds because every superstep of the run graph has one task (no fan-out).
        return self.tasks >= 2


def _resume_payload(approval: Approval) -> dict[str, Any]:
    return {
        "approval_id": approval.approval_id,
        "decision": "approve" if approval.status == "approved" else "reject",
        "comment": approval.comment,
        "decided_by": approval.decided_by,
    }


class GraphDriving(RunCommands):
    """The part of a drive inside the graph, and the drive's clock and cancel checks."""

    def _setting_of(self, agent_id: str) -> CallSetting:
        """The tools and memory a run of the agent calls with (the engine's)."""
        raise NotImplementedError

    def _own_drive(self, run_id: str) -> Drive | None:
        """The drive of the run that the calling task is, if it is one."""
        drive = self.drives.get(run_id)
        return drive if drive is not None and drive.task is asyncio.current_task() else None

    def _clock(self, run_id: str, active_s: Callable[[], float]) -> None:
        """What this drive's lease renewals record as the run's active time."""
        drive = self._own_drive(run_id)
        if drive is not None:
            drive.active_s = active_s

    def _unless_cancelled(self, run_id: str) -> None:
        """Stop here if a cancel notice came, or the shutdown's grace has ended: its
        ``task.cancel()`` can be swallowed by the code it lands in (a tool, a driver
        mid-pipeline), and the graph would go on to its next node, or park, as if
        nobody had asked."""
        if run_id in self._cancelling:
            raise asyncio.CancelledError(f"cancel of {run_id} requested")
        if self._stopped:
            raise asyncio.CancelledError("the shutdown's grace has ended")

    @functools.cached_property
    def unrecorded(self) -> Unrecorded:
        """Outcomes of calls this engine's drives ran but could not record: the
        engine's, not the module's, as an engine stands for a process (tests run several
        in one, and one may not know what another ran)."""
        return Unrecorded()

    async def _record_kept(self, store: RunStore, run: Run) -> None:
        """Write the outcomes this engine kept for the run's calls before the drive
        reads its ledger. The executor would, but a cancel, a crash loop's end or a
        cut-off closes a call it finds ``running`` as one whose effect may have
        happened, and a compensating cancel would not compensate it. One try each: a
        write that fails leaves the outcome kept, for the executor to try again (with
        retries) or for the ending to close the call as before, never held up by it."""
        for tool_call_id, finished in self.unrecorded.of_run(run.run_id):
            try:
                row = None if run.state in TERMINAL else await store.get_tool_call(tool_call_id)
                if (
                    row is not None
                    and row.status == "running"
                    and row.attempts == finished.attempts
                ):
                    await to_the_end(
                        write_outcome(store, row, finished, StoreArtifacts(store, run.run_id))
                    )
                # else: recorded, ruled on, or run again since
            except LeaseLost:
                raise
            except DATABASE_ERRORS as exc:
                log.warning("could not record the kept outcome of %s: %r", tool_call_id, exc)
                continue
            except Exception:
                # Its row no longer validates, or its output cannot be written: it never
                # will be, and must not fail a drive that is to end the run (a cancel).
                log.exception(
                    "let go of the kept outcome of %s: it cannot be written", tool_call_id
                )
            self.unrecorded.forget(tool_call_id)

    def _recording(self, run_id: str) -> Recording:
        """How the calling drive records its calls' outcomes: retried while its lease
        surely holds (from its grant or last renewal), kept by the engine past that."""
        drive = self._own_drive(run_id)
        if drive is None:
            return Recording(self.unrecorded)
        return Recording(self.unrecorded, lambda: drive.renewed + self.lease_s)

    def _clock_reading(self, run_id: str) -> float | None:
        drive = self._own_drive(run_id)
        return None if drive is None or drive.active_s is None else drive.active_s()

    async def _moved_on(self, run_id: str, progress: Progress) -> None:
        """The drive has checkpointed a step of a run taken over: whatever killed the
        workers before it, the run is not stuck on it. Its count starts again, and a
        suspect's isolation ends."""
        progress.taken_over = False
        drive = self._own_drive(run_id)
        if drive is None:
            return
        await self.store.clear_takeovers(run_id, self.owner, drive.version)
        if drive.isolated:
            drive.isolated = False
            self.wake()

    async def _drive_graph(
        self,
        store: RunStore,
        run: Run,
        progress: Progress,
        *,
        first_lease: bool,
        active_s: float = 0.0,
    ) -> None:
        """``first_lease``: no worker held the run before, so its graph has no
        checkpoint and the read is spared. ``active_s``: the run's active time as the
        last lease renewal recorded it."""
        run_id = run.run_id
        graph = self.graphs[run.agent_id]
        config: RunnableConfig = {
            "configurable": {"thread_id": run_id},
            "recursion_limit": RECURSION_LIMIT,
        }
        if first_lease:
            snapshot = StateSnapshot({}, (), config, None, None, None, (), ())
        else:
            snapshot = await graph.aget_state(config)
        graph_input: Any
        if not snapshot.values:
            graph_input = {
                "input": run.input,
                "context": run.context.model_dump(mode="json"),
                "limits": run.limits.model_dump(),
                "usage": Usage().model_dump(),
            }
        else:
            graph_input = None  # continue from the last checkpoint
        # A fresh run has recorded no step; otherwise one count spares the planner node
        # a read per step for the steps no earlier drive can have recorded.
        recorded = 0 if graph_input is not None else await store.count_steps(run_id)
        adapter = Adapter(store, run)
        values, interrupts = snapshot.values, [i.value for i in snapshot.interrupts]
        just_asked = False  # the graph interrupted a moment ago, in this drive
        ctx: Context | None = None
        while True:
            if ctx is not None:  # looking again in the same drive: its time is spent
                active_s = max(active_s, ctx.active_s())
            if interrupts:
                # A question just asked has no answer yet, or parking finds it (it checks
                # the approval in the same transaction): no read here.
                resume = None if just_asked else await self._decided_resume(store, interrupts[0])
                just_asked = False
                if resume is None:
                    if await adapter.on_stop(values, interrupts) is not None:
                        return  # parked until a human decides
                    continue  # decided while parking: look again
                graph_input = resume
            elif snapshot.values and not snapshot.next and not snapshot.tasks:
                # The graph had ended before a crash. (Tasks with saved writes but no
                # later checkpoint show an empty `next` too: those are continued below.)
                await adapter.on_stop(values, [])
                return
            ctx = Context(
                run_id=run_id,
                store=store,
                active_base_s=active_at_start(values, active_s),
                recorded_before=recorded,
                agent_id=run.agent_id,
                recording=self._recording(run_id),
            )
            self._clock(run_id, ctx.active_s)
            remaining = run.limits.timeout_s - ctx.active_base_s
            streamed: list[Any] = []  # the interrupts the stream reported
            budget: asyncio.Timeout | None = None
            try:
                stream = graph.astream(
                    graph_input,
                    config,
                    context=ctx,
                    stream_mode=["tasks", "values"],
                    durability="sync",
                )
                # Closed here, in this task, however the loop is left (a cancel raised
                # below included), not later by the garbage collector in another task.
                async with (
                    asyncio.timeout(max(remaining, 0.001)) as budget,
                    contextlib.aclosing(stream),
                ):
                    async for mode, part in stream:
                        if mode == "values":
                            if INTERRUPT in part:
                                streamed = [i.value for i in part[INTERRUPT]]
                                part = {k: v for k, v in part.items() if k != INTERRUPT}
                            await adapter.on_values(part)  # what the cut must charge
                            self._unless_cancelled(run_id)
                        elif mode == "tasks" and "input" in part:
                            self._unless_cancelled(run_id)
                            progress.tasks += 1
                            if progress.taken_over and progress.made:
                                await self._moved_on(run_id, progress)
                            await adapter.on_task_start(part["name"])
                    self._unless_cancelled(run_id)
            except asyncio.CancelledError:
                spent = ctx.active_s()
                progress.cut = CutOff(adapter.values or values or {}, spent)
                self._clock(run_id, _stopped_at(spent))
                raise
            except TimeoutError:
                if budget is None or not budget.expired():
                    raise  # not the run's time running out: an error like any other
                spent = ctx.active_s()
                # Settling and reconciling the cut calls is not the run's work.
                self._clock(run_id, _stopped_at(spent))
                # Its error names the call the time ran out in (the first, of parallel ones).
                await fail_cut_off(
                    store,
                    self._setting_of(run.agent_id),
                    run,
                    CutOff(adapter.values or values or {}, spent),
                    Code.RUN_BUDGET_EXCEEDED,
                    f"timeout_s {run.limits.timeout_s} reached",
                    settling=f"timeout_s {run.limits.timeout_s} reached while running",
                )
                return
            if streamed or (adapter.values.get("outcome") and graph_input is not None):
                # How the graph stopped is in the stream: an interrupt() (LangGraph puts
                # it in the "values" part; our graphs use no static interrupt_before/
                # after, which would not be), or an outcome in the last values.
                values, interrupts = adapter.values, streamed
            else:
                # Anything else (a graph continued from its checkpoint after a crash, or
                # one that stopped without an outcome): ask the checkpoint.
                snapshot = await graph.aget_state(config)
                values, interrupts = snapshot.values, [i.value for i in snapshot.interrupts]
            if not interrupts:
                await adapter.on_stop(values, [])
                return
            just_asked = True

    async def _decided_resume(self, store: RunStore, request: Mapping[str, Any]) -> Any:
        """The resume command for an interrupt whose approval was decided, if it was."""
        approval = await store.get_approval(request["approval_id"])
        if approval is None or approval.status == "pending":
            return None
        return Command(resume=_resume_payload(approval))
