"""The run store on SQLite and PostgreSQL: event sequence, idempotency, CAS, pagination."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from runtime.adapter import fail_run
from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.lifecycle import State, Trigger
from runtime.model import Approval, BudgetLimits, PendingApproval, RunOptions, utcnow
from runtime.store import leases
from runtime.store.base import RunStore
from runtime.store.leases import CLAIM_SPARE, PROBED_AGENTS
from runtime.store.schema import MIGRATIONS, SchemaTooNew
from runtime.store.sqlite import SqliteRunStore
from tests.unit.conftest import MakeRun, build_run


@pytest.fixture(params=["per tenant", "whole backlog"])
def ranking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A claim ranks each tenant's first runs while few tenants have runs waiting, and
    every waiting run past ``leases.FEW_TENANTS``: claim tests run with both."""
    if request.param == "whole backlog":
        monkeypatch.setattr(leases, "FEW_TENANTS", 0)
    return str(request.param)


def store_of(backend: object) -> RunStore:
    return backend.store  # type: ignore[attr-defined,no-any-return]


def pending_approval(run_id: str, approval_id: str, args: dict[str, Any] | None = None) -> Approval:
    return Approval(
        approval_id=approval_id,
        run_id=run_id,
        tool_call_id="tc-1",
        tool="refund",
        version="1",
        args=args or {},
        args_hash="h",
        risk="high",
        reason="high risk",
        status="pending",
        created_at=utcnow(),
    )


async def test_concurrent_appends_get_gapless_sequence_numbers(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store)

    seqs = await asyncio.gather(
        *(store.append_event(run.run_id, EventType.ERROR, {"i": i}) for i in range(20))
    )

    numbered = [seq for seq in seqs if seq is not None]  # None only for a dedupe_key
    assert sorted(numbered) == list(range(2, 22))  # seq 1 is the run's creation
    events = await store.list_events(run.run_id)
    assert [e.seq for e in events] == list(range(1, 22))
    assert sorted(e.data["i"] for e in events[1:]) == list(range(20))


async def test_events_are_per_run_and_paged_by_seq(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    a, b = await make_run(store), await make_run(store)
    for _ in range(3):
        await store.append_event(a.run_id, EventType.ERROR, {})
    assert await store.append_event(b.run_id, EventType.ERROR, {}) == 2
    assert [e.seq for e in await store.list_events(a.run_id, after=2, limit=1)] == [3]


async def test_dedupe_key_suppresses_a_second_event(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)

    first = await store.append_event(run.run_id, EventType.ERROR, {"n": 1}, dedupe_key="k")
    second = await store.append_event(run.run_id, EventType.ERROR, {"n": 2}, dedupe_key="k")
    other = await store.append_event(run.run_id, EventType.ERROR, {"n": 3}, dedupe_key="k2")

    assert (first, second, other) == (2, None, 3)
    assert [e.data for e in await store.list_events(run.run_id, after=1)] == [{"n": 1}, {"n": 3}]


async def test_append_to_a_missing_run_raises(backend: object) -> None:
    with pytest.raises(RuntimeProblem) as info:
        await store_of(backend).append_event("run-nope", EventType.ERROR, {})
    assert info.value.code is Code.RUN_NOT_FOUND


async def test_create_run_idempotency(backend: object) -> None:
    store = store_of(backend)
    first, created = await store.create_run(build_run(idempotency_key="key-1"), "hash-a")
    assert created

    again, created = await store.create_run(build_run(idempotency_key="key-1"), "hash-a")
    assert not created
    assert again.run_id == first.run_id

    with pytest.raises(RuntimeProblem) as info:
        await store.create_run(build_run(idempotency_key="key-1"), "hash-b")
    assert info.value.code is Code.IDEMPOTENCY_CONFLICT
    assert info.value.extra["run_id"] == first.run_id

    runs, _ = await store.list_runs()
    assert [r.run_id for r in runs] == [first.run_id]
    assert len(await store.list_events(first.run_id)) == 1


async def test_a_created_run_is_stored_with_its_first_event(backend: object) -> None:
    store = store_of(backend)
    announced: list[tuple[str, int, list[str]]] = []
    store.add_listener(
        lambda run_id, seq, rows: announced.append((run_id, seq, [r["type"] for r in rows]))
    )
    run, created = await store.create_run(build_run(tenant_id="t1"), "hash", max_active=5)

    assert created
    stored = await store.get_run(run.run_id)
    assert stored is not None and stored.model_dump() == run.model_dump()
    found = await store.get_run_drive(run.run_id)
    assert found is not None and found[1]  # a worker is to claim it
    events = await store.list_events(run.run_id)
    assert [(e.seq, e.type, e.data) for e in events] == [
        (1, EventType.STATE, {"from": None, "to": "pending", "trigger": "create"})
    ]
    assert announced == [(run.run_id, 1, ["state"])]
    # The next event of the run follows on.
    assert await store.append_event(run.run_id, EventType.ERROR, {"code": "X"}) == 2


async def test_a_run_stored_with_a_zero_budget_still_reads_back(backend: object) -> None:
    """A request may no longer ask for zero LLM calls, tokens or cost (tests/api); runs
    stored while it could are still read (the check is the request's, not the row's)."""
    store = store_of(backend)
    zero = BudgetLimits(max_llm_calls=0, max_tokens=0, max_cost_usd=0)
    run = build_run().model_copy(update={"options": RunOptions(budget=zero)})
    await store.create_run(run, "hash")

    stored = await store.get_run(run.run_id)
    assert stored is not None and stored.options.budget == zero
    found = await store.get_run_drive(run.run_id)
    assert found is not None and found[0].options.budget == zero


async def test_concurrent_creates_never_pass_the_tenants_cap(backend: object) -> None:
    store = store_of(backend)
    await store.create_run(build_run(tenant_id="other"), "hash", max_active=1)

    async def create(tenant: str) -> bool:
        try:
            await store.create_run(build_run(tenant_id=tenant), "hash", max_active=3)
        except RuntimeProblem as exc:
            assert exc.code is Code.TENANT_RUN_LIMIT
            return False
        return True

    tenants = [f"t{i}" for i in range(5)]
    results = await asyncio.gather(*(create(t) for _ in range(8) for t in tenants))

    assert sum(results) == 3 * len(tenants)
    for tenant in tenants:
        runs, _ = await store.list_runs(tenant_id=tenant)
        assert len(runs) == 3, tenant


@pytest.mark.parametrize("same_body", [True, False])
async def test_concurrent_retries_of_a_key_at_the_cap_find_its_run(
    backend: object, same_body: bool
) -> None:
    """One run below the cap: the first of the retries takes the last place, the
    others find its run (or the conflict of their other body), not the cap it fills;
    a client reading 429 as "not created" would have been wrong."""
    store = store_of(backend)
    for _ in range(3):
        await store.create_run(build_run(tenant_id="t1"), "hash", max_active=4)

    async def create(i: int) -> str:
        digest = "same" if same_body or i == 0 else f"other-{i}"
        try:
            run, _ = await store.create_run(
                build_run(tenant_id="t1", idempotency_key="retry"), digest, max_active=4
            )
        except RuntimeProblem as exc:
            return exc.code.value
        return run.run_id

    answers = await asyncio.gather(*(create(i) for i in range(8)))

    runs, _ = await store.list_runs(tenant_id="t1")
    [keyed] = [r for r in runs if r.options.idempotency_key == "retry"]
    assert len(runs) == 4
    if same_body:
        assert answers == [keyed.run_id] * 8
    else:  # the first may lose the race to another body: every other answer conflicts
        assert answers.count(keyed.run_id) == 1
        assert answers.count("IDEMPOTENCY_CONFLICT") == 7


async def test_only_one_of_concurrent_decisions_wins(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)
    approval = pending_approval(run.run_id, "ap-1", args={"amount": 5})
    await store.ensure_approval(approval, {"approval_id": "ap-1"})
    decisions = ["approved" if i % 2 else "rejected" for i in range(10)]

    results = await asyncio.gather(
        *(
            store.decide_approval("ap-1", d, decided_by=f"user-{i}", comment=None)  # type: ignore[arg-type]
            for i, d in enumerate(decisions)
        )
    )

    winners = [i for i, (_, won) in enumerate(results) if won]
    assert len(winners) == 1
    final = await store.get_approval("ap-1")
    assert final is not None
    assert final.status == decisions[winners[0]]
    assert final.decided_by == f"user-{winners[0]}"
    assert all(row.status == final.status for row, _ in results)
    types = [e.type for e in await store.list_events(run.run_id)]
    assert types.count(EventType.APPROVAL_REQUEST) == types.count(EventType.APPROVAL_RESULT) == 1


async def test_list_runs_pages_through_every_run_once(backend: object) -> None:
    store = store_of(backend)
    base = utcnow()
    # Several runs share a created_at: the cursor must break ties by run_id.
    stamps = [base, base, base, base + timedelta(seconds=1), base + timedelta(seconds=2)] * 2
    created = {(await store.create_run(build_run(created_at=t), "h"))[0].run_id for t in stamps}

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        runs, cursor = await store.list_runs(limit=3, cursor=cursor)
        seen += [r.run_id for r in runs]
        pages += 1
        if cursor is None:
            break

    assert sorted(seen) == sorted(created)
    assert len(seen) == len(created) == 10
    assert pages == 4


@pytest.mark.parametrize(
    "where",
    [
        {"tenant_id": "t1", "state": "succeeded"},
        {"tenant_id": "t1", "agent_id": "other"},
        {"state": "succeeded"},
        {"tenant_id": "t1", "state": "succeeded", "agent_id": "other"},
        {"tenant_id": "t1", "state": "succeeded|waiting_human"},  # any of them
        {"agent_id": "other|test-agent", "state": "failed|waiting_human"},  # any of each
    ],
)
async def test_filtered_pages_come_newest_first_each_run_once(
    backend: object, where: dict[str, str]
) -> None:
    """Each filter is served by an index in page order (migration 14), paged by a row
    value: ties on created_at are broken by run_id across pages, and no page repeats or
    skips."""
    store = store_of(backend)
    base = utcnow()
    made = []
    for i in range(24):
        run = build_run(
            tenant_id=("t1", "t2")[i % 2],
            state=(State.SUCCEEDED, State.FAILED, State.WAITING_HUMAN)[i % 3],
            # Two instants only: every filter matches several runs of one of them, and
            # a page of one run puts each tie across a page boundary.
            created_at=base + timedelta(seconds=int(i % 4 == 3)),
        )
        run = run.model_copy(update={"agent_id": ("other", "test-agent")[(i // 2) % 2]})
        made.append((await store.create_run(run, "h"))[0])
    wanted = [
        r.run_id
        for r in sorted(made, key=lambda r: (r.created_at, r.run_id), reverse=True)
        if all(
            {"tenant_id": r.context.tenant_id, "state": r.state.value, "agent_id": r.agent_id}[k]
            in v.split("|")
            for k, v in where.items()
        )
    ]
    assert wanted  # the filter matches something
    states = where["state"].split("|") if "state" in where else []
    agents = where["agent_id"].split("|") if "agent_id" in where else []
    tenant = where.get("tenant_id")

    seen: list[str] = []
    cursor: str | None = None
    while True:
        runs, cursor = await store.list_runs(
            limit=1, cursor=cursor, states=states, agent_ids=agents, tenant_id=tenant
        )
        seen += [r.run_id for r in runs]
        if cursor is None:
            break
    assert seen == wanted


async def test_list_runs_cursor_rejects_garbage(backend: object) -> None:
    with pytest.raises(RuntimeProblem) as info:
        await store_of(backend).list_runs(cursor="%%%not-base64")
    assert info.value.code is Code.VALIDATION_ERROR


async def test_two_processes_can_open_one_postgres_database_at_once(pg_schema_url: str) -> None:
    from runtime.backend import open_backend

    tasks = [asyncio.create_task(open_backend(pg_schema_url)) for _ in range(2)]
    done, pending = await asyncio.wait(tasks, timeout=10)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        await task.result().close()
    assert not pending, "open_backend deadlocked"


async def test_postgres_sessions_compile_nothing(pg_schema_url: str) -> None:
    """Without fresh statistics (a burst of runs a minute ago) PostgreSQL priced a claim
    over jit_above_cost and spent 30 ms compiling a 1 ms query: our sessions have JIT off."""
    from runtime.backend import open_backend

    opened = await open_backend(pg_schema_url)
    try:
        async with opened.store.pool.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute("SELECT current_setting('jit') AS jit")
            assert await cur.fetchone() == {"jit": "off"}
    finally:
        await opened.close()


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
async def test_postgres_sessions_read_committed_whatever_the_default(
    pg_schema_url: str, isolation: str
) -> None:
    """An operator's default isolation (ALTER DATABASE/ROLE, PGOPTIONS) above READ
    COMMITTED: a create's snapshot, taken before the tenant's lock was granted, missed
    the run another create had just committed, and both passed the tenant's cap."""
    from runtime.backend import open_backend

    value = isolation.replace(" ", "\\ ")  # libpq's options: a space in a value is escaped
    url = pg_schema_url + quote(f" -cdefault_transaction_isolation={value}")  # options go on
    opened = await open_backend(url)
    try:
        store = opened.store
        async with store.pool.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute("SELECT current_setting('transaction_isolation') AS i")
            assert await cur.fetchone() == {"i": "read committed"}
        outcomes = await asyncio.gather(
            *(
                store.create_run(build_run(tenant_id="capped"), "hash", max_active=1)
                for _ in range(8)
            ),
            return_exceptions=True,
        )
        assert sum(not isinstance(o, BaseException) for o in outcomes) == 1, outcomes
        assert all(
            isinstance(o, RuntimeProblem) and o.code is Code.TENANT_RUN_LIMIT
            for o in outcomes
            if isinstance(o, BaseException)
        ), outcomes
    finally:
        await opened.close()


async def test_callers_cancelled_mid_transaction_leave_the_store_usable(backend: object) -> None:
    """An SSE client hanging up cancels a read inside its transaction; nothing may stick."""
    store = store_of(backend)
    for yields in range(12):
        for _ in range(4):
            task = asyncio.create_task(store.list_events("run-x", 0))
            for _ in range(yields):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    await store.ping()
    assert await store.list_events("run-x", 0) == []
    assert await store.get_run("run-x") is None


async def test_a_decision_racing_a_park_neither_deadlocks_nor_is_lost(
    backend: object, make_run: MakeRun
) -> None:
    """Parking (by the lease holder) and deciding (by a human) lock the approval, then
    the run: in the other order, PostgreSQL would abort one of them as a deadlock."""
    store = store_of(backend)
    for i in range(25):
        run = await make_run(store, state=State.EXECUTING)
        version = await store.take_lease(run.run_id, "w1", 30.0)
        assert version is not None
        approval = pending_approval(run.run_id, f"ap-race-{i}")
        await store.ensure_approval(approval, {"approval_id": approval.approval_id})

        parked, (decided, won) = await asyncio.gather(
            store.fenced(run.run_id, version).park(
                run.run_id, approval.approval_id, State.EXECUTING
            ),
            store.decide_approval(approval.approval_id, "approved", decided_by="u", comment=None),
        )

        assert won and decided.status == "approved"
        final = await store.get_run(run.run_id)
        assert final is not None and final.state is State.EXECUTING
        states = [e.data["to"] for e in await store.list_events(run.run_id) if e.type == "state"]
        if parked is None:  # decided first: the drive resumes instead of parking
            assert "waiting_human" not in states
        else:  # parked first: the decision moved it back and asked for a worker
            assert states[-2:] == ["waiting_human", "executing"]


async def test_a_run_ending_while_a_human_decides_does_not_deadlock(
    backend: object, make_run: MakeRun
) -> None:
    """The drive expiring a run's pending approval (fenced) and a human deciding it race;
    one of them wins, neither is aborted."""
    store = store_of(backend)
    for i in range(25):
        run = await make_run(store, state=State.WAITING_HUMAN)
        version = await store.take_lease(run.run_id, "w1", 30.0)
        assert version is not None
        approval = pending_approval(run.run_id, f"ap-end-{i}")
        await store.ensure_approval(approval, {"approval_id": approval.approval_id})

        (_, expired), (_, approved) = await asyncio.gather(
            store.fenced(run.run_id, version).decide_approval(
                approval.approval_id, "expired", decided_by="runtime", comment="run ended"
            ),
            store.decide_approval(approval.approval_id, "approved", decided_by="u", comment=None),
        )

        assert expired != approved  # exactly one won
        final = await store.get_approval(approval.approval_id)
        assert final is not None and final.status == ("expired" if expired else "approved")


async def test_a_run_whose_cancel_was_accepted_takes_no_decision(
    backend: object, make_run: MakeRun
) -> None:
    """Cancelled while parked with no worker to carry it out: a human's decision would
    say the run resumes (and move it to executing), and it never will. Refused; the
    cancel's own drive expires the approval."""
    store = store_of(backend)
    run = await make_run(store, state=State.WAITING_HUMAN)
    approval = pending_approval(run.run_id, "ap-cancelled")
    await store.ensure_approval(approval, {"approval_id": approval.approval_id})
    assert await store.request_cancel(run.run_id, "stop", False)
    seen = len(await store.list_events(run.run_id))

    for decision in ("approved", "rejected"):
        with pytest.raises(RuntimeProblem) as refused:
            await store.decide_approval(
                approval.approval_id,
                decision,
                decided_by="u",
                comment=None,  # type: ignore[arg-type]
            )
        assert refused.value.code is Code.RUN_STATE_CONFLICT

    still = await store.get_run(run.run_id)
    assert still is not None and still.state is State.WAITING_HUMAN
    # Nor is it offered in the inbox meanwhile; its own run's list still shows it.
    inbox, _ = await store.page_approvals(statuses=["pending"])
    assert approval.approval_id not in [a.approval_id for a in inbox]
    listed, _ = await store.page_approvals(run_id=run.run_id)
    assert [a.approval_id for a in listed] == [approval.approval_id]
    # A run's own check of what is still open (the finish node's) sees it.
    still_open = await store.list_approvals(run_id=run.run_id, status="pending")
    assert [a.approval_id for a in still_open] == [approval.approval_id]
    assert (await store.get_approval(approval.approval_id)).status == "pending"  # type: ignore[union-attr]
    assert len(await store.list_events(run.run_id)) == seen
    _, expired = await store.decide_approval(
        approval.approval_id, "expired", decided_by="runtime", comment="run ended"
    )
    assert expired


async def test_a_sqlite_write_waits_for_a_write_lock_another_connection_holds(
    tmp_path: Path, make_run: MakeRun
) -> None:
    """BEGIN IMMEDIATE is tried on the loop's thread without waiting; when the
    checkpointer's connection holds SQLite's write lock, the write waits for it on
    aiosqlite's thread: it neither fails at once nor stalls the event loop."""
    store = await SqliteRunStore.open(tmp_path / "locked.db")
    other = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        writing = asyncio.create_task(make_run(store))
        # Were the loop's thread to wait in SQLite's busy handler, these sleeps would
        # only end when the write had given up (10 s), and it would be done.
        for _ in range(10):
            await asyncio.sleep(0.01)
        assert not writing.done(), "the write did not wait for the lock"
        other.execute("COMMIT")
        run = await asyncio.wait_for(writing, 5)
        assert (await store.get_run(run.run_id)) is not None
        await store.append_event(run.run_id, EventType.ERROR, {})  # the store goes on
    finally:
        other.close()
        await store.close()


async def test_claims_take_turns_between_tenants(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """One tenant's backlog does not queue another tenant's run behind it: each claim
    takes every tenant's oldest waiting run before anyone's second."""
    store = store_of(backend)
    start = utcnow() - timedelta(minutes=10)
    burst = [
        await make_run(store, tenant_id="busy", created_at=start + timedelta(seconds=i))
        for i in range(6)
    ]
    late = await make_run(store, tenant_id="quiet", created_at=start + timedelta(seconds=30))
    later = await make_run(store, tenant_id="other", created_at=start + timedelta(seconds=40))

    first = {run_id for run_id, _ in await store.claim_runs("w1", 3, 30.0)}
    assert first == {burst[0].run_id, late.run_id, later.run_id}
    second = {run_id for run_id, _ in await store.claim_runs("w2", 2, 30.0)}
    assert second == {burst[1].run_id, burst[2].run_id}  # then oldest first, as before

    # A worker whose slots free one at a time: the tenant with fewer runs being driven
    # goes first, however old the busy tenant's next run is.
    newcomer = await make_run(store, tenant_id="quiet")
    [(one, _)] = await store.claim_runs("w3", 1, 30.0)
    assert one == newcomer.run_id
    [(after, _)] = await store.claim_runs("w3", 1, 30.0)
    assert after == burst[3].run_id


async def test_claims_take_only_runs_of_the_workers_agents_or_cancels(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """A worker claims what it can drive: runs of its agents, and cancels (any process
    carries those out), in both rankings. The ids are written as literals: one that
    could end the literal, or that the driver would read as a placeholder ("%", "?":
    every claim of the worker failed on PostgreSQL), is refused, not sent."""
    store = store_of(backend)
    start = utcnow() - timedelta(minutes=10)
    others = [
        await make_run(store, tenant_id=f"t{i}", created_at=start + timedelta(seconds=i))
        for i in range(3)
    ]
    dotted = await make_run(store, agent_id="writer-2.v1", created_at=start)
    doomed = await make_run(store, agent_id="gone", created_at=start + timedelta(seconds=8))
    assert await store.request_cancel(doomed.run_id, "retired", False)

    for unsafe in ("o'brien", "pct%agent", "why?", "nul\x00", ""):
        with pytest.raises(ValueError, match="not an agent id"):
            await store.claim_runs("w0", 9, 30.0, agents={"test-agent", unsafe})
    assert await store.claim_runs("w0", 9, 30.0, agents={"nobody"}) == [(doomed.run_id, 1)]
    assert await store.claim_runs("w1", 9, 30.0, agents=()) == []
    assert await store.claim_runs("w1", 9, 30.0, agents={"writer-2.v1"}) == [(dotted.run_id, 1)]
    mine = await store.claim_runs("w2", 9, 30.0, agents={"test-agent", "nobody"})
    assert sorted(mine) == sorted((run.run_id, 1) for run in others)


@pytest.mark.parametrize("hosted", [PROBED_AGENTS, PROBED_AGENTS + 1, 1000])
async def test_a_worker_hosting_many_agents_claims_their_runs(
    backend: object, make_run: MakeRun, ranking: str, hosted: int
) -> None:
    """Past PROBED_AGENTS a claim reads each tenant's runs of every agent: one probe
    per agent was one arm of a compound SELECT apiece, and from 500 SQLite refused it
    (the worker claimed nothing). Found by review."""
    store = store_of(backend)
    agents = {f"agent{i}" for i in range(hosted)}
    mine = await make_run(store, agent_id=f"agent{hosted - 1}")
    await make_run(store, agent_id="elsewhere")
    assert await store.claim_runs("w1", 5, 30.0, agents=agents) == [(mine.run_id, 1)]


async def test_claims_for_some_agents_keep_turns_and_age_past_another_agents_backlog(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """A claim reads each tenant's first runs of each of the worker's agents (and its
    cancels of any other), one index probe apiece, not the other agents' backlog ahead
    of them: together they are still claimed tenant by tenant in turn, oldest first,
    across the worker's agents, its cancels among them."""
    store = store_of(backend)
    start = utcnow() - timedelta(minutes=30)

    async def run(agent: str, at: float, tenant: str = "busy") -> str:
        made = await make_run(
            store, tenant_id=tenant, agent_id=agent, created_at=start + timedelta(seconds=at)
        )
        return made.run_id

    backlog = [await run("elsewhere", i) for i in range(CLAIM_SPARE + 10)]
    ours = [await run("a" if i % 2 else "b", 100 + i) for i in range(6)]
    foreign_cancel = await run("elsewhere", 103.5)  # between ours[3] and ours[4]
    assert await store.request_cancel(foreign_cancel, "retired", False)
    assert await store.request_cancel(ours[1], "no longer needed", False)
    quiet = await run("b", 200, tenant="quiet")

    order: list[str] = []
    while claimed := await store.claim_runs(f"w{len(order)}", 1, 30.0, agents={"a", "b"}):
        order += [run_id for run_id, _ in claimed]
        assert len(order) <= len(ours) + 2, "claimed a run of an agent it does not host"
    # The quiet tenant's turn comes as soon as the busy one has a run leased.
    assert order == [ours[0], quiet, *ours[1:4], foreign_cancel, *ours[4:]]
    for run_id in backlog:
        lease = await store.lease_of(run_id)
        assert lease is not None and lease["lease_owner"] is None


async def test_claims_reach_past_a_tenants_first_runs(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """A claim reads each tenant's first few waiting runs, not its whole backlog: the
    runs behind those are claimed in their turn, in order, once the first are leased."""
    store = store_of(backend)
    start = utcnow() - timedelta(minutes=10)
    busy = [
        (await make_run(store, tenant_id="busy", created_at=start + timedelta(seconds=i))).run_id
        for i in range(CLAIM_SPARE + 10)
    ]
    quiet = [
        (
            await make_run(store, tenant_id="quiet", created_at=start + timedelta(seconds=60 + i))
        ).run_id
        for i in range(2)
    ]

    first = await store.claim_runs("w0", 4, 30.0)
    assert {run_id for run_id, _ in first} == {busy[0], busy[1], *quiet}
    claims: list[set[str]] = []
    for i in range(1, 20):
        got = await store.claim_runs(f"w{i}", 4, 30.0)
        if not got:
            break
        claims.append({run_id for run_id, _ in got})
    # Every one, once, oldest first (a claim's own rows come back in no order), past the
    # first CLAIM_SPARE + 1 a claim of one would rank.
    rest = busy[2:]
    assert claims == [set(rest[i : i + 4]) for i in range(0, len(rest), 4)]
    assert await store.claim_runs("w-last", 4, 30.0) == []


async def test_concurrent_claims_lease_each_run_once(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    store = store_of(backend)
    runs = {(await make_run(store, tenant_id=f"t{i % 3}")).run_id for i in range(24)}
    claims = await asyncio.gather(*(store.claim_runs(f"w{i}", 3, 30.0) for i in range(10)))
    leased = [run_id for claim in claims for run_id, _ in claim]
    assert all(len(claim) <= 3 for claim in claims)
    assert len(leased) == len(set(leased)) == 24 and set(leased) == runs


async def test_a_live_lease_is_not_taken_even_by_its_owner(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """A cancel takes a run nobody holds; a drive its own process claimed a moment
    before is not nobody (taking it would fence that drive out)."""
    store = store_of(backend)
    run = await make_run(store)
    [(run_id, version)] = await store.claim_runs("w1", 1, 30.0)
    assert await store.take_lease(run_id, "w1", 30.0) is None
    assert await store.take_lease(run_id, "w2", 30.0) is None
    await store.release_lease(run_id, "w1", version, needs_drive=True)
    assert await store.take_lease(run.run_id, "w1", 30.0) == version + 1


async def test_a_failed_drive_is_claimable_again_only_after_its_backoff(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    [(run_id, version)] = await store.claim_runs("w1", 10, 30.0)
    assert run_id == run.run_id

    assert await store.release_lease(
        run_id, "w1", version, needs_drive=None, retry_in=0.3, failures=2
    )
    assert await store.claim_runs("w2", 10, 30.0) == []  # backing off
    found = await store.get_run_to_drive(run_id)
    assert found is not None and found.failures == 2
    await asyncio.sleep(0.35)
    [(_, again)] = await store.claim_runs("w2", 10, 30.0)
    assert again == version + 1

    # A drive that ends without failing starts the count again.
    await store.release_lease(run_id, "w2", again, needs_drive=True)
    found = await store.get_run_to_drive(run_id)
    assert found is not None and found.failures == 0

    # A drive that could not read the count adds one to it.
    [(_, third)] = await store.claim_runs("w3", 10, 30.0)
    await store.release_lease(run_id, "w3", third, needs_drive=None, retry_in=60, failures=1)
    fourth = await store.take_lease(run_id, "w3", 30.0)  # backoff or not
    assert fourth is not None
    await store.release_lease(run_id, "w3", fourth, needs_drive=None, retry_in=60)
    found = await store.get_run_to_drive(run_id)
    assert found is not None and found.failures == 2

    # A cancel does not wait for a backoff: asked during it, or during the failing drive.
    assert await store.claim_runs("w4", 10, 30.0) == []
    await store.request_cancel(run_id, "stop", compensate=False)
    [(_, fifth)] = await store.claim_runs("w4", 10, 30.0)
    await store.release_lease(run_id, "w4", fifth, needs_drive=None, retry_in=60, failures=3)
    assert [r for r, _ in await store.claim_runs("w5", 10, 30.0)] == [run_id]


async def test_an_ended_run_takes_no_cancel_and_is_never_claimed_again(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """A cancel that found the run live and wrote after it ended flagged it for driving;
    each drive found it ended and gave it back still flagged, so workers claimed it
    again and again, for ever (a probe saw lease version 5,303)."""
    store = store_of(backend)
    run = await make_run(store)
    await store.transition(run.run_id, Trigger.START, expect=State.PENDING)
    await store.transition(run.run_id, Trigger.PLAN_READY, expect=State.PLANNING)
    [(run_id, version)] = await store.claim_runs("w1", 1, 30.0)
    assert await store.request_cancel(run_id, "late", compensate=False)  # still live
    await store.transition(run_id, Trigger.DONE, expect=State.EXECUTING)

    # (The end let the lease go: the drive's release finds nothing of its own to give back.)
    assert await store.release_lease(run_id, "w1", version, needs_drive=None) is None
    assert await store.claim_runs("w2", 1, 30.0) == []
    assert not await store.request_cancel(run_id, "later", compensate=False)
    assert await store.claim_runs("w2", 1, 30.0) == []

    # Handed back at shutdown (needs_drive=True) after its graph had ended: the same.
    other = await make_run(store)
    [(other_id, version)] = await store.claim_runs("w1", 1, 30.0)
    assert other_id == other.run_id
    for trigger, expect in (
        (Trigger.START, State.PENDING),
        (Trigger.PLAN_READY, State.PLANNING),
        (Trigger.DONE, State.EXECUTING),
    ):
        await store.transition(other_id, trigger, expect=expect)
    assert await store.release_lease(other_id, "w1", version, needs_drive=True) is None
    assert await store.claim_runs("w2", 1, 30.0) == []


async def started_by_w1(store: RunStore, make_run: MakeRun) -> tuple[str, int, RunStore]:
    """A new run claimed by worker w1 and started: (run_id, lease version, the drive's view)."""
    run = await make_run(store)
    [(run_id, version)] = await store.claim_runs("w1", 1, 30.0)
    assert run_id == run.run_id
    drive = store.fenced(run_id, version)
    await drive.transition(run_id, Trigger.START, expect=State.PENDING)
    return run_id, version, drive


@pytest.mark.parametrize("ending", ["succeeded", "failed"])
async def test_a_runs_end_lets_its_lease_go_in_the_same_write(
    backend: object, make_run: MakeRun, ending: str
) -> None:
    """A worker killed between a run's end and its release left the finished run owned
    (seen after SIGKILLs: a stale lease_owner on succeeded runs)."""
    store = store_of(backend)
    run_id, version, drive = await started_by_w1(store, make_run)
    if ending == "succeeded":
        await drive.transition(run_id, Trigger.PLAN_READY, expect=State.PLANNING)
        await drive.transition(run_id, Trigger.DONE, expect=State.EXECUTING)
    else:
        await fail_run(drive, run_id, Code.PLANNER_ERROR, "the model is gone")

    ended = await store.get_run(run_id)
    assert ended is not None and ended.state.value == ending
    lease = await store.lease_of(run_id)
    assert lease is not None
    assert (lease["lease_owner"], lease["remaining_s"], lease["lease_version"]) == (
        None,
        None,
        version,
    )
    assert await store.claim_runs("w2", 1, 30.0) == []
    # Nor taken for a cancel that found it live a moment before it ended.
    assert await store.take_lease(run_id, "w2", 30.0) is None
    assert await store.renew_leases("w1", [(run_id, version, None)], 30.0) == {run_id}


async def test_a_lease_the_runs_end_let_go_is_renewed_as_held_and_left_alone(
    backend: object, make_run: MakeRun
) -> None:
    """The heartbeat may renew between a run's end and its drive's exit: the lease is
    not lost to anyone (its version is the drive's), so the drive must not be stopped
    as if taken over; the renewal extends nothing on a run that has ended."""
    store = store_of(backend)
    run_id, version, drive = await started_by_w1(store, make_run)
    await drive.transition(run_id, Trigger.PLAN_READY, expect=State.PLANNING)
    await drive.transition(run_id, Trigger.DONE, expect=State.EXECUTING)

    assert await store.renew_leases("w1", [(run_id, version, 9.0)], 30.0) == {run_id}
    lease = await store.lease_of(run_id)
    assert lease is not None and lease["lease_owner"] is None and lease["remaining_s"] is None
    found = await store.get_run_to_drive(run_id)
    assert found is not None and found.active_s != 9.0
    # Another version's, or another owner's live lease, is not held.
    assert await store.renew_leases("w1", [(run_id, version + 1, None)], 30.0) == set()
    live = await make_run(store)
    [(live_id, live_version)] = await store.claim_runs("w2", 1, 30.0)
    assert live_id == live.run_id
    assert await store.renew_leases("w1", [(live_id, live_version, None)], 30.0) == set()


async def test_a_second_cancel_adds_compensation_until_the_drive_decides(
    backend: object, make_run: MakeRun
) -> None:
    """Asked after the drive had decided against it, compensation was accepted and never
    done: it is refused now."""
    store = store_of(backend)
    first, decided = await make_run(store), await make_run(store)
    for run in (first, decided):
        assert await store.request_cancel(run.run_id, "stop", compensate=False, requested_by="u1")
    assert await store.seal_cancel(decided.run_id) == ("stop (requested by u1)", False)

    assert await store.request_cancel(first.run_id, "halt", compensate=True, requested_by="adm")
    assert await store.request_cancel(first.run_id, "again", compensate=False)
    # The first's reason and requester stay; who added compensation is said too.
    assert await store.cancel_requested(first.run_id) == (
        "stop (requested by u1); compensation asked for by adm",
        True,
    )
    with pytest.raises(RuntimeProblem) as refused:
        await store.request_cancel(decided.run_id, "undo", compensate=True, requested_by="adm")
    assert refused.value.code is Code.RUN_STATE_CONFLICT
    assert await store.request_cancel(decided.run_id, "again", compensate=False)
    assert await store.cancel_requested(decided.run_id) == ("stop (requested by u1)", False)


async def test_approvals_of_an_older_store_get_their_tool_and_version_apart(
    backend: object, make_run: MakeRun
) -> None:
    """Migration 10 on rows written before it, "name@version" in ``tool``."""
    store = store_of(backend)
    run = await make_run(store)
    await store.ensure_approval(pending_approval(run.run_id, "ap-old"), {})
    await store.ensure_approval(pending_approval(run.run_id, "ap-older"), {})
    async with store.tx() as tx:
        # The approvals as they were at version 9.
        await tx.execute("ALTER TABLE approvals DROP COLUMN version")
        await tx.execute(
            "UPDATE approvals SET tool = 'publish_report@12' WHERE approval_id = ?", ("ap-old",)
        )
        await tx.execute(
            "UPDATE approvals SET tool = 'refund' WHERE approval_id = ?", ("ap-older",)
        )

    async with store.tx() as tx:
        for sql in MIGRATIONS[10 - 1]:
            await tx.execute(sql)

    old, older = await store.get_approval("ap-old"), await store.get_approval("ap-older")
    assert old is not None and (old.tool, old.version) == ("publish_report", "12")
    assert older is not None and (older.tool, older.version) == ("refund", "")


async def test_a_lease_renewal_records_the_active_time_of_the_drive_holding_it(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    [(run_id, version)] = await store.claim_runs("w1", 10, 30.0)
    found = await store.get_run_to_drive(run_id)
    assert run_id == run.run_id and found is not None and found.active_s == 0.0

    assert await store.renew_leases("w1", [(run_id, version, 12.5)], 30.0) == {run_id}
    assert await store.renew_leases("w1", [(run_id, version, None)], 30.0) == {run_id}
    # Nor does anyone but the lease's holder move it.
    assert await store.renew_leases("w2", [(run_id, version, 99.0)], 30.0) == set()

    found = await store.get_run_to_drive(run_id)
    assert found is not None and found.active_s == 12.5
    # Not a field of the public run.
    assert "active_s" not in found.run.model_dump()

    # A drive handing the run back says how far its clock got, as a renewal would.
    assert await store.release_lease(run_id, "w1", version, needs_drive=True, active_s=14.0)
    found = await store.get_run_to_drive(run_id)
    assert found is not None and found.active_s == 14.0


async def test_takeovers_count_in_a_row_until_a_drive_moves_the_run_on(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """Each lease that expired unreleased counts, unless its own worker takes it back; a
    drive that checkpoints a step (clear_takeovers) or gives the run back starts the
    count again; one that failed on the database does not."""
    store = store_of(backend)
    run = await make_run(store)

    async def takeovers() -> tuple[int, str | None]:
        found = await store.get_run_to_drive(run.run_id)
        assert found is not None
        return found.takeovers, found.taken_from

    [(_, version)] = await store.claim_runs("w1", 1, -1.0)  # a lease that has run out
    assert await takeovers() == (0, None)
    [(_, version)] = await store.claim_runs("w2", 1, -1.0)
    assert await takeovers() == (1, "w1")
    taken = await store.take_lease(run.run_id, "w3", -1.0)  # a cancel's take counts too
    assert taken is not None and await takeovers() == (2, "w2")
    # A worker that could not renew its lease and takes it back has lost nobody.
    taken = await store.take_lease(run.run_id, "w3", 30.0)
    assert taken is not None and await takeovers() == (2, None)

    # Another worker's clearing changes nothing; the holder's starts the count again.
    assert not await store.clear_takeovers(run.run_id, "w1", taken)
    assert await store.clear_takeovers(run.run_id, "w3", taken)
    assert await takeovers() == (0, None)

    # A drive that failed on the database keeps it; one that ended by itself does not.
    await store.renew_leases("w3", [(run.run_id, taken, None)], -1.0)
    [(_, version)] = await store.claim_runs("w4", 1, 30.0)
    assert await takeovers() == (1, "w3")
    await store.release_lease(run.run_id, "w4", version, needs_drive=None, retry_in=0.0)
    assert (await takeovers())[0] == 1
    taken = await store.take_lease(run.run_id, "w5", 30.0)  # released: no takeover
    assert taken is not None and await takeovers() == (1, None)
    await store.release_lease(run.run_id, "w5", taken, needs_drive=True)
    assert (await takeovers())[0] == 0

    # A grant given back undone (its worker stopped before driving the run): the next
    # claim finds the lease it replaced, and counts the takeover it did.
    [(_, version)] = await store.claim_runs("w6", 1, -1.0)
    [(_, version)] = await store.claim_runs("w7", 1, 30.0)
    assert await takeovers() == (1, "w6")
    assert not await store.give_back_claim(run.run_id, "w6", version)
    assert await store.give_back_claim(run.run_id, "w7", version)
    assert (await takeovers())[0] == 0
    [(_, again)] = await store.claim_runs("w8", 1, 30.0)
    assert again == version + 1 and await takeovers() == (1, "w6")


async def test_a_suspect_is_claimed_only_as_one(
    backend: object, make_run: MakeRun, ranking: str
) -> None:
    """A run whose next grant would make ``max_takeovers`` in a row waits for a worker
    with nothing else to drive: neither a claim of several nor a cancel's take has it."""
    store = store_of(backend)
    cleared, suspect = await make_run(store), await make_run(store)
    await store.claim_runs("w1", 2, -1.0, max_takeovers=3)
    await store.claim_runs("w2", 2, -1.0, max_takeovers=3)  # taken over: 1 in a row each
    assert not await store.drain_for_suspect("w8", 3, 0.0, 30.0)
    assert await store.claim_suspect("w3", 30.0, 3) is None
    claimed = dict(await store.claim_runs("w3", 2, -1.0, max_takeovers=3))
    assert len(claimed) == 2  # 2 in a row each, and their leases expired unreleased
    assert await store.clear_takeovers(cleared.run_id, "w3", claimed[cleared.run_id])

    assert not await store.drain_for_suspect("w8", 3, 60.0, 30.0)  # not for a minute yet
    # Not for workers without its agent: none of them could take it.
    assert not await store.drain_for_suspect("w8", 3, 0.0, 30.0, agents={"other"})
    assert await store.claim_suspect("w8", 30.0, 3, agents={"other"}) is None
    # One busy worker makes room for it, the first to ask, as long as it keeps asking.
    assert await store.drain_for_suspect("w8", 3, 0.0, 30.0)
    assert not await store.drain_for_suspect("w9", 3, 0.0, 30.0)
    assert await store.drain_for_suspect("w8", 3, 0.0, -1.0)  # renewed, to have lapsed
    assert await store.drain_for_suspect("w9", 3, 0.0, 30.0)
    assert not await store.drain_for_suspect("w8", 3, 0.0, 30.0)
    assert await store.claim_runs("w4", 5, 30.0, max_takeovers=3) == [(cleared.run_id, 4)]
    assert await store.take_lease(suspect.run_id, "w4", 30.0, max_takeovers=3) is None
    assert await store.claim_suspect("w4", 30.0, 3, agents={"test-agent"}) == (suspect.run_id, 4)
    found = await store.get_run_to_drive(suspect.run_id)
    assert found is not None and (found.takeovers, found.taken_from) == (3, "w3")
    assert await store.claim_suspect("w5", 30.0, 3) is None  # held
    assert not await store.drain_for_suspect("w9", 3, 0.0, 30.0)


async def test_a_run_parked_with_a_cancel_asked_for_is_left_to_be_driven(
    backend: object, make_run: MakeRun
) -> None:
    """A drive that parks without having heard of a cancel (its notice lost, or
    swallowed) must not leave the cancel to wait for a human's decision."""
    store = store_of(backend)
    asked = await make_run(store, state=State.EXECUTING)
    quiet = await make_run(store, state=State.EXECUTING)
    for run in (asked, quiet):
        version = await store.take_lease(run.run_id, "w1", 30.0)
        assert version is not None
        approval = pending_approval(run.run_id, f"ap-{run.run_id}")
        await store.ensure_approval(approval, {"approval_id": approval.approval_id})
        if run is asked:
            assert await store.request_cancel(run.run_id, "stop", compensate=False)
        await store.fenced(run.run_id, version).park(
            run.run_id, approval.approval_id, State.EXECUTING
        )

    for run, driven in ((asked, True), (quiet, False)):
        found = await store.get_run_drive(run.run_id)
        assert found is not None and found[0].state is State.WAITING_HUMAN
        assert found[1] is driven


async def test_an_embedded_database_is_readable_by_its_owner_alone(tmp_path: Path) -> None:
    """It keeps tool arguments marked secret (README: the trust boundary)."""
    from runtime.backend import open_backend

    path = tmp_path / "data" / "runtime.db"
    backend = await open_backend(f"sqlite:///{path}")
    try:
        async with backend.store.tx() as tx:  # a write: the -wal file is there too
            await tx.execute("UPDATE runs SET needs_drive = 0 WHERE run_id = ?", ("none",))
        files = [path, path.with_name("runtime.db-wal")]
        assert [stat.S_IMODE(f.stat().st_mode) for f in files] == [0o600, 0o600]
    finally:
        await backend.close()


async def test_a_database_whose_migration_6_was_the_first_edition_gets_the_audit_table(
    backend: object,
) -> None:
    """Migration 6 was an index before it became the audit table: a database that ran
    the first counted 6 and never had the table, and erasing memory and revoking keys
    failed on it for good."""
    store = store_of(backend)
    async with store.tx() as tx:  # the state such a database is in at version 15
        await tx.execute("DROP TABLE audit")
        await tx.execute("DELETE FROM schema_version WHERE version > ?", (15,))

    await store.migrate()

    entry = await store.record_audit("t1", "ann via cli", "key.revoke", "key-1")
    entries, _ = await store.page_audit("t1", limit=10, cursor=None)
    assert [e.audit_id for e in entries] == [entry.audit_id]


async def test_a_column_an_earlier_edition_of_its_migration_added_is_not_added_again(
    backend: object,
) -> None:
    """Migration 12 first added the drainer columns, then 13 did (and 12 no longer): a
    database migrated in between failed 13's ALTER TABLE on a column it had."""
    store = store_of(backend)
    async with store.tx() as tx:  # drainer and drainer_until there, 13 not run
        await tx.execute("DELETE FROM schema_version WHERE version > ?", (12,))

    await store.migrate()

    async with store.tx() as tx:
        row = await tx.fetchone("SELECT MAX(version) AS v FROM schema_version")
        await tx.execute("UPDATE runs SET drainer = ? WHERE run_id = ?", ("w1", "none"))
    assert row is not None and row["v"] == len(MIGRATIONS)


async def test_a_database_of_the_version_before_gets_the_claims_indexes_by_agent(
    backend: object, make_run: MakeRun
) -> None:
    """The last migration replaces the indexes claims read: its waiting runs are
    claimed after it as before."""
    store = store_of(backend)
    run = await make_run(store)
    async with store.tx() as tx:  # as the version before left it
        for name in ("runs_waiting_agent", "runs_cancelling", "runs_leased_until"):
            await tx.execute(f"DROP INDEX {name}")
        await tx.execute(
            "CREATE INDEX runs_waiting ON runs (tenant_id, updated_at, run_id, lease_expires_at) "
            "WHERE needs_drive = 1"
        )
        await tx.execute(
            "CREATE INDEX runs_leased ON runs (tenant_id) WHERE lease_owner IS NOT NULL"
        )
        await tx.execute("DELETE FROM schema_version WHERE version > ?", (len(MIGRATIONS) - 1,))

    await store.migrate()

    listed = (
        "SELECT name FROM sqlite_master WHERE type = 'index'"
        if store.dialect == "sqlite"
        else "SELECT indexname AS name FROM pg_indexes WHERE schemaname = current_schema()"
    )
    async with store.read() as conn:
        names = {row["name"] for row in await conn.fetchall(listed)}
    assert {"runs_waiting_agent", "runs_cancelling", "runs_leased_until"} <= names
    assert not {"runs_waiting", "runs_leased"} & names
    assert await store.claim_runs("w1", 5, 30.0, agents={run.agent_id}) == [(run.run_id, 1)]


async def test_a_database_a_newer_version_migrated_refuses_this_one(backend: object) -> None:
    """A rollback onto a migrated database: the older code would write around columns
    and meanings it does not know, silently wrong (a probe saw approvals stored in a
    shape no later migration fixes). It refuses, and writes nothing."""
    store = store_of(backend)
    await store.migrate()  # a second time on a current database: nothing to do
    async with store.tx() as tx:
        await tx.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS) + 1,))
    with pytest.raises(SchemaTooNew, match=f"version {len(MIGRATIONS) + 1}, newer"):
        await store.migrate()


@pytest.mark.parametrize(
    ("trigger", "to"),
    [(Trigger.APPROVED, None), (Trigger.REJECTED, State.PLANNING), (Trigger.CANCEL, None)],
)
async def test_a_run_moved_on_from_waiting_waits_on_no_approval(
    backend: object, make_run: MakeRun, trigger: Trigger, to: State | None
) -> None:
    """A rejection sent the run back to its planner, and it showed the decided approval
    as pending while it planned and ran its next step."""
    store = store_of(backend)
    run = await make_run(store, state=State.EXECUTING)
    waiting = PendingApproval(approval_id="ap-1", tool_call_id="tc-1", tool="refund", reason="r")
    parked = await store.transition(
        run.run_id, Trigger.NEED_APPROVAL, expect=State.EXECUTING, pending_approval=waiting
    )
    assert parked.pending_approval == waiting

    moved = await store.transition(run.run_id, trigger, expect=State.WAITING_HUMAN, to=to)

    assert moved.state is not State.WAITING_HUMAN and moved.pending_approval is None
    stored = await store.get_run(run.run_id)
    assert stored is not None and stored.pending_approval is None
