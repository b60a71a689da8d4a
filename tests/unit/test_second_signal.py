"""A second SIGTERM or SIGINT ends the shutdown's grace, whenever it lands: before
the app has started too (its services did not exist yet, and it was lost)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import pytest
import uvicorn

from runtime.model import RunCreate
from server.app import create_app
from server.serving import Server
from server.settings import Settings
from tests.integration.server_proc import wait_for_file

GRACE_S = 60.0


@pytest.mark.parametrize("when", ["before_startup", "after_startup"])
async def test_a_second_signal_hurries_the_shutdown(tmp_path: Path, when: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(
        data_dir=data,
        database_url=f"sqlite:///{tmp_path / 'rt.db'}",
        extra_agents=["tests.agents:build_agents"],
        shutdown_grace_s=GRACE_S,
        lease_seconds=600,
    )
    app = create_app(settings)
    config = uvicorn.Config(app, lifespan="on", log_level="warning")
    config.load()
    server = Server(config, app)
    server.lifespan = config.lifespan_class(config)  # as uvicorn's serve does
    sock = socket.create_server(("127.0.0.1", 0))
    if when == "before_startup":  # two TERMs while the process is still starting
        server.handle_exit(signal.SIGTERM, None)
        server.handle_exit(signal.SIGTERM, None)
    await server.startup(sockets=[sock])
    engine = app.state.services.engine
    await engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 100"))
    await asyncio.to_thread(wait_for_file, data / "sleep.log")  # a drive inside its tool
    if when == "after_startup":
        server.handle_exit(signal.SIGTERM, None)
        server.handle_exit(signal.SIGTERM, None)
        await asyncio.sleep(0.1)  # the hurry is called soon, from the signal handler
    started = time.monotonic()
    await server.shutdown(sockets=[sock])
    assert time.monotonic() - started < GRACE_S / 2, "the grace was waited out"
