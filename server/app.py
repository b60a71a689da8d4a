"""The FastAPI application: wires agents, the store and the engine; serves the API."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from runtime.agent import AgentSpec
from runtime.errors import Code
from server.api import problems
from server.api.deps import Services
from server.api.routes import approvals, runs, system
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
            app.state.services = Services(settings, host.store, host.engine, host.bus)
            yield

    app = FastAPI(
        title="agent-runtime",
        version="0.1.0",
        description="Durable, auditable runs of enterprise LLM agents on LangGraph.",
        lifespan=lifespan,
    )
    problems.install(app)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: object) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return problems.problem_response(
                Code.PAYLOAD_TOO_LARGE,
                f"body over {settings.max_body_bytes} bytes",
                instance=request.url.path,
            )
        response: Response = await call_next(request)  # type: ignore[operator]
        return response

    app.include_router(runs.router)
    app.include_router(approvals.router)
    app.include_router(system.router)
    return app
