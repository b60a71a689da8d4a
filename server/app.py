"""The FastAPI application: wires agents, the store and the engine; serves the API."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI

from runtime.agent import AgentSpec
from server.api import openapi, problems
from server.api.deps import Services
from server.api.head import HeadAsGet
from server.api.limits import RequestLimits
from server.api.routes import approvals, audit, memory, probes, runs, system
from server.auth.authenticate import Authenticator
from server.auth.bootstrap import ensure_local_keys
from server.host import open_host
from server.settings import Settings

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    agents: Mapping[str, AgentSpec] | None = None,
    *,
    run_worker: bool = True,
) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_host(settings, agents, run_worker=run_worker) as host:
            if settings.bootstraps_local_keys:
                await ensure_local_keys(host.store, settings.data_dir)
            auth = Authenticator(settings, host.store)
            app.state.services = Services(
                settings, host.store, host.engine, host.bus, auth, worker=host.worker
            )
            yield

    app = FastAPI(
        title="agent-runtime",
        version="0.1.0",
        description="Durable, auditable runs of enterprise LLM agents on LangGraph.",
        lifespan=lifespan,
        # No 307 from /memory/ to /memory: a client that follows it (most do, DELETE
        # included) would erase every memory of the user, not the item it named; and
        # its Location would echo the request's Host. A path we do not serve is a 404.
        redirect_slashes=False,
    )
    problems.install(app)
    openapi.install(app)

    routers = [
        runs.router,
        approvals.router,
        memory.router,
        audit.router,
        system.router,
        probes.router,
    ]
    app.add_middleware(
        RequestLimits,
        max_bytes=settings.max_body_bytes,
        max_depth=settings.max_json_depth,
        routers=routers,
    )
    app.add_middleware(HeadAsGet)  # outermost of ours: limits and routes see a GET
    for router in routers:
        app.include_router(router)
    return app
