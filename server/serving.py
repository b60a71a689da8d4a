"""``agent-runtime serve``: the app under uvicorn, told when shutdown begins."""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from server.api.trace import LogGone
from server.settings import Settings
from server.wire import PROTOCOLS

logger = logging.getLogger("uvicorn.error")


class PrunedTraceIsNoError(logging.Filter):
    """A trace cut off because retention pruned its run (:class:`LogGone`, raised mid-
    body to drop the connection) is logged as one warning line: uvicorn logged it as an
    ERROR with a traceback, as it does an app's bug, where nothing is wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, LogGone):
            record.msg, record.args = f"trace cut off: {exc}", ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_pruned_traces() -> None:
    """After uvicorn has configured its logging (a ``uvicorn.Config`` does)."""
    errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, PrunedTraceIsNoError) for f in errors.filters):
        errors.addFilter(PrunedTraceIsNoError())


class Server(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown begins: requests waiting on a
    run (``Prefer: wait``) answer then with the run as it is, and event streams end
    (their clients reconnect with Last-Event-ID), instead of holding the process for
    the grace period and ending in a 500 and a traceback."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        again = self.should_exit
        super().handle_exit(sig, frame)
        if again:
            # A second signal, SIGTERM as well as uvicorn's SIGINT: stop now. Requests
            # are no longer waited for, and the worker's grace ends: its drives hand
            # their runs back from their checkpoints at once, as when the grace runs out.
            self.force_exit = True
            if self._loop is not None:  # (a signal handler: the loop's thread, not in it)
                self._loop.call_soon_threadsafe(self._hurry)

    def _hurry(self) -> None:
        logger.warning("a second signal: stopping now; runs in flight are handed back")
        services = getattr(self.app.state, "services", None)
        if services is not None and services.worker is not None:
            services.worker.hurry()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and sockets:
            # uvicorn says where it listens only for a socket it bound itself.
            self._log_started_message(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        services = getattr(self.app.state, "services", None)
        if services is not None:  # None if it stops before the app has started
            # The waits wake once uvicorn has closed the listeners and marked every
            # connection to close: their answers say Connection: close.
            services.stopping.set()
            services.bus.publish_all()  # every event stream looks at it
            if services.worker is not None:  # its grace and the requests' run together
                services.worker.begin_stop(services.settings.shutdown_grace_s)
                if self.force_exit:  # signalled twice before the app had started
                    services.worker.hurry()
        await super().shutdown(sockets)
        shut = getattr(self.lifespan, "shutdown_event", None)
        if self.force_exit and shut is not None and not shut.is_set():
            # uvicorn skips the app's shutdown when forced; ours hands the runs back and
            # closes the database, which is quick once hurried.
            await self.lifespan.shutdown()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a port taken is said in one
    line, before the app's start has claimed any run (uvicorn binds after it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def serve(app: FastAPI, settings: Settings, listener: socket.socket) -> bool:
    """Run until shut down; False if it could not start (uvicorn has logged why),
    which uvicorn would end with exit 3, our "parked" elsewhere."""
    host, port = listener.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        **PROTOCOLS,
    )
    quiet_pruned_traces()
    try:
        Server(config, app).run(sockets=[listener])
    except KeyboardInterrupt:  # Ctrl-C: uvicorn re-raises it once done
        pass
    except SystemExit as exc:
        if exc.code != STARTUP_FAILURE:
            raise
        return False
    return True
