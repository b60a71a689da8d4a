"""``Prefer: wait=N`` (RFC 7240): answer with the run once it has settled, or after N s.

A client that only needs the outcome (a script, a batch job, the way LangGraph's own
``runs/wait`` is used) asks ``POST /runs`` or ``GET /runs/{id}`` to hold the response
until the run is parked for a human or has ended, instead of following its event
stream. The wait is bounded by the server (``max_wait_s``), and a waiting request holds
one of its caller's stream slots: it holds a connection just as a stream does, and
gives the slot back as soon as its client hangs up. When the time is up the run is
returned as it is then: the caller sees its state and asks again. A preference we
cannot read is ignored, as RFC 7240 says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator

from starlette.requests import Request

from runtime.errors import Code, RuntimeProblem
from runtime.lifecycle import TERMINAL
from runtime.model import Run
from server.api.deps import Services
from server.auth import Principal

PREFER_WAIT = (
    "`wait=N` (RFC 7240): answer once the run is parked for a human or has ended, or after"
    " N seconds (at most the server's `max_wait_s`) with the run as it is then;"
    " `Preference-Applied: wait=N` (N as capped) says the wait was applied."
)
_WAIT = re.compile(r'\s*wait\s*=\s*"?([0-9]+)"?\s*', re.IGNORECASE)
log = logging.getLogger(__name__)

VARY = {"Vary": "Prefer"}
"""On every response of a route that may honour the preference (RFC 7240 §2)."""


def wait_preference(request: Request, most: int) -> int | None:
    """Seconds to wait from the ``Prefer`` header(s) (at most ``most``), or None."""
    for header in request.headers.getlist("prefer"):
        for preference in header.split(","):
            match = _WAIT.fullmatch(preference.split(";", 1)[0])
            if match:  # a longer wait than we allow is capped, however many digits
                digits = match.group(1).lstrip("0") or "0"
                return most if len(digits) > len(str(most)) else min(int(digits), most)
    return None


def applied(wait_s: int) -> dict[str, str]:
    """Headers of a response that honoured ``Prefer: wait``."""
    return {"Preference-Applied": f"wait={wait_s}", **VARY}


@contextlib.contextmanager
def wait_slot(services: Services, principal: Principal, wait_s: int | None) -> Iterator[None]:
    """One of the caller's stream slots while a request waits (none if it does not):
    taken before a run is created, so a 429 never follows a run made anyway."""
    if not wait_s:
        yield
        return
    release = services.streams.acquire(
        (principal.tenant_id, principal.user_id), services.settings.max_streams_per_principal
    )
    try:
        yield
    finally:
        release()


async def _hung_up(request: Request) -> None:
    """Return when the client has gone (its body, if any, has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def settled(services: Services, request: Request, run: Run, wait_s: int) -> Run:
    """The run once it is parked or final, or as it is after ``wait_s`` seconds or when
    the server begins to shut down; nothing when the client hangs up (nobody reads the
    answer then). The caller holds a :func:`wait_slot`."""
    if run.state in TERMINAL or wait_s == 0:
        return run
    waiting = asyncio.ensure_future(services.engine.wait_settled(run.run_id, within_s=wait_s))
    gone = asyncio.ensure_future(_hung_up(request))
    stopping = asyncio.ensure_future(services.stopping.wait())
    try:
        done, _ = await asyncio.wait({waiting, gone, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, gone, stopping):
            task.cancel()
        await asyncio.gather(waiting, gone, stopping, return_exceptions=True)
    if waiting in done and not waiting.cancelled():
        failed = waiting.exception()
        if failed is None:
            await _still_holds(services, request)
            return waiting.result()
        if not isinstance(failed, TimeoutError):
            raise failed
    elif stopping not in done:  # the client hung up: nobody reads this answer
        return run
    await _still_holds(services, request)
    # The time is up, or the server is shutting down: the run as it is now (rather
    # than a 500 when the server's grace period ends); the client asks again.
    now = await services.store.get_run(run.run_id)
    if now is None:  # pruned while we waited
        raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run.run_id}")
    return now


async def _still_holds(services: Services, request: Request) -> None:
    """Refuse the answer of a wait whose caller's credential stopped holding meanwhile
    (a key revoked, a token expired): what was allowed when the request came stands (a
    run created, a decision made), what the run did since is not told (401). A database
    that cannot say now is a 503, as on any request."""
    await services.auth.authenticate(request.headers.get("authorization"))


def log_unanswered(what: str, failed: Exception) -> None:
    """Log a wait that ended in failure after its request did what it came for (a run
    made, a decision taken), which the response says without the wait. A refusal of
    ours (the credential gone meanwhile, the run pruned) is how such a wait may end, and
    its problem says all there is; anything else is ours to look into."""
    if isinstance(failed, RuntimeProblem) and failed.info.http_status < 500:
        log.info("waiting %s: %s (%s)", what, failed.code.value, failed.message)
    else:
        log.warning("waiting %s failed", what, exc_info=failed)


async def settled_in_slot(
    services: Services, principal: Principal, request: Request, run: Run, wait_s: int
) -> Run:
    """:func:`settled`, for a request that took no slot before: a run already parked or
    ended answers at once and holds none (nor is refused); otherwise the wait holds one
    of the caller's slots."""
    if run.state in TERMINAL:
        return run
    at_rest = await services.engine.settled_now(run.run_id)
    if at_rest is not None:
        return at_rest
    with wait_slot(services, principal, wait_s):
        return await settled(services, request, run, wait_s)
