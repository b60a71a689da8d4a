"""A `worker`'s own HTTP for ``GET /metrics`` and ``GET /healthz`` (``--metrics-port``):
its counters (drives, lease losses, frozen sessions it ended) live in its process,
where no `serve` can read them."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from server.api import problems
from server.api.deps import Services
from server.api.routes import probes
from server.auth.authenticate import Authenticator
from server.host import Host
from server.wire import ProblemHttpToolsProtocol


def probe_app(host: Host) -> FastAPI:
    app = FastAPI(title="agent-runtime worker", openapi_url=None, docs_url=None, redoc_url=None)
    problems.install(app)
    auth = Authenticator(host.settings, host.store)  # unused: /metrics has its own token
    app.state.services = Services(host.settings, host.store, host.engine, host.bus, auth)
    app.include_router(probes.router)
    return app


async def serve_probes(host: Host, bind: str, port: int) -> None:
    """Until SIGTERM or SIGINT: uvicorn takes them while it serves and raises them again
    once it has stopped, for the worker's own handlers."""
    config = uvicorn.Config(
        probe_app(host),
        host=bind,
        port=port,
        log_level=host.settings.log_level,
        lifespan="off",
        http=ProblemHttpToolsProtocol,
        ws="none",
    )
    await uvicorn.Server(config).serve()
