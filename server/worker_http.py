"""A `worker`'s own HTTP for ``GET /metrics`` and ``GET /healthz`` (``--metrics-port``):
its counters (drives, lease losses, frozen sessions it ended) live in its process,
where no `serve` can read them."""

from __future__ import annotations

import socket

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


def listen(bind: str, port: int) -> socket.socket:
    """The probes' socket, bound before the worker claims anything: a port taken is a
    start-up error, not a worker running without the metrics it was asked for."""
    try:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        return socket.create_server((bind, port), family=family)
    except OSError as exc:
        raise SystemExit(f"cannot serve metrics on {bind}:{port}: {exc.strerror}") from None


async def serve_probes(host: Host, sock: socket.socket) -> None:
    """Until SIGTERM or SIGINT: uvicorn takes them while it serves and raises them again
    once it has stopped, for the worker's own handlers."""
    config = uvicorn.Config(
        probe_app(host),
        log_level=host.settings.log_level,
        lifespan="off",
        http=ProblemHttpToolsProtocol,
        ws="none",
    )
    await uvicorn.Server(config).serve(sockets=[sock])
