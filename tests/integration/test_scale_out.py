"""Scale-out with real processes over one PostgreSQL database (issue 3): many workers
and random SIGKILLs, fencing of a paused worker, takeover of a dead worker's runs.

``serve`` and ``worker`` processes share one data_dir (so one demo database and one
counter.log) and one PostgreSQL schema. Leases last 2 s.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.agents import counter_lines
from tests.auth import MGR
from tests.integration.conftest import Processes, state_is
from tests.integration.scale_out import (
    EAST,
    QUESTION,
    QUICK_EXIT,
    SEED,
    Leases,
    create_run,
    pending_approval,
    start_workers,
    takeovers,
    wait_all_in_state,
    wait_until,
)
from tests.integration.server_proc import (
    ServerProcess,
    WorkerProcess,
    wait_for_file,
)
from tools.retail import outbox_rows

# -- 1. many runs, many workers, random SIGKILLs --------------------------------


def test_fifty_retail_runs_survive_random_worker_sigkills(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    rng = random.Random(SEED)
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    workers = [
        processes.add(
            WorkerProcess(data_dir, pg_schema_url, concurrency=4, name=f"w{i}", **QUICK_EXIT)
        )
        for i in range(3)
    ]
    start_workers(*workers)
    leases = Leases(pg_schema_url)
    kills: list[tuple[str, int]] = []  # (worker, runs it held when killed)

    def stuck() -> str | None:
        for worker in workers:
            if "IllegalTransition" in worker.log_text():
                return f"{worker.name} cannot drive a run: {worker.log_text()[-2000:]}"
        return None

    def kill_one_at_random() -> None:
        # Not the one killed last time: it may still be starting up.
        victim = rng.choice([w for w in workers if not kills or w.name != kills[-1][0]])
        jitter = rng.uniform(0.0, 0.15)
        victim.wait_started()
        # A moment when it is driving something, then a random bit later, mid-step.
        try:
            wait_until(lambda: leases.held_by(victim.pid), 5, f"{victim.name} to drive", every=0.02)
        except AssertionError:
            pass  # a kill at an idle moment is still a kill
        time.sleep(jitter)  # the random moment; not a wait for behaviour
        held = len(leases.held_by(victim.pid))
        victim.kill()
        kills.append((victim.name, held))
        victim.start(wait=False)  # back at once; it joins when it has started

    try:
        with server.client() as http:
            run_ids: list[str] = []
            for size in (13, 13, 12, 12):
                run_ids += [create_run(http, input=QUESTION, context=EAST) for _ in range(size)]
                kill_one_at_random()
            assert len(set(run_ids)) == 50
            wait_all_in_state(http, run_ids, "waiting_human", timeout=60, give_up=stuck)

            approvals = {run_id: pending_approval(http, run_id) for run_id in run_ids}
            order = list(run_ids)
            rng.shuffle(order)
            for batch in (order[:13], order[13:26], order[26:38], order[38:]):
                for run_id in batch:
                    resp = http.post(
                        f"/runs/{run_id}/approvals/{approvals[run_id]}",
                        json={"decision": "approve"},
                        headers=MGR,
                    )
                    assert resp.status_code == 202, resp.text
                kill_one_at_random()
            wait_all_in_state(http, run_ids, "succeeded", timeout=60, give_up=stuck)

            keys: set[str] = set()
            for run_id in run_ids:
                trace = http.get(f"/runs/{run_id}/trace").json()
                publishes = [c for c in trace["tool_calls"] if c["tool"] == "publish_report"]
                assert len(publishes) == 1, publishes
                assert publishes[0]["status"] == "succeeded", publishes[0]
                keys.add(publishes[0]["idempotency_key"])
                assert [a["status"] for a in trace["approvals"]] == ["approved"]
                events = trace["events"]
                assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
                assert [e["type"] for e in events].count("approval_result") == 1
                assert events[-1]["type"] == "state" and events[-1]["data"]["to"] == "succeeded"
        versions = leases.versions()
    finally:
        leases.close()

    rows = outbox_rows(data_dir / "retail.db")
    assert len(rows) == 50
    assert len({r["idempotency_key"] for r in rows}) == 50
    assert {r["idempotency_key"] for r in rows} == keys
    print(f"kills (worker, leases held): {kills}; takeovers: {takeovers(versions)}")
    assert len(kills) == 8
    # The chaos did hit work in flight, and other workers took those runs over.
    assert any(held for _, held in kills), kills
    assert takeovers(versions) > 0, "no run was ever taken over from a killed worker"


# -- 2. a paused worker cannot write over the new owner -------------------------


@pytest.mark.parametrize(
    "first_sleep",
    [8, 1],
    ids=["continued-mid-sleep", "sleep-ended-while-stopped"],
)
def test_paused_worker_cannot_write_after_its_lease_was_taken(
    pg_schema_url: str, data_dir: Path, processes: Processes, first_sleep: int
) -> None:
    """SIGSTOP a worker mid-call, let another take the run over, SIGCONT the first.

    With a long sleep the first is continued while its handler still runs; with a
    short one the handler has returned while the process was stopped, so the first
    thing it does when continued is try to record the outcome (a fenced write).
    """
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    first = processes.add(
        WorkerProcess(data_dir, pg_schema_url, concurrency=2, name="first", **QUICK_EXIT)
    ).start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input=f"sleep {first_sleep}")
        wait_for_file(data_dir / "sleep.log")  # the sleep handler has started in `first`
        assert len(counter_lines(data_dir)) == 1
        first.pause()
        second = processes.add(
            WorkerProcess(
                data_dir,
                pg_schema_url,
                concurrency=2,
                name="second",
                TEST_SLEEP_OVERRIDE="0.05",
                **QUICK_EXIT,
            )
        ).start()
        server.follow(run_id, state_is("succeeded", "failed"), timeout=30)
        before = http.get(f"/runs/{run_id}/trace").json()
        checkpoint_before = http.get(f"/runs/{run_id}/checkpoint").json()
        assert before["run"]["state"] == "succeeded", before["run"]
        # `second` re-ran the idempotent sleep under a newer lease.
        sleeps = (data_dir / "sleep.log").read_text().splitlines()
        assert len(sleeps) == 2 and sleeps[0] == sleeps[1]

        first.resume()
        # `first` wakes up, finds its lease gone (heartbeat or fenced write) and says so.
        wait_until(
            lambda: [ln for ln in first.log_text().splitlines() if "lease" in ln and run_id in ln],
            10,
            "the paused worker to notice it lost its lease",
        )
        after = http.get(f"/runs/{run_id}/trace").json()
        checkpoint_after = http.get(f"/runs/{run_id}/checkpoint").json()
        assert first.alive and second.alive
    assert after == before
    assert checkpoint_after == checkpoint_before
    assert len(counter_lines(data_dir)) == 1
    assert len((data_dir / "sleep.log").read_text().splitlines()) == 2


# -- 3. a dead worker's runs are taken over ----------------------------------------


def test_killed_worker_runs_are_taken_over_by_another(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    first = processes.add(
        WorkerProcess(data_dir, pg_schema_url, concurrency=4, name="first", **QUICK_EXIT)
    ).start()
    with server.client() as http:
        run_ids = [create_run(http, agent_id="slow_worker", input="sleep 30") for _ in range(3)]
        wait_until(
            lambda: (
                len((data_dir / "sleep.log").read_text().splitlines()) == 3
                if (data_dir / "sleep.log").exists()
                else False
            ),
            30,
            "three sleeps to start in the first worker",
        )
        leases = Leases(pg_schema_url)
        try:
            assert sorted(leases.held_by(first.pid)) == sorted(run_ids)
            first.kill()
            second = processes.add(
                WorkerProcess(
                    data_dir,
                    pg_schema_url,
                    concurrency=4,
                    name="second",
                    TEST_SLEEP_OVERRIDE="0.05",
                    **QUICK_EXIT,
                )
            ).start()
            for run_id in run_ids:
                server.follow(run_id, state_is("succeeded", "failed"), timeout=30)
            versions = leases.versions()
        finally:
            leases.close()
        counters = []
        for run_id in run_ids:
            run = http.get(f"/runs/{run_id}").json()
            assert run["state"] == "succeeded", run
            calls = http.get(f"/runs/{run_id}/tool-calls").json()
            assert [c["tool"] for c in calls] == ["counter", "sleep"]
            assert calls[0]["attempts"] == 1 and calls[1]["attempts"] == 2, calls
            counters.append(calls[0]["tool_call_id"])
            assert versions[run_id] >= 2
        assert second.alive
    lines = counter_lines(data_dir)
    assert len(lines) == 3
    assert sorted(line.split()[0] for line in lines) == sorted(counters)
