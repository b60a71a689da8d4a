"""What a scraper and a liveness probe read: served by `serve` and, with
``--metrics-port``, by each `worker` (whose counters live in its own process)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import PlainTextResponse

from runtime.dberrors import DATABASE_ERRORS, unavailable
from runtime.engine import Engine
from runtime.errors import Code, RuntimeProblem
from runtime.store.base import RunStore
from server.api.openapi import EVERY_REQUEST, problem_responses
from server.auth.authenticate import one_authorization, unauthenticated
from server.settings import Settings

router = APIRouter()
log = logging.getLogger(__name__)

COUNT_WITHIN_S = 2.0
"""How long a scrape waits for the database's count of runs before it goes without."""


class Counts(Protocol):
    """What the probes read: the API's services, or a worker's (``server.worker_http``)."""

    settings: Settings
    store: RunStore
    engine: Engine


def get_counts(request: Request) -> Counts:
    counts: Counts = request.app.state.services
    return counts


CountsDep = Annotated[Counts, Depends(get_counts)]


@router.get(
    "/metrics",
    tags=["health"],
    response_class=PlainTextResponse,
    responses={
        # A token of its own, not a principal's; NOT_FOUND: no token is configured.
        **problem_responses(*EVERY_REQUEST, Code.UNAUTHENTICATED, Code.NOT_FOUND, Code.UNAVAILABLE),
        200: {"content": {"text/plain": {}}},
    },
)
async def metrics(
    services: CountsDep,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,  # (documented; read raw below)
) -> str:
    """Prometheus' text format, for a scraper holding ``AGENT_RUNTIME_METRICS_TOKEN``."""
    expected = services.settings.metrics_token
    if expected is None or not expected.get_secret_value():
        raise RuntimeProblem(Code.NOT_FOUND, "metrics are not enabled on this server")
    scheme, _, presented = (one_authorization(request) or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), expected.get_secret_value().encode()
    ):
        raise unauthenticated("GET /metrics needs the metrics token")
    engine = services.engine
    gauges: dict[str, list[tuple[dict[str, str], float]]] = {
        "drives_in_flight": [({}, engine.running())]
    }
    try:
        # An outage must not cost the scrape (and its alerts) the process's counters,
        # nor hold it for the pool's 30 s wait.
        async with asyncio.timeout(COUNT_WITHIN_S):
            live = await services.store.count_live_runs()
    except (TimeoutError, *DATABASE_ERRORS) as exc:
        if isinstance(exc, TimeoutError) or unavailable(exc):
            log.warning("metrics served without the runs' counts: %r", exc)
        else:  # our SQL, or a schema not migrated: a bug to see, not an outage
            log.exception("metrics served without the runs' counts: the count failed")
        gauges["database_up"] = [({}, 0)]
    else:
        gauges["database_up"] = [({}, 1)]
        gauges["runs"] = [({"state": state}, n) for state, n in live.items()]
    return engine.metrics.render(gauges)


@router.get("/healthz", tags=["health"], responses=problem_responses(*EVERY_REQUEST))
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
