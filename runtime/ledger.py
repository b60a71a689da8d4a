"""Execute a tool call at most once, with the ledger as the truth (DESIGN §7).

A finished row is returned as it is. A row left ``running`` by a process that
died mid-call is re-run only when that is safe: the tool is idempotent (same
idempotency key), or its ``reconcile`` says the effect did not happen. Anything
else is marked ``unknown``: never guessed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from pydantic import BaseModel

from runtime import failpoints
from runtime.aio import to_the_end
from runtime.artifact_naming import check_naming
from runtime.attempts import BACKOFF_MAX_S, run_handler
from runtime.breaker import BREAKERS, Breaker
from runtime.dberrors import serving
from runtime.errors import CODES, Code
from runtime.events import EventType, summarize
from runtime.ids import idempotency_key
from runtime.model import ToolCall, utcnow
from runtime.reconcile import final_answer, reconcile_in_time
from runtime.recording import Finished, Recording
from runtime.scrubbing import scrub as scrub
from runtime.scrubbing import secret_values as secret_values
from runtime.services import NodeStore, close_call
from runtime.storable import nests_deeper, plain_json
from runtime.tooling import (
    ArtifactSink,
    ToolContext,
    ToolSpec,
)

log = logging.getLogger(__name__)

INLINE_OUTPUT_BYTES = 4096
"""Outputs larger than this (or nested deeper than :data:`runtime.storable.MAX_NESTING`)
become an artifact; the ledger and checkpoint keep the ref."""
FINISHED = ("succeeded", "failed", "unknown", "cancelled")
STOPPED_ATTEMPT = (
    "the drive running this attempt stopped before its outcome was recorded "
    "(its process stopped or shut down, or the database failed)"
)
RECONCILE_FAILED = "asking its reconcile failed: "
RECONCILED_NO_EFFECT = "; the tool's reconcile then found no effect of it"
_IN_FLIGHT: set[str] = set()
"""tool_call_ids whose execute_once is under way in this process."""


class StoreArtifacts:
    """The artifact sink tools write to: content-addressed, recorded in the run's log."""

    def __init__(self, store: NodeStore, run_id: str | None) -> None:
        self.store = store
        self.run_id = run_id

    async def put(self, content: bytes, media_type: str, name: str) -> Any:
        from runtime.ids import artifact_id
        from runtime.model import Artifact

        check_naming(media_type, name)  # ValueError: the tool's, before anything is written
        artifact = Artifact(
            artifact_id=artifact_id(content),
            media_type=media_type,
            size=len(content),
            name=name,
            run_id=self.run_id,
            created_at=utcnow(),
        )
        with serving("artifact store"):
            return await self.store.put_artifact(artifact, content)


def new_ledger_row(
    run_id: str,
    step_index: int,
    call_index: int,
    tool_call_id: str,
    spec: ToolSpec,
    args: dict[str, Any],
    args_hash: str,
) -> ToolCall:
    now = utcnow()
    return ToolCall(
        tool_call_id=tool_call_id,
        run_id=run_id,
        step_index=step_index,
        call_index=call_index,
        tool=spec.name,
        version=spec.version,
        args=args,
        args_hash=args_hash,
        status="running",
        idempotency_key=idempotency_key(tool_call_id),
        attempts=0,
        side_effect=spec.side_effect,
        created_at=now,
        updated_at=now,
    )


async def kept(output: Any, name: str, artifacts: ArtifactSink) -> tuple[Any, str | None]:
    """``output`` as a run's record and its checkpoints keep it: inline up to
    :data:`INLINE_OUTPUT_BYTES`; larger, or nested deeper than any store reads, whole in
    an artifact ``name`` (whose id is returned too) and ``{artifact_id, size, preview}``
    in its place, so that a checkpoint does not grow with it (DESIGN §6)."""
    deep = nests_deeper(output)  # kept whole in an artifact, where depth costs nothing
    try:
        output, encoded = plain_json(output)
    except (RecursionError, ValueError, TypeError) as exc:
        # Past Python's stack, a cycle, a key JSON has no form for: what no store
        # keeps, after the tool ran. The call is closed all the same (left running,
        # a later drive would run it again or call it unknown).
        why = "nests too deep" if isinstance(exc, RecursionError) else "has no JSON form"
        output, deep = {"not_kept": f"the output {why}: {str(exc)[:200]}"}, False
        output, encoded = plain_json(output)
    if not deep and len(encoded) <= INLINE_OUTPUT_BYTES:
        return output, None
    art = await artifacts.put(encoded, "application/json", name)
    preview = {"artifact_id": art.artifact_id, "size": len(encoded), "preview": summarize(output)}
    return preview, art.artifact_id


async def _finish(
    store: NodeStore,
    row: ToolCall,
    status: str,
    output: Any,
    error: dict[str, Any] | None,
    artifacts: ArtifactSink,
    **changes: Any,
) -> ToolCall:
    artifact_ref = None
    if output is not None:
        # Clipped: tool names are the registry's, which has no bound on them.
        output, artifact_ref = await kept(output, f"{row.tool[:200]}-output.json", artifacts)
        if artifact_ref is None and isinstance(output, dict) and "artifact_id" in output:
            artifact_ref = output["artifact_id"]
    return await close_call(
        store,
        row,
        status=status,
        output=output,
        error=error,
        artifact_id=artifact_ref,
        **changes,
    )


async def settle_cut_off(
    store: NodeStore,
    spec: ToolSpec,
    row: ToolCall,
    args: BaseModel,
    tctx: ToolContext,
    error: dict[str, Any],
) -> ToolCall | None:
    """Close a side-effecting call a cancel cut off mid-handler, by asking the real
    system what happened (the tool's ``reconcile``): succeeded with its output if the
    effect took place, so it is reported and can be compensated; cancelled with
    ``took_effect: False`` added to ``error`` (why the run stopped) if it did not.
    None where nobody can tell (no reconcile, or it failed or outlasted the tool's
    timeout, which an ``error`` event says): the caller records an effect that may
    have happened.
    """
    known, found, failure = await final_answer(spec, args, tctx, row.tool_call_id)
    if failure is not None:
        # Left running: a retried pass of the cancel asks again, and may learn what
        # happened. Why nobody could tell this time is on the record meanwhile.
        await store.append_event(
            row.run_id,
            EventType.ERROR,
            {
                "code": Code.TOOL_OUTCOME_UNKNOWN.value,
                "message": f"{spec.ref} was cut off mid-call; {RECONCILE_FAILED}{failure}",
                "tool_call_id": row.tool_call_id,
                "recovery": CODES[Code.TOOL_OUTCOME_UNKNOWN].recovery,
            },
            dedupe_key=f"reconcile-failed:{row.tool_call_id}:{row.attempts}",
        )
    if not known:
        return None
    if found is not None:
        return await _finish(store, row, "succeeded", found, None, tctx.artifacts)
    error = {**error, "message": f"{error['message']}; it took no effect", "took_effect": False}
    return await _finish(store, row, "cancelled", None, error, tctx.artifacts)


async def _await_other_driver(store: NodeStore, row: ToolCall, spec: ToolSpec) -> ToolCall:
    """Another driver claimed this call a moment ago: wait for its outcome, never re-run it."""
    deadline = spec.timeout_s * spec.max_attempts + BACKOFF_MAX_S * spec.max_attempts
    waited, delay = 0.0, 0.01
    while waited <= deadline:
        current = await store.get_tool_call(row.tool_call_id)
        if current is not None and current.status in FINISHED:
            return current
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.5)
    raise RuntimeError(f"{row.tool_call_id} is still running in another driver")


async def execute_once(
    store: NodeStore,
    spec: ToolSpec,
    row: ToolCall,
    args: BaseModel,
    tctx: ToolContext,
    action: dict[str, Any],
    *,
    rerun: bool = False,
    recording: Recording | None = None,
    answered: int = 0,
) -> ToolCall:
    """Run the call described by ``row`` unless the ledger says it already ran.

    ``rerun``: a human has ruled on an earlier unknown outcome; run it again.
    ``recording``: the drive's (see :mod:`runtime.recording`).
    ``answered``: attempts that have a result of their own already (those before a
    human's "run it again").
    """
    if row.tool_call_id in _IN_FLIGHT:
        # A row this process is running shows an attempt counted, like one left by a
        # dead process: only this set tells the two apart (another process's drive
        # would have failed its fence: the run's lease is ours).
        return await _await_other_driver(store, row, spec)
    _IN_FLIGHT.add(row.tool_call_id)
    try:
        recording = recording or Recording()
        return await _execute(store, spec, row, args, tctx, action, rerun, recording, answered)
    finally:
        _IN_FLIGHT.discard(row.tool_call_id)


async def _execute(
    store: NodeStore,
    spec: ToolSpec,
    row: ToolCall,
    args: BaseModel,
    tctx: ToolContext,
    action: dict[str, Any],
    rerun: bool,
    recording: Recording,
    answered: int = 0,
) -> ToolCall:
    breaker = BREAKERS.for_tool(spec.ref)
    if breaker.state == "closed":
        # The usual case, a call never seen before: row, action event and first attempt
        # in one transaction, committed before the handler starts.
        current, claimed_new = await store.start_tool_call(row, action)
    else:
        current, claimed_new = await store.begin_tool_call(row, action), False
    if claimed_new:
        return await _run_claimed(store, spec, current, args, tctx, breaker, recording)
    if current.status in FINISHED or rerun:
        # Recorded since (by another drive), or ruled on: what this process kept is moot.
        recording.kept.forget(current.tool_call_id)
    if current.status in FINISHED:
        return current
    kept = None if rerun else recording.kept.find(current.tool_call_id, current.attempts)
    if kept is not None:  # this process ran it to its end: its outcome is known
        return await to_the_end(_record(store, current, kept, tctx, recording))
    no_effect = False  # the tool's reconcile found that the stopped attempts did nothing
    if current.attempts > 0 and not rerun:
        # An earlier drive started the handler and stopped before recording its outcome:
        # its process, or the database, failed; which, this drive cannot tell.
        if spec.reconcile is not None:
            # A system that does not answer fails this drive (a retry asks again) rather
            # than holding the run, and its lease, for ever.
            found = await reconcile_in_time(spec, args, tctx)
            if found is not None:
                return await _finish(store, current, "succeeded", found, None, tctx.artifacts)
            no_effect = True
        elif not spec.idempotent:
            return await close_call(
                store,
                current,
                status="unknown",
                error={
                    "code": Code.TOOL_OUTCOME_UNKNOWN,
                    "message": "the drive that ran this non-idempotent call stopped before "
                    "its outcome was recorded (its process stopped, or the database failed)",
                },
            )
    # Count the attempt before running, so a crash mid-call is visible on restart. A
    # call an earlier drive started runs again: the log says so, as for its first run
    # (a human's "run it again" has written its own).
    again: dict[str, Any] | None = None
    retried: list[dict[str, Any]] | None = None  # None: the row's list as it is
    if current.attempts > 0 and not rerun:
        again = {**action, "rerun": True, "attempt": current.attempts + 1}
        # The attempts counted that have no failure on record were cut off: their drives
        # stopped mid-call (a finished call never gets here). The result says so, or
        # their `action` events would stay unanswered in the log.
        on_record = {entry.get("attempt") for entry in current.retried}
        stopped = [
            {
                "code": Code.TOOL_OUTCOME_UNKNOWN,
                "message": STOPPED_ATTEMPT + (RECONCILED_NO_EFFECT if no_effect else ""),
                "attempt": attempt,
            }
            for attempt in range(answered + 1, current.attempts + 1)
            if attempt not in on_record
        ]
        retried = [*current.retried, *stopped]
    had_trial = breaker.trial_in_flight
    if not breaker.allow():
        # Fail fast: the tool has been unavailable; the handler is not touched.
        return await _finish(
            store,
            current,
            "failed",
            None,
            {"code": Code.TOOL_UNAVAILABLE, "message": f"circuit open for {spec.ref}"},
            tctx.artifacts,
            **({} if retried is None else {"retried": retried}),
        )
    # The half-open circuit's one trial, if this call is it: one that never reaches the
    # handler must let the next call be the trial, or the circuit stays shut for good.
    trial = breaker.trial_in_flight and not had_trial
    try:
        claimed = await store.claim_tool_call(
            current.tool_call_id, current.attempts, again, retried
        )
    except BaseException:
        if trial:
            breaker.trial_in_flight = False
        raise
    if claimed is None:
        if trial:
            breaker.trial_in_flight = False
        return await _await_other_driver(store, current, spec)
    # Attempts since the human's ruling, if any, count against the tool's bound.
    spent = current.attempts - answered
    return await _run_claimed(store, spec, claimed, args, tctx, breaker, recording, spent)


async def _run_claimed(
    store: NodeStore,
    spec: ToolSpec,
    current: ToolCall,
    args: BaseModel,
    tctx: ToolContext,
    breaker: Breaker,
    recording: Recording,
    spent: int = 0,
) -> ToolCall:
    """Run the handler of a call whose attempt this driver has counted, and record it;
    ``spent``: attempts earlier drives made (see :func:`run_handler`)."""
    # On cancellation (user cancel, timeout, shutdown) the row stays `running` with its
    # attempt counted: a restart applies the rules above; a run that ends instead
    # closes it with interrupt_running_calls.
    retrying = _Attempts(store, current)
    try:
        failpoints.hit("tool.before", spec.name)
        ran = await run_handler(spec, args, tctx, retrying, spent)
    except BaseException:
        breaker.trial_in_flight = False  # cancelled: says nothing about the tool
        raise
    status, output, error = ran.status, ran.output, ran.error
    breaker.record(unavailable=(error or {}).get("code") == Code.TOOL_UNAVAILABLE)
    failpoints.hit("tool.after", spec.name)
    if (
        status == "failed"
        and error is not None
        and error.get("code") == Code.TOOL_UNAVAILABLE
        and spec.side_effect
        and not spec.idempotent
    ):
        # Timed out, or given up on by its own handler: work it started may still land
        # (a thread, a request in flight), and this answer is final (the call is not
        # run again under its key), as after a cancel: ``cut_off``.
        known, found, failure = await final_answer(spec, args, tctx, current.tool_call_id)
        if found is not None:
            status, output, error = "succeeded", found, None
        elif known:
            error = {**error, "message": f"{error['message']}; it took no effect"}
            error["took_effect"] = False
        else:
            # Nobody can tell (no reconcile, or it failed): the effect may have happened.
            # Not left running either: the next drive would run the handler again.
            status = "unknown"
            why = "" if failure is None else f"; {RECONCILE_FAILED}{failure}"
            error = {
                "code": Code.TOOL_OUTCOME_UNKNOWN,
                "message": f"{error['message']}; the effect may have happened{why}",
            }
    # Once the handler has returned, its outcome must reach the ledger, and before a
    # cancellation goes on: a cancel then settles the calls it finds still running. A
    # database blip meanwhile must not lose it (see runtime.recording).
    latest = retrying.row
    finished = Finished(current.run_id, latest.attempts, status, output, error)
    return await to_the_end(_record(store, latest, finished, tctx, recording))


class _Attempts:
    """A call's retries on record (:class:`runtime.attempts.Retrying`), under the lease:
    ``row`` is the ledger row as the last write left it."""

    def __init__(self, store: NodeStore, row: ToolCall) -> None:
        self.store = store
        self.row = row

    async def failed(self, failure: dict[str, Any]) -> None:
        entry = {**failure, "attempt": self.row.attempts}
        row = self.row
        self.row = await self.store.update_tool_call(
            row.tool_call_id, retried=[*row.retried, entry]
        )
        if self.row.status != "running":  # under the lease, nobody else closes it
            raise RuntimeError(f"{row.tool_call_id} was closed by another driver")

    async def again(self) -> None:
        row = self.row
        claimed = await self.store.claim_tool_call(row.tool_call_id, row.attempts)
        if claimed is None:  # under the lease, no other driver claims it
            raise RuntimeError(f"{row.tool_call_id} was claimed by another driver")
        self.row = claimed


async def _record(
    store: NodeStore, row: ToolCall, done: Finished, tctx: ToolContext, recording: Recording
) -> ToolCall:
    """Record the outcome of a handler that ran: tried again through a database blip,
    kept by the engine for its next drive of the run where it still cannot be."""
    return await recording.outcome(
        row.tool_call_id, done, lambda: write_outcome(store, row, done, tctx.artifacts)
    )


def write_outcome(
    store: NodeStore, row: ToolCall, done: Finished, artifacts: ArtifactSink
) -> Awaitable[ToolCall]:
    """One write of ``done``, the outcome of ``row``'s handler (its artifact first)."""
    return _finish(store, row, done.status, done.output, done.error, artifacts)
