"""Real ``agent-runtime serve``/``worker`` and ``langgraph dev`` subprocesses that tests
(and the benchmarks, :mod:`bench._proc`) start, SIGKILL, pause and start again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.auth import OPS, TEST_JWT_SECRET

ROOT = Path(__file__).resolve().parents[2]
# The installed console script, as an operator runs it.
_SCRIPT = Path(sys.executable).with_name("agent-runtime")
AGENT_RUNTIME = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "server.cli"]
LANGGRAPH = Path(sys.executable).with_name("langgraph")

# langgraph dev without network: no LangSmith tracing, version check or analytics.
OFFLINE_ENV = {
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "NO_COLOR": "1",
}
SECRETS = ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "LANGGRAPH_CLOUD_LICENSE_KEY")


START_TIMEOUT_S = 60.0
"""How long a child has to come up: importing the server costs seconds of CPU, many
more on a loaded machine."""


def port_taken(line: str) -> bool:
    """The line a server logs when its port is in use (another process took it)."""
    return "address already in use" in line.lower()


_GIVEN: set[int] = set()
"""Ports :func:`free_port` has handed out in this process: never one twice, or two
children made before either starts could share one, and the first's readiness check
be answered by the second."""


def free_port() -> int:
    """A port free now, not handed out before: another process may take it before the
    child binds it (:meth:`ServerProcess.start` moves a first start to another)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def wait_for_file(path: Path, timeout: float = START_TIMEOUT_S) -> None:
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


class ChildProcess:
    """Signals for a child process: SIGKILL, SIGSTOP/SIGCONT, SIGTERM."""

    proc: subprocess.Popen[bytes] | None = None
    log_path: Path
    env: dict[str, str]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self, *args: str, argv: Sequence[str] = AGENT_RUNTIME) -> subprocess.Popen[bytes]:
        """``<argv> <args>`` (``agent-runtime`` by default) with this process's env,
        logging to its log file."""
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [*argv, *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_until(
        self, ready: Callable[[], bool], what: str, timeout: float, every: float = 0.05
    ) -> None:
        """Poll ``ready`` until it holds; fail at once, with the log, if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive(what)
            if ready():
                return
            time.sleep(every)  # polling for the process to come up, not waiting on behaviour
        raise TimeoutError(f"{what} did not start: {self.log_text()[-3000:]}")

    def logged_since(self, offset: int, line_ok: Callable[[str], bool]) -> bool:
        """Whether a line of the log after byte ``offset`` satisfies ``line_ok``."""
        if not self.log_path.exists():
            return False
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            tail = fh.read().decode(errors="replace")
        return any(line_ok(line) for line in tail.splitlines())

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check_alive(self, what: str) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{what} exited {self.proc.returncode}: {self.log_text()[-3000:]}")

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


class ServerProcess(ChildProcess):
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
        self.started = False

    def start(self, timeout: float = START_TIMEOUT_S, wait: bool = True) -> ServerProcess:
        """Start the process; with ``wait``, return once it answers ``/readyz``. A first
        start whose port was taken since :func:`free_port` chose it moves to another
        (a restart keeps its port: the test's clients know it)."""
        for attempt in range(3):
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self.proc = self._spawn(
                "serve", "--port", str(self.port), *(["--no-worker"] if self.no_worker else [])
            )
            if not wait:
                break
            try:
                self.wait_until(lambda: answers(f"{self.base_url}/readyz", OPS), "server", timeout)
            except RuntimeError:
                if self.started or attempt == 2 or not self.logged_since(offset, port_taken):
                    raise
                self._move_to(free_port())
                continue
            break
        self.started = True
        return self

    def _move_to(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = self.data_dir / f"server-{port}.log"

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


class WorkerProcess(ChildProcess):
    """A real ``agent-runtime worker`` subprocess: drives runs, serves no HTTP."""

    def __init__(
        self,
        data_dir: Path,
        database_url: str,
        *,
        concurrency: int = 4,
        name: str = "w",
        args: Sequence[str] = (),
        **env: str,
    ) -> None:
        self.data_dir = data_dir
        self.concurrency = concurrency
        self.name = name
        self.args = tuple(args)
        # INFO, so the start line is logged; lease losses are logged as warnings.
        self.env = {**base_env(data_dir, database_url), "AGENT_RUNTIME_LOG_LEVEL": "info", **env}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / f"worker-{name}.log"
        self.starts = 0
        self._offset = 0

    def start(self, timeout: float = START_TIMEOUT_S, wait: bool = True) -> WorkerProcess:
        """Start the process; with ``wait``, return once it logged that it is claiming runs."""
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = self._spawn("worker", "--concurrency", str(self.concurrency), *self.args)
        self.starts += 1
        if wait:
            self.wait_started(timeout=timeout)
        return self

    def wait_started(self, offset: int | None = None, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for the start line logged after ``offset`` (default: since the last start)."""
        offset = self._offset if offset is None else offset
        self.wait_until(lambda: self.logged_since(offset, worker_started), "worker", timeout)


def worker_started(line: str) -> bool:
    """The line a worker logs at INFO once it claims runs: "worker <owner> started"."""
    return line.split(": ", 1)[-1].startswith("worker ") and line.endswith(" started")


def answers(url: str, headers: Mapping[str, str] | None = None) -> bool:
    """Whether GET ``url`` answers 200 (False while nothing listens yet)."""
    try:
        return httpx.get(url, headers=headers, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class LanggraphDev(ChildProcess):
    """``langgraph dev`` serving langgraph.json (graphs/studio.py), in memory, offline."""

    def __init__(self, data_dir: Path, jobs: int | None = None) -> None:
        """``jobs``: its ``--n-jobs-per-worker`` (its own default if None)."""
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / "langgraph-dev.log"
        self.jobs = jobs
        self.env = {k: v for k, v in os.environ.items() if k not in SECRETS}
        self.env.update(OFFLINE_ENV, AGENT_RUNTIME_DATA_DIR=str(data_dir))

    def start(self, timeout: float = 90.0) -> LanggraphDev:
        args = ["dev", "--no-browser", "--no-reload", "--host", "127.0.0.1"]
        args += ["--port", str(self.port)]
        if self.jobs is not None:
            args += ["--n-jobs-per-worker", str(self.jobs)]
        with self.log_path.open("ab") as log:
            # Its own session: stop() signals the whole group (it runs workers).
            self.proc = subprocess.Popen(
                [str(LANGGRAPH), *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_until(lambda: answers(f"{self.url}/ok"), "langgraph dev", timeout, every=0.2)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
