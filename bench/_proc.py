"""Real server, worker and ``langgraph dev`` subprocesses for the HTTP benchmarks.

Our processes are started through the installed ``agent-runtime`` console script,
as an operator runs them, with settings in ``AGENT_RUNTIME_*`` variables. Starting,
waiting for and stopping them is the integration tests' own
(:mod:`tests.integration.server_proc`); what is the benchmarks' alone is here: their
settings and tokens, cProfile, and reading a process's CPU time and memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from bench._http import server_env, server_headers
from tests.integration.server_proc import (
    AGENT_RUNTIME,
    ROOT,
    ChildProcess,
    LanggraphDev,
    answers,
    free_port,
    worker_started,
)

__all__ = ["Agentrt", "LanggraphDev", "cpu_seconds", "rss_bytes"]


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


class Agentrt(ChildProcess):
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
        argv = AGENT_RUNTIME
        if self.profile_to is not None:
            # cProfile runs a script or "-m module": the console script, or the module.
            target = AGENT_RUNTIME if len(AGENT_RUNTIME) == 1 else AGENT_RUNTIME[1:]
            argv = [sys.executable, "-m", "cProfile", "-o", str(self.profile_to), *target]
        self.proc = self._spawn(*args, argv=argv)
        if wait:
            self.wait_started()
        return self

    def wait_started(self, timeout: float = 60) -> None:
        if self.command == "worker":
            self.wait_until(lambda: self.logged_since(0, worker_started), "worker", timeout)
        else:
            url = f"{self.base_url}/readyz"
            self.wait_until(lambda: answers(url, server_headers()), self.command, timeout)

    def stop(self) -> None:
        if self.profile_to is not None and self.proc is not None and self.proc.poll() is None:
            # uvicorn re-raises the signal it caught once it has shut down: SIGINT then
            # ends a profiled server with KeyboardInterrupt, so cProfile writes its file.
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            return
        super().stop()
