"""A `worker` process's own counters, on its own port (``--metrics-port``): a scraper
holding the metrics token reads them; nobody else does; SIGTERM still stops the worker
gracefully with the port open."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Processes, state_is
from tests.integration.scale_out import QUICK_EXIT, create_run, wait_until
from tests.integration.server_proc import (
    ServerProcess,
    WorkerProcess,
    answers,
    free_port,
    worker_started,
)

pytestmark = pytest.mark.postgres


def scrape(port: int, token: str | None) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=10)


def test_a_worker_serves_its_own_metrics_to_the_scraper_only(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    port = free_port()
    worker = processes.add(
        metrics_worker(data_dir, pg_schema_url, port, AGENT_RUNTIME_METRICS_TOKEN="scrape")
    ).start()
    wait_until(lambda: serving(port), 10, "the worker's port")
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 0")
        server.follow(run_id, state_is("succeeded", "failed"), timeout=60)
    wait_until(
        lambda: "agent_runtime_drives_started_total 1" in scrape(port, "scrape").text.splitlines(),
        10,
        "the worker's drive in its metrics",
    )
    lines = scrape(port, "scrape").text.splitlines()
    assert 'agent_runtime_drives_ended_total{how="stopped"} 1' in lines
    assert "agent_runtime_drives_in_flight 0" in lines
    for token in (None, "wrong"):
        refused = scrape(port, token)
        assert refused.status_code == 401
        assert refused.headers["content-type"] == "application/problem+json"
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json() == {"status": "ok"}
    # Only the probes: the API is the server's.
    assert httpx.get(f"http://127.0.0.1:{port}/runs", timeout=10).status_code == 404

    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(15) == 0


def test_without_the_token_setting_a_workers_metrics_are_not_served(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    """(With an API authentication setting a server would refuse: a worker serves no
    API, so its probes do not care.)"""
    port = free_port()
    processes.add(
        metrics_worker(data_dir, pg_schema_url, port, AGENT_RUNTIME_JWT_HS256_SECRET="short")
    ).start()
    wait_until(lambda: serving(port), 10, "the worker's port")
    assert scrape(port, "anything").status_code == 404


def serving(port: int) -> bool:
    return answers(f"http://127.0.0.1:{port}/healthz")


def metrics_worker(data_dir: Path, url: str, port: int, **env: str) -> WorkerProcess:
    """A worker serving its probes on ``port``, quick to exit, with ``env``."""
    worker = WorkerProcess(data_dir, url, args=("--metrics-port", str(port)), **QUICK_EXIT)
    worker.env.update(env)
    return worker


def test_a_worker_whose_metrics_port_is_taken_does_not_start(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        worker = processes.add(
            WorkerProcess(data_dir, pg_schema_url, args=("--metrics-port", str(port)))
        ).start(wait=False)
        assert worker.proc is not None
        assert worker.proc.wait(30) == 2  # a start refused, as every other (README)
    assert f"cannot serve metrics on 127.0.0.1:{port}" in worker.log_text()
    assert not any(map(worker_started, worker.log_text().splitlines()))  # it claimed nothing
