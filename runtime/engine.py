"""The engine: creates runs and drives them through their graphs under a lease.

A run that needs driving (new, decided, cancelled, orphaned) is claimed by a
worker (:mod:`runtime.worker`) with a lease whose version is a fencing token:
every store write of the drive checks it, so a worker that lost its lease
cannot write over the new owner. Graph state is checkpointed with
``durability="sync"``: a superstep's checkpoint is written before the next one
starts, so a crash loses at most the superstep that was running, and the
ledger makes re-running that superstep safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore

from runtime.agent import AgentSpec
from runtime.backend import settle_checkpointer
from runtime.budget import Maxima, effective_limits
from runtime.cancelling import NO_TOOLS, CallSetting, CutOff, finish_cancel
from runtime.checkpointer import LEASE
from runtime.commands import Drive
from runtime.dberrors import TRANSIENT_DB_ERRORS
from runtime.errors import CODES, Code, Recovery, RuntimeProblem
from runtime.eventbus import EventBus
from runtime.events import EventType
from runtime.graph_drive import GraphDriving, Progress, active_at_start
from runtime.ids import content_hash, new_run_id
from runtime.lifecycle import TERMINAL, State
from runtime.metrics import Metrics
from runtime.model import Run, RunCreate, utcnow
from runtime.release import Releases, collected, flush_quietly, lease_lost
from runtime.retry import (
    DriveRetry,
    after_broken_drive,
    after_failed_drive,
    fail_crash_loop,
)
from runtime.store.base import DriveStart, LeaseLost, RunStore

log = logging.getLogger(__name__)

UNWIND_S = 5.0
"""How long a shutdown waits, past its grace, for cancelled drives to hand their runs
back (a release, a cut-off call settled); longer, it stops without them."""


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Engine(GraphDriving):
    def __init__(
        self,
        store: RunStore,
        checkpointer: BaseCheckpointSaver[str],
        agents: Mapping[str, AgentSpec],
        *,
        default_agent: str,
        maxima: Maxima | None = None,
        bus: EventBus | None = None,
        owner: str | None = None,
        lease_s: float = 30.0,
        retry: DriveRetry | None = None,
        memory: BaseStore | None = None,
    ) -> None:
        """``retry``: what becomes of a run whose drives end on database errors;
        ``memory``: LangGraph's store, for users' long-term memory (runtime.memory)."""
        if default_agent not in agents:
            raise ValueError(f"default agent {default_agent!r} is not registered")
        self.store = store
        self.checkpointer = checkpointer
        self.agents = dict(agents)
        self.default_agent = default_agent
        self.maxima = maxima or Maxima()
        self.bus = bus or EventBus()
        self.owner = owner or default_owner()
        self.lease_s = lease_s
        self.retry = retry or DriveRetry()
        self.memory = memory
        self.metrics = Metrics()
        self.graphs = {
            agent_id: spec.builder.compile(checkpointer=checkpointer, store=memory, name=agent_id)
            for agent_id, spec in self.agents.items()
        }
        self.drives: dict[str, Drive] = {}
        self.renews_leases = False
        """Set by the worker: without one, a lease this process takes is never renewed."""
        self._cancelling: set[str] = set()
        self._stopped = False
        """Set when the shutdown's grace has ended: no drive goes on to another node."""
        self._hurried = asyncio.Event()
        """Set by :meth:`hurry`: the shutdown's grace ends now."""
        self.work = asyncio.Event()
        """Set when there may be a run to claim; the worker waits on it."""
        self.full = False
        """Set by the worker while every slot is taken: a drive that ends frees one."""
        self.claiming_suspect = False
        """Set by the worker while it claims a suspect, which must find nothing beside it."""
        self.taking_cancels = 0
        self._noticed: set[str] = set()
        """Runs another process asked a worker for while we drove them."""
        self._unwinding: dict[str, set[asyncio.Task[None]]] = {}
        """Earlier drives of a run driven again, not ended yet: the new drive waits."""
        self.releases = Releases(store, self.owner, lease_s, self.wake)

    def wake(self) -> None:
        self.work.set()

    def on_work_notice(self, run_id: str) -> None:
        """A run needs a worker (a NOTIFY; '' after a reconnect: any run may)."""
        if run_id and run_id in self.drives:
            # Most often the echo of our own create or decision. If it was not, the
            # run is claimed again once this drive lets go of it (see _forget).
            self._noticed.add(run_id)
        else:
            self.wake()

    def _setting_of(self, agent_id: str) -> CallSetting:
        """The tools a run's calls had; none where this process lacks its agent (a cancel
        ends such a run all the same: what needed a tool, a reconcile or compensation,
        is left undone and said so, as for a tool that declares none)."""
        spec = self.agents.get(agent_id)
        return CallSetting(NO_TOOLS if spec is None else spec.tools, self.memory)

    # -- creating -------------------------------------------------------------

    async def create_run(
        self, request: RunCreate, *, max_active: int | None = None
    ) -> tuple[Run, bool]:
        """Create a run (or find the one with the same idempotency key); a worker starts it.

        ``max_active`` caps the runs of the request's tenant that are not yet parked or done.
        """
        run, fingerprint = self._new_run(request)
        if run.agent_id not in self.agents:
            # A retry of a create that a process with the agent answered (a fleet mid-
            # deploy, a load balancer's other server) gets that run: only a new run
            # needs its agent here.
            made = await self.store.run_for_key(run, fingerprint)
            if made is None:
                raise RuntimeProblem(Code.AGENT_NOT_FOUND, f"no agent {run.agent_id!r}")
            return made, False
        run, created = await self.store.create_run(run, fingerprint, max_active=max_active)
        if created:
            self.wake()
        return run, created

    async def replayed(self, request: RunCreate) -> Run | None:
        """The run a create with this request's idempotency key made already (None: no
        key, or nothing made yet; IDEMPOTENCY_CONFLICT: made by another request)."""
        if request.options.idempotency_key is None:
            return None
        run, fingerprint = self._new_run(request)
        return await self.store.run_for_key(run, fingerprint)

    def _new_run(self, request: RunCreate) -> tuple[Run, str]:
        """The run a create makes of ``request``, and the request's fingerprint (what an
        idempotency key is bound to)."""
        agent_id = request.agent_id or self.default_agent
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
        return run, fingerprint

    # -- driving --------------------------------------------------------------

    def start_drive(self, run_id: str, version: int, *, isolated: bool = False) -> None:
        """Drive a run this process has just leased (called by the worker); ``isolated``:
        a suspect, driven alone (:meth:`isolating`)."""
        earlier = self.drives.get(run_id)
        if earlier is not None and not earlier.task.done():
            if not (earlier.ending or earlier.lease_lost):
                # Leased again while a drive of ours still runs it: that drive's lease ran
                # out unrenewed (its loop blocked, or the database was away for a lease)
                # and is gone, as if another worker had taken it. Two drives of one run in
                # a process must not both go on (on SQLite nothing fences the older one's
                # checkpoints). Past its work, it only has its release left to finish.
                log.warning("%s leased again while an earlier drive ran it; stopping that", run_id)
                earlier.lease_lost = True
                earlier.task.cancel()
            self._cancelling.discard(run_id)  # the earlier drive's: not the new one's to heed
            unwinding = self._unwinding.setdefault(run_id, set())
            unwinding.add(earlier.task)
            earlier.task.add_done_callback(lambda t: self._unwound(run_id, t))
        after = frozenset(self._unwinding.get(run_id, ()))
        task = asyncio.create_task(self._drive(run_id, version, after), name=f"drive:{run_id}")
        self.drives[run_id] = Drive(task, version, isolated=isolated)
        task.add_done_callback(lambda t: self._forget(run_id, t))

    def _unwound(self, run_id: str, task: asyncio.Task[None]) -> None:
        unwinding = self._unwinding.get(run_id)
        if unwinding is not None:
            unwinding.discard(task)
            if not unwinding:
                del self._unwinding[run_id]
        if self.full:
            self.wake()  # it held a slot

    def running(self) -> int:
        """Drive tasks this process runs: its drives, and earlier drives of runs driven
        again that have not ended yet (one that ignores its cancel still takes a slot)."""
        return len(self.drives) + sum(len(u) for u in self._unwinding.values())

    def isolating(self) -> bool:
        """Whether a suspect's drive has the process to itself (or is being claimed):
        nothing else starts here until it moves its run on or ends."""
        return self.claiming_suspect or any(d.isolated for d in self.drives.values())

    def _forget(self, run_id: str, task: asyncio.Task[None]) -> None:
        drive = self.drives.get(run_id)
        current = drive is not None and drive.task is task
        if current:
            del self.drives[run_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("driver of %s failed", run_id, exc_info=task.exception())
        if not current:  # an earlier drive of a run driven again: the notices are the new one's
            return
        if self.full or run_id in self._noticed:
            self.wake()  # a slot is free, or the run was asked for while we held it
        self._noticed.discard(run_id)
        self.bus.publish(run_id, 0)  # wake anyone waiting for the run to settle

    async def _drive(
        self, run_id: str, version: int, after: frozenset[asyncio.Task[None]] = frozenset()
    ) -> None:
        drive = self.drives.get(run_id)
        store = self.store.fenced(run_id, version)
        LEASE.set((run_id, version))  # this task's checkpoint writes are fenced too
        release: bool | None = None  # needs_drive after release; None: leave as is
        retry_in: float | None = None  # the drive failed: when the run may be driven again
        failures: int | None = None  # drives in a row before this one that failed
        progress = Progress()
        how = "stopped"  # how the drive ended, for the metrics
        carries_cancel = False  # the drive began to carry out a cancel already asked for
        self.metrics.inc("drives_started_total")
        try:
            if after:
                # Earlier drives of the run unwind first: a checkpoint write of theirs
                # (unfenced on SQLite) must not land after this drive has read the thread.
                # One that does not stop within a lease is left to its fences. Until this
                # drive has started, it reads a cancel itself rather than take a notice.
                await asyncio.wait(after, timeout=self.lease_s)
            if drive is not None and drive.version == version:
                drive.started = True  # a cancel notice may stop it from here on
            found = await store.get_run_to_drive(run_id)
            failures = found.failures if found is not None else 0
            if found is not None and found.taken_from is not None:
                await self._record_takeover(store, found, version)
            if found is not None:
                await self._record_kept(store, found.run)
            if found is None or found.run.state in TERMINAL:
                pass
            elif found.run.agent_id not in self.agents and found.cancel is None:
                how = "no_agent"
                retry_in, failures = await self._hand_on(store, found), found.failures
            elif found.takeovers > self.retry.max_takeovers:
                # A suspect that killed the worker it had to itself (claim_suspect).
                how = "crash_loop"
                progress.cut = cut = await self._cut_at_start(found)
                # Further past the limit, a drive before this one died failing the run
                # (or the limit was lowered): asking the tools again may be what kills.
                ask = found.takeovers == self.retry.max_takeovers + 1
                setting = self._setting_of(found.run.agent_id)
                await fail_crash_loop(store, setting, found, cut, ask_tools=ask)
            elif found.cancel is not None:
                how = "cancelled"
                carries_cancel = True
                # Already stopping: a second cancel notice must not cut this short.
                self._cancelling.add(run_id)
                progress.cut = await self._cut_at_start(found)
                await finish_cancel(store, self._setting_of, run_id, *found.cancel, progress.cut)
            else:
                progress.taken_over = found.takeovers > 0
                try:
                    # Lease versions count every grant: a pending run's first has no
                    # checkpoint to read. (Not a run an upgrade gave its first lease.)
                    first = version == 1 and found.run.state is State.PENDING
                    await self._drive_graph(
                        store, found.run, progress, first_lease=first, active_s=found.active_s
                    )
                except BaseException:
                    await asyncio.shield(settle_checkpointer(self.checkpointer))
                    raise
        except LeaseLost:
            how = "lease_lost"
            lease_lost(store, run_id)
            return
        except asyncio.CancelledError:
            if drive is not None and drive.version == version and drive.lease_lost:
                # Stopped because the run is another drive's now: nothing to hand back.
                how = "lease_lost"
                lease_lost(store, run_id)
                raise
            if run_id in self._cancelling:
                how = "cancelled"
                try:
                    cancel = await asyncio.shield(store.cancel_requested(run_id))
                    reason, compensate = cancel or ("cancelled", False)
                    await self._until_lease_lost(
                        run_id,
                        finish_cancel(
                            store, self._setting_of, run_id, reason, compensate, progress.cut
                        ),
                    )
                except LeaseLost:  # stalled past the lease: the new holder finishes it
                    how = "lease_lost"
                    lease_lost(store, run_id)
                    return
                except Exception as exc:  # a database blip, say: the next drive finishes it
                    how = "db_error" if isinstance(exc, TRANSIENT_DB_ERRORS) else "failed"
                    log.exception("could not finish the cancel of %s; handing it back", run_id)
                    failures = None if failures is None else failures + 1
                    retry_in = self.retry.delay(failures or 1)
            else:  # shutdown: hand the run to the next worker, from its checkpoint
                how = "handed_back"
                release = True
                try:
                    await asyncio.shield(flush_quietly(store))
                finally:  # a cancel notice landing here must not keep the lease (review)
                    # With the time its graph ran since the last renewal: not the run's.
                    stopped = self._clock_reading(run_id)
                    await asyncio.shield(
                        self.releases.release(run_id, version, True, active_s=stopped)
                    )
                raise
        except TRANSIENT_DB_ERRORS as exc:
            if run_id in self._cancelling and not carries_cancel:
                # The cancel's task.cancel() landed in a database call, which turned it
                # into an error (psycopg leaving a pipeline does): not the database
                # failing. The next drive reads the cancel and carries it out.
                how = "cancelled"
                log.info("the cancel of %s interrupted a database call: %s", run_id, exc)
                release = True
            else:  # a cancel's own drive failing too: counted, and it backs off
                how = "db_error"
                # A drive that moved the run on before it failed starts the count again:
                # a long run may meet several failovers; a failure that lasts stops it
                # dead. (None: the drive could not read the count; the store adds one.)
                if progress.made:
                    failures = 1
                elif failures is not None:
                    failures += 1
                retry_in = await after_failed_drive(
                    store, run_id, failures or 1, exc, self.retry, give_up=not carries_cancel
                )
        except Exception as exc:
            how = "failed"
            log.exception("run %s failed", run_id)
            handed = await after_broken_drive(
                store, run_id, exc, failures, progress.made, self.retry, carries_cancel
            )
            if handed is None:  # the error came after the lease moved on: not ours to record
                how = "lease_lost"
                lease_lost(store, run_id)
                return
            retry_in, failures = handed
        finally:
            if drive is not None and drive.version == version:
                drive.ending = True
            if drive is None or self.drives.get(run_id) is drive:
                # (A drive the run has been leased again past: the mark is the new one's.)
                self._cancelling.discard(run_id)
            self.metrics.inc("drives_ended_total", how=how)
        try:
            await asyncio.shield(flush_quietly(store))
        finally:  # a cancel notice landing here must not keep the lease from its release
            await asyncio.shield(
                self.releases.release(
                    run_id, version, release, retry_in, failures, backoff_cancel=carries_cancel
                )
            )

    async def _hand_on(self, store: RunStore, found: DriveStart) -> float:
        """A run of an agent this process does not have (a fleet mid-deploy, a server
        restarted without it): handed back for a process that has it, in a lease's
        time, rather than failed by a lookup that cannot succeed here. Said once in the
        run's log; its count of failed drives stands (nothing failed)."""
        run = found.run
        log.warning(
            "run %s is of agent %s, which this process does not have: handed back",
            run.run_id,
            run.agent_id,
        )
        message = (
            f"{self.owner} does not have agent {run.agent_id}: the run waits for a process "
            "that has it (give serve and every worker the same agents)"
        )
        await store.append_event(
            run.run_id,
            EventType.ERROR,
            {"code": Code.AGENT_NOT_FOUND.value, "message": message, "recovery": Recovery.RETRY},
            dedupe_key=f"agent-missing:{run.run_id}",
        )
        return self.lease_s

    async def _until_lease_lost(self, run_id: str, work: Coroutine[Any, Any, None]) -> None:
        """``work`` to its end, shielded from a second cancel of the drive (a shutdown),
        but not from the lease going to another worker: that one carries the run on, and
        this one must stop acting for it (its writes are fenced off; a tool's reconcile,
        say, is not). Its end is always collected, never left for asyncio to report."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(collected)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            drive = self._own_drive(run_id)
            if drive is not None and drive.lease_lost:
                task.cancel()
            raise

    async def _checkpointed_values(self, run: Run) -> Mapping[str, Any]:
        """The graph values of the run's last checkpoint (none for a run never driven)."""
        graph = self.graphs.get(run.agent_id)
        if graph is None or run.state in (State.PENDING, *TERMINAL):
            return {}
        try:
            snapshot = await graph.aget_state({"configurable": {"thread_id": run.run_id}})
        except Exception:  # only the usage it ends with is less exact: the cancel goes on
            log.warning("could not read the checkpoint of %s to cancel it", run.run_id)
            return {}
        return snapshot.values or {}

    async def _cut_at_start(self, found: DriveStart) -> CutOff:
        """Where the run's checkpoint has it, for a drive that ends the run unstarted."""
        values = await self._checkpointed_values(found.run)
        return CutOff(values, active_at_start(values, found.active_s, found.run.usage))

    async def _record_takeover(self, store: RunStore, found: DriveStart, version: int) -> None:
        """The worker before us stopped without giving the run back: say so on the
        record, where its work ends and ours begins (a recovered error)."""
        if found.run.state in TERMINAL:
            return
        await store.append_event(
            found.run.run_id,
            EventType.ERROR,
            {
                "code": Code.WORKER_LOST,
                "message": f"{found.taken_from} stopped renewing its lease; {self.owner} "
                "resumes the run from its last checkpoint",
                "recovery": CODES[Code.WORKER_LOST].recovery,
                "worker": found.taken_from,
            },
            dedupe_key=f"worker-lost:{version}",
        )

    def hurry(self) -> None:
        """End the shutdown's grace now, or as it begins (an operator's second signal):
        the drives still running are cancelled and hand their runs back at once, as
        they would when the grace ran out."""
        self._hurried.set()

    async def shutdown(self, grace_s: float = 0.0) -> None:
        """Let drives finish for ``grace_s`` (or until :meth:`hurry`), then hand the rest
        back from their checkpoints."""
        self.releases.shutting_down = True
        tasks = [d.task for d in self.drives.values()]
        tasks += [t for unwinding in self._unwinding.values() for t in unwinding]
        if tasks and grace_s > 0:
            await self._within_grace(tasks, grace_s)
        # A drive whose cancel is swallowed (a planner, a tool) stops at its next node
        # all the same, as for a user's cancel; one that does not get there within
        # UNWIND_S is left behind, its lease to lapse: the process is stopping, and a
        # drive that outlived the grace ran tools another process was taking over.
        self._stopped = True
        # Earlier drives of a run driven again, still unwinding, too.
        for task in {d.task for d in self.drives.values()} | set(tasks):
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=UNWIND_S)
            if stuck:
                log.warning(
                    "%d drive(s) did not stop within %.0f s of the shutdown's cancel; "
                    "their leases lapse",
                    len(stuck),
                    UNWIND_S,
                )
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: already logged by the drive
        # Those the database kept from their release: their leases lapse instead.
        await self.releases.stop()

    async def _within_grace(self, tasks: list[asyncio.Task[None]], grace_s: float) -> None:
        """Until every task has ended, the grace has, or :meth:`hurry` is called."""
        # Waiting on a wait: cancelled, it leaves the drives themselves alone.
        ended = asyncio.ensure_future(asyncio.wait(tasks))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait(
                {ended, hurried}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
            hurried.cancel()
