"""``Prefer: wait=N`` (RFC 7240): answer with the run once it has settled, or after N s.

A client that only needs the outcome (a script, a batch job, the way LangGraph's own
``runs/wait`` is used) asks ``POST /runs`` or ``GET /runs/{id}`` to hold the response
until the run is parked for a human or has ended, instead of following its event
stream. The wait is bounded by the server (``max_wait_s``), and a waiting request holds
one of its caller's stream slots: it holds a connection just as a stream does. When the
time is up the run is returned as it is then: the caller sees its state and asks again.
A preference we cannot read is ignored, as RFC 7240 says.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from runtime.errors import Code, RuntimeProblem
from runtime.lifecycle import TERMINAL
from runtime.model import Run
from server.api.deps import Services
from server.auth import Principal

_WAIT = re.compile(r'\s*wait\s*=\s*"?([0-9]{1,9})"?\s*', re.IGNORECASE)


def wait_preference(prefer: str | None, most: float) -> int | None:
    """Seconds to wait from a ``Prefer`` header (at most ``most``), or None if not asked."""
    if not prefer:
        return None
    for preference in prefer.split(","):
        match = _WAIT.fullmatch(preference.split(";", 1)[0])
        if match:
            return min(int(match.group(1)), int(most))
    return None


def applied(wait_s: int) -> dict[str, str]:
    """Headers of a response that honoured ``Prefer: wait``."""
    return {"Preference-Applied": f"wait={wait_s}", "Vary": "Prefer"}


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


async def settled(services: Services, run: Run, wait_s: int) -> Run:
    """The run once it is parked or final, or as it is after ``wait_s`` seconds.
    The caller holds a :func:`wait_slot`."""
    if run.state in TERMINAL or wait_s == 0:
        return run
    try:
        return await services.engine.wait_settled(run.run_id, within_s=wait_s)
    except TimeoutError:
        now = await services.store.get_run(run.run_id)
        if now is None:  # pruned while we waited
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run.run_id}") from None
        return now
