"""One process serves an embedded database (real processes, SQLite).

A process that starts on an embedded database takes over every lease in it: the only
earlier one can have died. A second `serve` or `worker` started beside a live first
would have taken the first's runs from under it (SQLite's checkpoints carry no lease
fence); it refuses to start instead, and the next one after the first has died,
however it died, starts at once.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from tests.agents import counter_lines
from tests.integration.conftest import Processes, state_is
from tests.integration.server_proc import (
    AGENT_RUNTIME,
    ROOT,
    ServerProcess,
    free_port,
    wait_for_file,
)


def lease(db: Path, run_id: str) -> tuple[str, int]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT lease_owner, lease_version FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    return str(row[0]), int(row[1])


def test_a_second_process_on_an_embedded_database_refuses_to_start(
    processes: Processes, data_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "runtime.db"
    first = processes.add(ServerProcess(data_dir, f"sqlite:///{db}")).start()
    with first.client() as http:
        run_id = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 4"}).json()[
            "run_id"
        ]
        first.follow(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    wait_for_file(data_dir / "sleep.log")
    held = lease(db, run_id)

    for command in (["worker"], ["serve", "--port", str(free_port())]):
        refused = subprocess.run(
            [*AGENT_RUNTIME, *command],
            cwd=ROOT,
            env=first.env,
            capture_output=True,
            timeout=60,
        )
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        said = refused.stderr.decode()
        assert f"is served by another process (pid {first.pid})" in said, said
        assert "PostgreSQL" in said

    # Nobody took the first's lease (a version counts every grant): the run went on
    # there, still held or, on a slow machine, already ended and released.
    owner, version = lease(db, run_id)
    assert version == held[1] and owner in (held[0], "None"), (owner, version, held)
    with first.client() as http:
        first.follow(run_id, state_is("succeeded", "failed"))
        assert http.get(f"/runs/{run_id}").json()["state"] == "succeeded"
    assert len(counter_lines(data_dir)) == 1

    # A process that dies leaves nothing behind that keeps the next one out.
    first.kill()
    second = processes.add(ServerProcess(data_dir, f"sqlite:///{db}")).start()
    with second.client() as http:
        assert http.get(f"/runs/{run_id}").json()["state"] == "succeeded"
