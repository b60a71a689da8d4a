"""Real server, worker and ``langgraph dev`` subprocesses for the HTTP benchmarks.

Our processes are started through the installed ``agent-runtime`` console script,
as an operator runs them, with settings in ``AGENT_RUNTIME_*`` variables.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench._http import server_env, server_headers

ROOT = Path(__file__).resolve().parents[1]
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        # The command name (field 2) may contain spaces: split after its closing paren.
        return fh.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, group: bool = False) -> float:
    """User + system CPU time of a process (all its threads), or of its process group."""
    pids = [pid]
    if group:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    total = 0
    for p in pids:
        try:
            fields = _stat(p)
        except OSError:
            continue
        # After the name: state, ppid, pgrp, ... utime is field 14, stime 15 (1-based).
        if group and int(fields[2]) != pid:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


class Proc:
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _check_alive(self, what: str) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{what} exited {self.proc.returncode}: {self.log_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lease release."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # uvicorn re-raises the signal it caught once it has shut down: SIGINT then
            # ends a profiled server with KeyboardInterrupt, so cProfile writes its file.
            if getattr(self, "profile_to", None) is not None:
                self.proc.send_signal(signal.SIGINT)
            else:
                self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Agentrt(Proc):
    """``agent-runtime serve`` (HTTP, with or without its worker) or ``agent-runtime worker``."""

    def __init__(
        self,
        data_dir: Path,
        database_url: str,
        *,
        command: str = "serve",
        name: str = "server",
        no_worker: bool = False,
        concurrency: int | None = None,
        env: dict[str, str] | None = None,
        profile_to: Path | None = None,
    ) -> None:
        self.command = command
        self.profile_to = profile_to
        """If set, the process runs under cProfile, which writes here when it exits."""
        self.no_worker = no_worker
        self.concurrency = concurrency
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / f"{name}.log"
        self.env = {
            **os.environ,
            "AGENT_RUNTIME_DATA_DIR": str(data_dir),
            "AGENT_RUNTIME_DATABASE_URL": database_url,
            "AGENT_RUNTIME_LOG_LEVEL": "info" if command == "worker" else "warning",
            "PYTHONPATH": str(ROOT),
            **server_env(),
            **(env or {}),
        }

    def start(self, wait: bool = True) -> Agentrt:
        if self.command == "serve":
            args = ["serve", "--port", str(self.port)] + (["--no-worker"] if self.no_worker else [])
        else:
            args = ["worker"]
            if self.concurrency is not None:
                args += ["--concurrency", str(self.concurrency)]
        argv = [*AGENT_RUNTIME, *args]
        if self.profile_to is not None:
            target = [str(_SCRIPT)] if _SCRIPT.exists() else ["-m", "server.cli"]
            argv = [sys.executable, "-m", "cProfile", "-o", str(self.profile_to), *target, *args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if wait:
            self.wait_started()
        return self

    def wait_started(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive(self.command)
            if self.command == "worker":
                if any(
                    " worker " in line and line.endswith(" started")
                    for line in self.log_text().splitlines()
                ):
                    return
            else:
                try:
                    url = f"{self.base_url}/readyz"
                    if httpx.get(url, headers=server_headers(), timeout=1).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)  # polling for the process to come up
        raise TimeoutError(f"{self.command} did not start: {self.log_text()[-3000:]}")


class LanggraphDev(Proc):
    """``langgraph dev`` serving langgraph.json (graphs/studio.py), in memory."""

    def __init__(self, data_dir: Path, jobs: int = 10) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / "langgraph-dev.log"
        self.jobs = jobs
        self.env = {k: v for k, v in os.environ.items() if k not in SECRETS}
        self.env.update(OFFLINE_ENV, AGENT_RUNTIME_DATA_DIR=str(data_dir))

    def start(self, timeout: float = 90) -> LanggraphDev:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(LANGGRAPH),
                    "dev",
                    "--no-browser",
                    "--no-reload",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--n-jobs-per-worker",
                    str(self.jobs),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive("langgraph dev")
            try:
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"langgraph dev not ready: {self.log_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
