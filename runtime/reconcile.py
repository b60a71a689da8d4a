"""Asking the real system what became of a call: a tool's ``reconcile``, bounded.

A call whose outcome was not recorded (its drive stopped mid-handler, or a cancel
cut it off) is settled by the tool's own answer where it has one, never by a guess.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic import BaseModel

from runtime import failpoints
from runtime.dberrors import ServiceUnavailable
from runtime.events import summarize
from runtime.scrubbing import scrub, secret_values
from runtime.tooling import ToolContext, ToolSpec

log = logging.getLogger(__name__)


class ReconcileFailed(Exception):
    """A tool's reconcile raised; its message has the secret args' values scrubbed."""


class ReconcileUnanswered(ConnectionError):
    """A tool's reconcile gave no answer within the tool's timeout: as transient as a
    database that does not answer (the drive is retried), and not a ``TimeoutError``,
    which out of a graph means the run's own time budget ran out."""

    def __init__(self, message: str, tool_call_id: str) -> None:
        super().__init__(message)
        self.tool_call_id = tool_call_id
        """The call whose outcome is still unknown."""


async def reconcile(spec: ToolSpec, args: BaseModel, tctx: ToolContext) -> Any | None:
    assert spec.reconcile is not None
    failpoints.hit("reconcile", spec.name)
    try:
        return await spec.reconcile(args, tctx)
    except Exception as exc:
        secrets = secret_values(spec, args)
        if not secrets:
            raise
        if isinstance(exc, ServiceUnavailable):  # still ours, not the tool's
            raise ServiceUnavailable(scrub(str(exc), secrets)) from None
        # The drive fails with this message and logs it; the original would carry the
        # values in its text and traceback.
        raise ReconcileFailed(f"{spec.ref} reconcile: {scrub(repr(exc), secrets)}") from None


async def reconcile_in_time(spec: ToolSpec, args: BaseModel, tctx: ToolContext) -> Any | None:
    """:func:`reconcile` within the tool's timeout, or :class:`ReconcileUnanswered`."""
    try:
        return await asyncio.wait_for(reconcile(spec, args, tctx), spec.timeout_s)
    except TimeoutError:
        raise ReconcileUnanswered(
            f"{spec.ref} reconcile did not answer within {spec.timeout_s}s", tctx.tool_call_id
        ) from None


class FinalAnswer(NamedTuple):
    """What ``reconcile`` said of a call cut off."""

    known: bool
    """Whether it could tell: False without a reconcile, or where it failed or hung."""
    found: Any = None
    """The effect's output where it took place (None: it did not, or nobody knows)."""
    failure: str | None = None
    """Why a reconcile that was asked could not tell, for the record (scrubbed)."""


async def final_answer(
    spec: ToolSpec, args: BaseModel, tctx: ToolContext, tool_call_id: str
) -> FinalAnswer:
    """Ask ``reconcile`` about a call cut off (``cut_off`` set: the answer is final),
    within the tool's timeout. Unknown where nobody can tell (no reconcile, or it failed
    or hung: a system that is down must not hold the run up)."""
    if spec.reconcile is None:
        return FinalAnswer(known=False)
    try:
        found = await reconcile_in_time(spec, args, replace(tctx, cut_off=True))
    except Exception as exc:
        log.warning("reconcile of cut-off call %s failed: %r", tool_call_id, exc)
        # reconcile() scrubbed the secret args' values from what it raises.
        return FinalAnswer(known=False, failure=summarize(str(exc) or repr(exc)))
    return FinalAnswer(known=True, found=found)
