"""A `worker`'s own HTTP for ``GET /metrics`` and ``GET /healthz`` (``--metrics-port``):
its counters (drives, lease losses, the frozen sessions it ended) live in its process,
where no `serve` can read them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from runtime.engine import Engine
from runtime.store.base import RunStore
from server import serving
from server.api import problems
from server.api.routes import probes
from server.settings import Settings
from server.wire import PROTOCOLS

log = logging.getLogger(__name__)


@dataclass
class Counted:
    """What the probes read (``server.api.routes.probes.Counts``), without the API's
    authentication, which a worker does not configure."""

    settings: Settings
    store: RunStore
    engine: Engine


def probe_app(settings: Settings, store: RunStore, engine: Engine) -> FastAPI:
    app = FastAPI(title="agent-runtime worker", openapi_url=None, docs_url=None, redoc_url=None)
    problems.install(app)
    app.state.services = Counted(settings, store, engine)
    app.include_router(probes.router)
    return app


def listen(bind: str, port: int) -> socket.socket:
    """The probes' socket, bound before the worker claims anything: a port taken is a
    start-up error, not a worker running without the metrics it was asked for."""
    try:
        return serving.bind(bind, port)
    except OSError as exc:
        # Exit 2, as every server start refused (1 is a failed run for the client commands).
        print(
            f"agent-runtime worker: cannot serve metrics on {bind}:{port}: {exc.strerror}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The worker's handlers take SIGTERM and SIGINT and stop this server themselves.
        yield


class ProbeServer:
    """Serves from the worker's start to its stop, on the worker's event loop; if it
    fails meanwhile, it says so and stops the worker (``on_failure``), which was asked
    to be observable."""

    def __init__(
        self, app: FastAPI, sock: socket.socket, log_level: str, on_failure: Callable[[], None]
    ) -> None:
        config = uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="off",
            **PROTOCOLS,
            timeout_graceful_shutdown=1,  # a scrape in flight does not hold the worker's stop
        )
        self._server = _Server(config)
        self._on_failure = on_failure
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="probes")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._server.should_exit:
            return  # stopped, as asked
        exc = None if task.cancelled() else task.exception()
        log.error("the metrics server stopped on its own (%r); stopping the worker", exc)
        self._on_failure()

    async def stop(self) -> None:
        self._server.should_exit = True
        with contextlib.suppress(Exception):  # a failure was logged as it happened
            await self._task
