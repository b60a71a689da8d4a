"""Running a tool's handler: its timeout, and bounded retries of transient faults."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from runtime.dberrors import ServiceUnavailable
from runtime.errors import Code
from runtime.events import summarize
from runtime.scrubbing import scrub, secret_values
from runtime.tooling import ToolBusinessError, ToolContext, ToolSpec, ToolUnavailable

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 2.0


@dataclass
class HandlerRun:
    """What a handler's attempts came to, after bounded retries of transient faults."""

    status: str
    output: Any
    error: dict[str, Any] | None


class Retrying(Protocol):
    """How a handler's retries reach the ledger: each failure as it happens, each
    further attempt as it starts, so that a call cut off anywhere between two attempts
    (in its backoff, say) keeps both on record."""

    async def failed(self, failure: dict[str, Any]) -> None:
        """Record why the attempt just made failed (``code``, ``message``)."""

    async def again(self) -> None:
        """Count the next attempt, about to start."""


async def run_handler(
    spec: ToolSpec, args: BaseModel, tctx: ToolContext, retrying: Retrying, spent: int = 0
) -> HandlerRun:
    """Run the handler, retrying transient faults (each on record through ``retrying``).

    ``spent``: attempts earlier drives made of this call. They count against the tool's
    ``max_attempts``, or every takeover would give a service that is down a whole new
    round of calls; one attempt is left whatever they were (the last was cut off, its
    outcome unknown).

    An error's message is the handler's own text, which may quote its arguments: the
    values of secret args are scrubbed from it before it reaches the ledger, events,
    the planner or the log.
    """
    # A side effect that is not idempotent is never retried blind: a timeout may
    # come after the effect. The caller reconciles or marks the outcome unknown.
    max_attempts = 1 if spec.side_effect and not spec.idempotent else spec.max_attempts
    secrets = secret_values(spec, args)
    attempt = max(0, min(spent, max_attempts - 1))
    while True:
        attempt += 1
        try:
            output = await asyncio.wait_for(spec.handler(args, tctx), spec.timeout_s)
            return HandlerRun("succeeded", output, None)
        except ToolBusinessError as exc:
            error = {"code": Code.TOOL_BUSINESS_ERROR, "message": scrub(str(exc), secrets)}
            return HandlerRun("failed", None, error)
        except (ToolUnavailable, TimeoutError) as exc:
            message = scrub(str(exc), secrets) or f"{spec.ref} timed out after {spec.timeout_s}s"
            error = {"code": Code.TOOL_UNAVAILABLE, "message": message}
            if attempt >= max_attempts:
                return HandlerRun("failed", None, error)
        except (asyncio.CancelledError, ServiceUnavailable):
            raise  # ours, not the tool's: the drive is handed back, the call left running
        except Exception as exc:
            message = scrub(repr(exc), secrets)
            if secrets:  # a traceback would print the unscrubbed message
                log.error("tool %s failed: %s", spec.ref, message)
            else:
                log.exception("tool %s failed", spec.ref)
            error = {"code": Code.TOOL_FAILED, "message": message}
            return HandlerRun("failed", None, error)
        # Outside the handler's try: a database error here is the drive's, not the tool's.
        # Bounded: a handler's text may be long, and max_attempts of them go in one event.
        await retrying.failed({**error, "message": summarize(error["message"])})
        delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (attempt - 1))
        await asyncio.sleep(delay * (0.5 + random.random()))
        await retrying.again()
