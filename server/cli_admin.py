"""``agent-runtime keys`` and ``agent-runtime prune``: straight in the database of
``$AGENT_RUNTIME_DATABASE_URL``, no server needed (an operator's commands)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.cli_client import EXIT_ERROR as EXIT_USAGE
from server.cli_client import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from server.settings import Settings


def run(
    command: Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]],
    args: argparse.Namespace,
) -> int:
    """Run a database command; Ctrl-C is exit 130, as for the client commands (what was
    written stays written: each write is its own transaction).

    Every command here opens the store: its database is checked first as serve's and
    worker's is, so that one it cannot open (a newer version's, a server not there) is
    refused in one line before the store migrates or writes anything, not in the
    store's traceback."""
    from runtime.dberrors import DATABASE_ERRORS
    from server.preflight import reach_the_database
    from server.settings import Settings, one_line

    settings = Settings()
    try:
        reach_the_database(settings)
    except (ValueError, OSError) as exc:  # what it refuses with (ConnectionError too)
        print(f"agent-runtime {args.command}: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(command(args, settings))
    except KeyboardInterrupt:
        print(f"agent-runtime: {args.command} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except DATABASE_ERRORS as exc:  # reached, and refused: its schema set-up, say
        said = "" if isinstance(exc, OSError) else "the database refused: "
        print(f"agent-runtime {args.command}: {said}{one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE


def _has_bytes(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def no_database(settings: Settings, command: str, what: str) -> bool:
    """Whether the embedded database is not there, said as ``what`` then is (a command
    that reads it must not open it: that makes an empty one, whose "nothing" would
    vouch for a typo in the path)."""
    from runtime.backend import sqlite_path
    from server.settings import refused

    url = settings.resolved_database_url
    # An empty file is no database either: a start refused after it took the file's
    # lock leaves one, and SQLite would make a store in it.
    if not url.startswith("sqlite:///") or _has_bytes(sqlite_path(url)):
        return False
    why = refused(settings.database_setting, f"no database at {sqlite_path(url)}")
    print(f"agent-runtime {command}: {why}: {what}", file=sys.stderr)
    return True


# -- keys ------------------------------------------------------------------------------


async def keys(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.backend import open_backend
    from server.auth.keys import create_key
    from server.settings import one_line

    # A key may be made before the server's first start; there is none to list or revoke.
    if args.keys_command != "create" and no_database(settings, "keys", "no keys"):
        return EXIT_USAGE
    backend = await open_backend(settings.resolved_database_url)
    try:
        store = backend.store
        if args.keys_command == "create":
            try:
                key = await create_key(
                    store,
                    tenant_id=args.tenant,
                    user_id=args.user,
                    roles=args.role or [],
                    scopes=args.scope or [],
                    label=args.label,
                    audited_by="cli",
                )
            except ValueError as exc:
                print(f"agent-runtime: {exc}", file=sys.stderr)
                return EXIT_USAGE
            # The key is live, and on the trail; its secret is kept nowhere but here.
            try:
                if args.json:
                    print(json.dumps({"key_id": key.key_id, "token": key.token}), flush=True)
                else:
                    print(key.token, flush=True)
                    print(
                        f"(key {key.key_id} for {args.user} of {args.tenant}: shown once, "
                        "only its hash is kept)",
                        file=sys.stderr,
                    )
            except OSError as exc:  # a closed pipe, a full disk: not the database
                with contextlib.suppress(OSError):
                    print(
                        f"agent-runtime: key {key.key_id} was made, but its token could not "
                        f"be written ({one_line(exc)}): revoke it if it was lost",
                        file=sys.stderr,
                    )
                return EXIT_USAGE
        elif args.keys_command == "list":
            rows = await store.list_api_keys(args.tenant)
            if args.json:  # never the hash: what the table shows, as JSON
                listed = [
                    {
                        "key_id": row.key_id,
                        "tenant_id": row.tenant_id,
                        "user_id": row.user_id,
                        "roles": row.roles,
                        "scopes": row.scopes,
                        "label": row.label,
                        "created_at": row.created_at.isoformat(),
                        "revoked_at": row.revoked_at and row.revoked_at.isoformat(),
                    }
                    for row in rows
                ]
                print(json.dumps(listed))
                rows = []
            for row in rows:
                state = "revoked" if row.revoked_at else "active"
                print(
                    f"{row.key_id}  {row.tenant_id}/{row.user_id}  {state}  "
                    f"roles={','.join(row.roles) or '-'}  scopes={','.join(row.scopes) or '-'}"
                    + (f"  {row.label}" if row.label else "")
                )
        else:
            revoked = await store.get_api_key(args.key_id)
            if revoked is None or not await store.revoke_api_key(args.key_id, audited_by="cli"):
                print(f"agent-runtime: no active key {args.key_id}", file=sys.stderr)
                return EXIT_USAGE
            print(
                f"(key {args.key_id} of {revoked.user_id} of {revoked.tenant_id} revoked: "
                "refused from now on; event streams it opened end within SSE_KEEPALIVE_S)",
                file=sys.stderr,
            )
    finally:
        await backend.close()
    return 0


# -- prune -----------------------------------------------------------------------------


async def prune(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import timedelta

    from runtime.backend import open_backend
    from runtime.model import utcnow
    from runtime.retention import prune as prune_runs
    from runtime.store.codec import _iso

    if no_database(settings, "prune", "nothing to prune"):
        return EXIT_USAGE
    url = settings.resolved_database_url
    cutoff = utcnow() - timedelta(days=args.older_than)
    when = _iso(cutoff)  # as the API writes times
    backend = await open_backend(url)
    try:
        if args.dry_run:
            count = await backend.store.count_ended_runs(cutoff)
            report: dict[str, Any] = {"ended_before": when, "runs": count}
            text = f"{count} runs ended before {cutoff:%Y-%m-%d %H:%M} UTC (nothing deleted)"
        else:
            pruned = await prune_runs(backend.store, backend.checkpointer, cutoff)
            report = {
                "ended_before": when,
                "runs": len(pruned.runs),
                "artifacts": pruned.artifacts,
            }
            text = (
                f"deleted {len(pruned.runs)} runs ended before {cutoff:%Y-%m-%d %H:%M} UTC "
                f"and {pruned.artifacts} artifacts no other run names"
            )
    finally:
        await backend.close()
    print(json.dumps(report) if args.json else text)
    return 0
