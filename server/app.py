"""The FastAPI application: wires agents, the store and the engine; serves the API."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from runtime.agent import AgentSpec
from runtime.backend import open_backend
from runtime.engine import Engine
from runtime.errors import Code
from runtime.eventbus import EventBus
from server.agents import load_agents
from server.api import problems
from server.api.deps import Services
from server.api.routes import approvals, runs, system
from server.settings import Settings

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None, agents: Mapping[str, AgentSpec] | None = None
) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        backend = await open_backend(settings.resolved_database_url)
        bus = EventBus()
        backend.store.add_listener(bus.publish)
        hosted = dict(agents) if agents is not None else load_agents(settings)
        engine = Engine(
            backend.store,
            backend.checkpointer,
            hosted,
            default_agent=settings.default_agent,
            maxima=settings.maxima(),
        )
        app.state.services = Services(settings, backend.store, engine, bus)
        resumed = await engine.recover()
        if resumed:
            log.info("resuming %d run(s) from their checkpoints", len(resumed))
        try:
            yield
        finally:
            await engine.shutdown()
            await backend.close()

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
