"""The run store's schema, one list of migrations shared by SQLite and PostgreSQL.

``{blob}`` is the only type that differs between the two dialects.
"""

from __future__ import annotations

import re

AUDIT = [
    # What people did that no run's log records (runtime.store.audit): a user's
    # memory erased, by them or by a tenant admin; API keys created and revoked.
    """CREATE TABLE IF NOT EXISTS audit (
        audit_id TEXT PRIMARY KEY,
        at TEXT NOT NULL,
        tenant_id TEXT NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        subject TEXT NOT NULL,
        detail TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS audit_tenant ON audit (tenant_id, at, audit_id)",
]
"""Migration 6, and 16 again."""

ADDED_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (?!IF )(\w+) [^,]*")
"""A statement the migrations skip where the column is there already: some migrations
were edited after they shipped, and a database that ran the first edition has it. One
column a statement (matched whole), or the statement is run as it is."""

MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE IF NOT EXISTS runs (
            run_id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            tenant_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            input TEXT NOT NULL,
            context TEXT NOT NULL,
            options TEXT NOT NULL,
            state TEXT NOT NULL,
            step_index INTEGER NOT NULL DEFAULT 0,
            usage TEXT NOT NULL,
            limits TEXT NOT NULL,
            pending_approval TEXT,
            result TEXT,
            outcome TEXT,
            idempotency_key TEXT,
            request_hash TEXT NOT NULL,
            cancel_requested TEXT,
            last_seq INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            ended_at TEXT
        )""",
        "CREATE UNIQUE INDEX IF NOT EXISTS runs_idem ON runs (tenant_id, idempotency_key)",
        "CREATE INDEX IF NOT EXISTS runs_state ON runs (state)",
        "CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at, run_id)",
        """CREATE TABLE IF NOT EXISTS steps (
            run_id TEXT NOT NULL,
            step_index INTEGER NOT NULL,
            decision TEXT NOT NULL,
            started_at TEXT NOT NULL,
            ended_at TEXT,
            PRIMARY KEY (run_id, step_index)
        )""",
        """CREATE TABLE IF NOT EXISTS tool_calls (
            tool_call_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            step_index INTEGER NOT NULL,
            call_index INTEGER NOT NULL,
            tool TEXT NOT NULL,
            version TEXT NOT NULL,
            args TEXT NOT NULL,
            args_hash TEXT NOT NULL,
            status TEXT NOT NULL,
            output TEXT,
            artifact_id TEXT,
            error TEXT,
            idempotency_key TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            side_effect INTEGER NOT NULL DEFAULT 0,
            compensated INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS tool_calls_run ON tool_calls (run_id, step_index, call_index)",
        """CREATE TABLE IF NOT EXISTS approvals (
            approval_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            args TEXT NOT NULL,
            args_hash TEXT NOT NULL,
            risk TEXT NOT NULL,
            reason TEXT NOT NULL,
            status TEXT NOT NULL,
            decided_by TEXT,
            comment TEXT,
            created_at TEXT NOT NULL,
            decided_at TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS approvals_status ON approvals (status, created_at)",
        """CREATE TABLE IF NOT EXISTS artifacts (
            artifact_id TEXT PRIMARY KEY,
            media_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            name TEXT NOT NULL,
            run_id TEXT,
            created_at TEXT NOT NULL,
            content {blob}
        )""",
        """CREATE TABLE IF NOT EXISTS events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            ts TEXT NOT NULL,
            data TEXT NOT NULL,
            dedupe_key TEXT,
            PRIMARY KEY (run_id, seq)
        )""",
        "CREATE UNIQUE INDEX IF NOT EXISTS events_dedupe ON events (run_id, dedupe_key)",
    ],
    [
        # Leases (DESIGN §10): a run that needs driving is claimed by one worker at a
        # time; lease_version is the fencing token every write of that worker checks.
        "ALTER TABLE runs ADD COLUMN needs_drive INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN lease_owner TEXT",
        "ALTER TABLE runs ADD COLUMN lease_expires_at DOUBLE PRECISION",
        "ALTER TABLE runs ADD COLUMN lease_version INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX IF NOT EXISTS runs_needs_drive ON runs (needs_drive, lease_expires_at)",
        "UPDATE runs SET needs_drive = 1 WHERE state IN ('pending', 'planning', 'executing')",
        # A compensation is claimed before it runs, so two cancels cannot both run it.
        "ALTER TABLE tool_calls ADD COLUMN compensation_claimed INTEGER NOT NULL DEFAULT 0",
    ],
    [
        # Authentication (server.auth): API keys are stored as a hash of their secret.
        """CREATE TABLE IF NOT EXISTS api_keys (
            key_id TEXT PRIMARY KEY,
            key_hash TEXT NOT NULL,
            tenant_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            roles TEXT NOT NULL,
            scopes TEXT NOT NULL,
            label TEXT,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        )""",
        # Tenant-scoped reads: the run list, the active-run limit, artifact access.
        "CREATE INDEX IF NOT EXISTS runs_tenant ON runs (tenant_id, created_at, run_id)",
        "CREATE INDEX IF NOT EXISTS runs_tenant_state ON runs (tenant_id, state)",
        "CREATE INDEX IF NOT EXISTS events_dedupe_key ON events (dedupe_key)",
    ],
    [
        # A run's approvals (the finish node's check for a pending one, a failing run's
        # expiry, the trace): without it each read scanned every pending approval of
        # every parked run.
        "CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run_id, created_at)",
    ],
    [
        # Drives in a row that ended on a database error (runtime.engine): a failure
        # that lasts ends the run with CHECKPOINT_ERROR instead of being retried forever.
        "ALTER TABLE runs ADD COLUMN drive_failures INTEGER NOT NULL DEFAULT 0",
    ],
    AUDIT,
    [
        # Retention (runtime.retention) picks the runs that ended longest ago, in batches
        # (only an ended run has an ended_at): without it each batch read and sorted
        # every ended run.
        "CREATE INDEX IF NOT EXISTS runs_ended ON runs (ended_at, run_id)",
    ],
    [
        # Claims take turns between tenants (runtime.store.leases): each tenant's
        # waiting runs in order (and whether leased: an index-only scan), and how many
        # runs each has leased, without reading the runs that are parked or ended.
        "CREATE INDEX IF NOT EXISTS runs_waiting "
        "ON runs (tenant_id, updated_at, run_id, lease_expires_at) WHERE needs_drive = 1",
        "CREATE INDEX IF NOT EXISTS runs_leased ON runs (tenant_id) WHERE lease_owner IS NOT NULL",
    ],
    [
        # The owner of the lease a claim replaced: set only where that lease had expired
        # unreleased (its worker died or stalled), so the drive can put it on the record.
        "ALTER TABLE runs ADD COLUMN taken_from TEXT",
    ],
    [
        # An approval names its tool as tool calls and events do: name and version
        # apart (it was "name@version"). Both dialects have rtrim(text, characters):
        # stripping every character but "@" from the right leaves "name@".
        "ALTER TABLE approvals ADD COLUMN version TEXT NOT NULL DEFAULT ''",
        "UPDATE approvals SET "
        "version = replace(tool, rtrim(tool, replace(tool, '@', '')), ''), "
        "tool = rtrim(rtrim(tool, replace(tool, '@', '')), '@') "
        "WHERE replace(tool, '@', '') <> tool",
    ],
    [
        # A run's active seconds as its drive last reported them with a lease renewal:
        # the time of a step a crash cuts off is in no checkpoint, and a drive that
        # takes over starts its clock from whichever is later.
        "ALTER TABLE runs ADD COLUMN active_s DOUBLE PRECISION NOT NULL DEFAULT 0",
    ],
    [
        # Leases in a row that expired unreleased with no step of the run checkpointed
        # in between (runtime.store.leases): a run that keeps killing or stalling its
        # worker is failed instead of being handed from worker to worker for ever.
        "ALTER TABLE runs ADD COLUMN takeovers INTEGER NOT NULL DEFAULT 0",
    ],
    [
        # Suspects (runtime.store.leases.claim_suspect): the few waiting runs that may
        # be one, for a worker with nothing to drive; the busy worker that stops taking
        # runs to make room for one, and until when.
        "CREATE INDEX IF NOT EXISTS runs_suspect ON runs (updated_at, run_id) "
        "WHERE needs_drive = 1 AND (lease_owner IS NOT NULL OR takeovers > 0)",
        "ALTER TABLE runs ADD COLUMN drainer TEXT",
        "ALTER TABLE runs ADD COLUMN drainer_until DOUBLE PRECISION",
    ],
    [
        # Pages of runs by tenant and state, by tenant and agent, and of approvals by
        # status, read in their order from an index: a tenant with 100,000 runs paid
        # 40-130 ms a page (a sort of every match, or a scan past every other row).
        # Three replace indexes they begin with, dropped last: a DROP INDEX takes the
        # table from readers too until the commit, a CREATE INDEX only from writers.
        "CREATE INDEX IF NOT EXISTS runs_tenant_state_page "
        "ON runs (tenant_id, state, created_at, run_id)",
        "CREATE INDEX IF NOT EXISTS runs_tenant_agent "
        "ON runs (tenant_id, agent_id, created_at, run_id)",
        "CREATE INDEX IF NOT EXISTS runs_state_page ON runs (state, created_at, run_id)",
        "CREATE INDEX IF NOT EXISTS approvals_status_page "
        "ON approvals (status, created_at, approval_id)",
        "DROP INDEX IF EXISTS runs_tenant_state",
        "DROP INDEX IF EXISTS runs_state",
        "DROP INDEX IF EXISTS approvals_status",
    ],
    [
        # Why each attempt of a call before its last has no outcome of its own (a
        # transient fault retried, a drive that stopped mid-call), written before the
        # next attempt starts: a call cut off between two attempts kept none of it.
        "ALTER TABLE tool_calls ADD COLUMN retried TEXT NOT NULL DEFAULT '[]'",
    ],
    # Migration 6 was first an index (since dropped again by 14) and became the audit
    # table after it shipped: a database that ran the first counted 6 and never got
    # the table (erasing memory and revoking a key failed on it for good).
    AUDIT,
    [
        # A worker claims only runs of its own agents, and cancels (runtime.store.leases):
        # each tenant's waiting runs of one agent in order, and those to be cancelled.
        # On runs_waiting, a tenant's backlog of another agent's runs was stepped over
        # row by row at every claim (~140 ms a claim at 50,000 on PostgreSQL). Its
        # tenant prefix still serves the walk between tenants.
        "CREATE INDEX IF NOT EXISTS runs_waiting_agent "
        "ON runs (tenant_id, agent_id, updated_at, run_id, lease_expires_at) "
        "WHERE needs_drive = 1",
        "CREATE INDEX IF NOT EXISTS runs_cancelling "
        "ON runs (tenant_id, updated_at, run_id, lease_expires_at) "
        "WHERE needs_drive = 1 AND cancel_requested IS NOT NULL",
        # A tenant's live leases, counted at each claim: on runs_leased (tenant_id),
        # PostgreSQL without fresh statistics (a burst of the last minute) counted
        # through runs_idem instead, every run of the tenant (~20 ms at 50,000).
        "CREATE INDEX IF NOT EXISTS runs_leased_until "
        "ON runs (tenant_id, lease_expires_at) WHERE lease_owner IS NOT NULL",
        # Dropped last (see above).
        "DROP INDEX IF EXISTS runs_waiting",
        "DROP INDEX IF EXISTS runs_leased",
    ],
]


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer agent-runtime than this one."""


def check_schema_version(current: int | None) -> None:
    """Refuse a database whose schema is ``current``, if a newer version migrated it."""
    if current is not None and current > len(MIGRATIONS):
        # Rolled back onto a database a newer version has migrated: its rows have
        # columns and meanings this code would write around, silently wrong.
        raise SchemaTooNew(
            f"the database's schema is version {current}, newer than this "
            f"agent-runtime knows ({len(MIGRATIONS)}): start the version that "
            "migrated it, or restore a backup from before it did"
        )
