"""What becomes of a run whose drive ended on a database error, or lost its worker.

A blip (a failover, a dropped connection) is retried, later and later, by whichever
worker claims the run then. A failure that lasts (a full disk, a checkpoint the
database keeps refusing) would re-drive the run forever: the ``max_failures``-th
failed drive in a row ends it with CHECKPOINT_ERROR instead (DESIGN §8: state that
cannot be persisted executes no further side effect), or TOOL_OUTCOME_UNKNOWN where
what failed each drive was a tool that never said what became of a call.

A worker that dies (or stalls past its lease) mid-drive is replaced: the next one takes
the run over from its checkpoint. A run that kills each worker it meets (a tool that
runs the process out of memory, a native crash) would take the fleet down one worker
after another: at the ``max_takeovers``-th takeover in a row with no step checkpointed
in between it is a suspect, driven by a worker alone (``LeaseQueries.claim_suspect``);
killing that one too, it fails with RUN_CRASH_LOOP instead of being driven again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pydantic import ValidationError

from runtime.adapter import fail_run, failure_trigger
from runtime.cancelling import CallSetting, CutOff, fail_cut_off
from runtime.dberrors import DATABASE_ERRORS
from runtime.errors import Code
from runtime.model import problems_of
from runtime.reconcile import ReconcileUnanswered
from runtime.store.base import DriveStart, LeaseLost, RunStore

log = logging.getLogger("runtime.engine")


@dataclass(frozen=True)
class DriveRetry:
    max_failures: int = 5
    """Drives in a row that may fail before the run does."""
    base_s: float = 1.0
    """The wait before the first retry; doubled for each further one."""
    max_s: float = 60.0
    """The longest wait between two drives."""
    max_takeovers: int = 3
    """Takeovers in a row (leases that expired unreleased, with no step checkpointed in
    between) that make a run a suspect; one more, and it fails."""

    def delay(self, failures: int) -> float:
        """The wait before driving the run again after its ``failures``-th failed drive."""
        # (The exponent bounded: a cancel's drive is never given up on, and a float
        # overflows past 2**1023, which failed a drive a day's outage in.)
        return float(min(self.base_s * 2.0 ** min(failures - 1, 64), self.max_s))


async def after_failed_drive(
    store: RunStore,
    run_id: str,
    failures: int,
    exc: BaseException,
    retry: DriveRetry,
    *,
    give_up: bool = True,
) -> float | None:
    """The drive (the ``failures``-th in a row) ended on ``exc``, a database error: when
    to drive the run again, or None once it is failed. Without ``give_up`` (a drive
    carrying out a cancel: failing the run otherwise would lose the cancel, and any
    compensation asked for) it is retried at the longest wait instead."""
    what = "no answer from a tool" if isinstance(exc, ReconcileUnanswered) else "database error"
    if failures < retry.max_failures or not give_up:
        delay = retry.delay(failures)
        log.error(
            "%s while driving %s (%d in a row); retrying in %.1fs",
            what, run_id, failures, delay, exc_info=exc,
        )  # fmt: skip
        return delay
    log.error(
        "%s while driving %s, %d in a row: failing the run",
        what, run_id, failures, exc_info=exc,
    )  # fmt: skip
    code, call = Code.CHECKPOINT_ERROR, None
    message = f"{failures} drives in a row could not persist the run's state: {exc!r}"
    if isinstance(exc, ReconcileUnanswered):
        # Not the database: the tool never said what became of a call a drive that
        # stopped left running. Its effect is a human's to find out.
        code, call = Code.TOOL_OUTCOME_UNKNOWN, exc.tool_call_id
        message = (
            f"{failures} drives in a row could not learn what call {call} did ({exc}); "
            "its outcome is unknown"
        )
    try:
        await fail_run(store, run_id, code, message, tool_call_id=call)
    except LeaseLost:
        return _lease_lost(run_id, failures, retry)
    except Exception as unrecorded:
        if isinstance(unrecorded, DATABASE_ERRORS):
            # The database (or the connection) still failing: not what makes it last.
            log.exception("could not record the failure of %s; handing it back", run_id)
            return retry.delay(failures)
        # Were it handed back, every drive from now on would fail it, and fail to.
        log.exception("could not record the failure of %s; failing it unread", run_id)
        try:
            await fail_unrecorded(store, run_id, code, message, unrecorded)
        except LeaseLost:
            return _lease_lost(run_id, failures, retry)
        except Exception:
            log.exception("could not fail %s unread either; handing it back", run_id)
            return retry.delay(failures)
    return None


async def after_broken_drive(
    store: RunStore,
    run_id: str,
    exc: Exception,
    failures: int | None,
    made: bool,
    retry: DriveRetry,
    carries_cancel: bool,
) -> tuple[float | None, int | None] | None:
    """The drive ended on ``exc``, not a database's error: the run fails with it. Returns
    when to drive it again (None: it has ended) and its failed drives in a row as they
    now stand, or None where the lease moved on meanwhile (not ours to record).

    ``failures``: the drives before this one that failed, as the drive read them;
    ``made``: the drive moved the run on; ``carries_cancel``: it carried out a cancel."""
    try:
        await fail_run(store, run_id, Code.INTERNAL_ERROR, named(exc))
    except LeaseLost:
        return None
    except Exception as unrecorded:
        # The same error may fail every drive from now on, and its record with it (a row
        # that no longer validates): counted as a database error's drive is, and at the
        # limit the run is failed without reading it. A cancel's own drive is not
        # retried: it ends the run as cancelled now.
        if failures is None:
            failures = await _stored_failures(store, run_id)
        if made:
            failures = 1
        elif failures is not None:
            failures += 1
        give_up = carries_cancel or (failures or 1) >= retry.max_failures
        # (Not where recording failed on the database: a blip, or a connection's own
        # trouble, may be all it was.)
        if not give_up or isinstance(unrecorded, DATABASE_ERRORS):
            log.exception(
                "could not record the failure of %s (%d in a row); handing it back",
                run_id, failures or 1,
            )  # fmt: skip
            return retry.delay(failures or 1), failures
        log.exception("could not record the failure of %s; failing it unread", run_id)
        try:
            message = f"the drive failed: {named(exc)}"
            await fail_unrecorded(store, run_id, Code.INTERNAL_ERROR, message, unrecorded)
        except LeaseLost:
            return None
        except Exception:
            log.exception("could not fail %s unread either; handing it back", run_id)
            return retry.delay(failures or 1), failures
    return None, failures


async def _stored_failures(store: RunStore, run_id: str) -> int | None:
    """The run's failed drives in a row, as stored, for a drive that could not read its
    run (None: not even that; the release then counts one more)."""
    try:
        lease = await store.lease_of(run_id)
    except Exception:
        return None
    return None if lease is None else int(lease["drive_failures"])


def _lease_lost(run_id: str, failures: int, retry: DriveRetry) -> float:
    """Another worker took the run while this one failed it: routine, not an error (no
    traceback). Handed back as after any failed drive: the release finds the lease gone."""
    log.warning("lost the lease on %s while failing it; another worker drives it now", run_id)
    return retry.delay(failures)


async def fail_unrecorded(
    store: RunStore, run_id: str, code: Code, message: str, unrecorded: BaseException
) -> None:
    """The last resort of a drive whose failure (``code``, ``message``) ``fail_run``
    could not record, raising ``unrecorded`` (a ledger row, say, whose stored value no
    longer validates: the run's next drive would fail on it too, and fail to record
    that). The run ends failed by :meth:`RunStore.fail_unread`, which reads none of its
    rows: its outcome lists every side-effecting call as one that may have happened.

    A cancel asked for ends it as the cancel would have (RUN_CANCELLED, the cancel's
    reason), saying what could not be done: what failed, and any compensation asked
    for, which is not run."""
    try:
        cancel = await store.cancel_requested(run_id)
    except Exception:  # not this read's to stop the run from ending
        log.warning("could not read whether %s is being cancelled", run_id, exc_info=True)
        cancel = None
    if cancel is not None:
        reason, compensate = cancel
        message = f"{reason or 'cancelled'}; the cancel could not be carried out: {message}"
        if compensate:
            message += "; the compensation it asked for may not have run (see compensations)"
        code = Code.RUN_CANCELLED
    failed = named(unrecorded)
    message += (
        "; recording that failed on it too"
        if failed in message
        else f"; recording that failed too: {failed}"
    )
    ended = code
    if await store.fail_unread(run_id, ended, message, lambda now: failure_trigger(ended, now)):
        log.error("run %s failed, unread: %s", run_id, message)


def named(exc: BaseException, most: int = 500) -> str:
    """``exc`` for a run's outcome: its type and its text on one line, at most ``most``
    characters of it; a validation error's without the values it quotes (a stored
    row's: a secret argument's among them, which the audit surface hides)."""
    if isinstance(exc, ValidationError):
        text = f"{exc.title}: {'; '.join(problems_of(exc))}"
    else:
        text = " ".join(str(exc).split())
    if len(text) > most:
        text = text[: most - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def fail_crash_loop(
    store: RunStore, setting: CallSetting, found: DriveStart, cut: CutOff, *, ask_tools: bool
) -> None:
    """End a run taken over ``found.takeovers`` times in a row without moving on, the
    last from a worker it had to itself, rather than run what its drives were doing
    when their workers died once more.

    ``cut``: where its checkpoint has it. The calls left running are settled as a
    cancel's are (asked of the real system where the tool can say), then closed; not
    asked without ``ask_tools`` (a drive failing the run died while it asked: the
    tool's own reconcile may be what kills workers), their effects then unknown."""
    run = found.run
    message = (
        f"{found.takeovers} workers in a row stopped driving the run (the last: "
        f"{found.taken_from}, which drove nothing else) before it checkpointed a step: "
        "it is not driven again"
    )
    if found.cancel is not None and found.cancel[1]:
        message += "; the compensation its cancel asked for was not run"
    log.error("run %s failed: %s", run.run_id, message)
    settling = message
    if not ask_tools:
        message += "; its tools were not asked what its running calls did"
    await fail_cut_off(
        store,
        setting,
        run,
        cut,
        Code.RUN_CRASH_LOOP,
        message,
        settling=settling,
        ask_tools=ask_tools,
    )
