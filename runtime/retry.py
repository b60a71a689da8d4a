"""What becomes of a run whose drive ended on a database error.

A blip (a failover, a dropped connection) is retried, later and later, by whichever
worker claims the run then. A failure that lasts (a full disk, a checkpoint the
database keeps refusing) would re-drive the run forever: the ``max_failures``-th
failed drive in a row ends it with CHECKPOINT_ERROR instead (DESIGN §8: state that
cannot be persisted executes no further side effect).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runtime.adapter import fail_run
from runtime.errors import Code
from runtime.store.base import RunStore

log = logging.getLogger("runtime.engine")


@dataclass(frozen=True)
class DriveRetry:
    max_failures: int = 5
    """Drives in a row that may fail before the run does."""
    base_s: float = 1.0
    """The wait before the first retry; doubled for each further one."""
    max_s: float = 60.0
    """The longest wait between two drives."""

    def delay(self, failures: int) -> float:
        """The wait before driving the run again after its ``failures``-th failed drive."""
        return float(min(self.base_s * 2 ** (failures - 1), self.max_s))


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
    if failures < retry.max_failures or not give_up:
        delay = retry.delay(failures)
        log.error(
            "database error while driving %s (%d in a row); retrying in %.1fs",
            run_id, failures, delay, exc_info=exc,
        )  # fmt: skip
        return delay
    log.error(
        "database error while driving %s, %d in a row: failing the run",
        run_id, failures, exc_info=exc,
    )  # fmt: skip
    message = f"{failures} drives in a row could not persist the run's state: {exc!r}"
    try:
        await fail_run(store, run_id, Code.CHECKPOINT_ERROR, message)
    except Exception:
        log.exception("could not record the failure of %s; handing it back", run_id)
        return retry.delay(failures)
    return None
