"""A real ``agent-runtime serve`` subprocess that tests can SIGKILL and start again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.auth import OPS, TEST_JWT_SECRET

ROOT = Path(__file__).resolve().parents[2]
# The installed console script, as an operator runs it.
_SCRIPT = Path(sys.executable).with_name("agent-runtime")
AGENT_RUNTIME = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "server.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size > 0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)


def base_env(data_dir: Path, database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "AGENT_RUNTIME_DATA_DIR": str(data_dir),
        "AGENT_RUNTIME_DATABASE_URL": database_url,
        "AGENT_RUNTIME_EXTRA_AGENTS": '["tests.agents:build_agents"]',
        "AGENT_RUNTIME_LOG_LEVEL": "warning",
        # A killed process's runs are taken over when its leases expire.
        "AGENT_RUNTIME_LEASE_SECONDS": "2",
        "AGENT_RUNTIME_JWT_HS256_SECRET": TEST_JWT_SECRET,
        "AGENT_RUNTIME_BOOTSTRAP_LOCAL_KEYS": "false",
        "PYTHONPATH": str(ROOT),
    }


class _Process:
    """Signals for a child process: SIGKILL, SIGSTOP/SIGCONT, SIGTERM."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path
    env: dict[str, str]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        """``agent-runtime <args>`` with this process's env, logging to its log file."""
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [*AGENT_RUNTIME, *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush, no goodbye."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but runs no code until :meth:`resume`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # A stopped process does not act on SIGTERM until it is continued.
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class ServerProcess(_Process):
    def __init__(
        self, data_dir: Path, database_url: str, *, no_worker: bool = False, **env: str
    ) -> None:
        self.data_dir = data_dir
        self.no_worker = no_worker
        self.port = free_port()
        self.env = {**base_env(data_dir, database_url), **env}
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / f"server-{self.port}.log"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.proc = self._spawn(
            "serve", "--port", str(self.port), *(["--no-worker"] if self.no_worker else [])
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                ready = httpx.get(f"{self.base_url}/readyz", headers=OPS, timeout=1)
                if ready.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # polling for a port to open, not waiting on behaviour
        raise TimeoutError(f"server did not start: {self.log_path.read_text()[-3000:]}")

    def client(self, headers: dict[str, str] = OPS) -> httpx.Client:
        """A client that calls as ``headers`` say: the runs' own user (OPS) by default."""
        return httpx.Client(base_url=self.base_url, timeout=30, headers=headers)

    def follow(
        self, run_id: str, until: Any, after: int = 0, timeout: float = 60
    ) -> list[dict[str, Any]]:
        """Read the SSE stream until ``until(event)`` is true; returns the events read."""
        import json

        events: list[dict[str, Any]] = []
        headers = {**OPS, "Accept": "text/event-stream", "Last-Event-ID": str(after)}
        with httpx.stream(
            "GET",
            f"{self.base_url}/runs/{run_id}/events",
            headers=headers,
            timeout=httpx.Timeout(timeout),
        ) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    events.append(event)
                    if until(event):
                        return events
        return events


class WorkerProcess(_Process):
    """A real ``agent-runtime worker`` subprocess: drives runs, serves no HTTP."""

    STARTED = "worker "  # logged at INFO as "worker <owner> started"

    def __init__(
        self,
        data_dir: Path,
        database_url: str,
        *,
        concurrency: int = 4,
        name: str = "w",
        **env: str,
    ) -> None:
        self.data_dir = data_dir
        self.concurrency = concurrency
        self.name = name
        # INFO, so the start line is logged; lease losses are logged as warnings.
        self.env = {**base_env(data_dir, database_url), "AGENT_RUNTIME_LOG_LEVEL": "info", **env}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / f"worker-{name}.log"
        self.starts = 0
        self._offset = 0

    def start(self, timeout: float = 30.0, wait: bool = True) -> WorkerProcess:
        """Start the process; with ``wait``, return once it logged that it is claiming runs."""
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = self._spawn("worker", "--concurrency", str(self.concurrency))
        self.starts += 1
        if wait:
            self.wait_started(timeout=timeout)
        return self

    def wait_started(self, offset: int | None = None, timeout: float = 30.0) -> None:
        """Wait for the start line logged after ``offset`` (default: since the last start)."""
        offset = self._offset if offset is None else offset
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_text()[-3000:]}")
            with self.log_path.open("rb") as fh:
                fh.seek(offset)
                tail = fh.read().decode(errors="replace")
            if any(
                line.split(": ", 1)[-1].startswith(self.STARTED) and line.endswith(" started")
                for line in tail.splitlines()
            ):
                return
            time.sleep(0.05)  # polling for the process to come up, not waiting on behaviour
        raise TimeoutError(f"worker did not start: {self.log_text()[-3000:]}")
