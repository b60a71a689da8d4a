"""The embedded default's first start: two local keys, so `make run` needs no setup.

An ``admin`` key to start and watch runs and an ``approver`` key to decide them: two
people, because by default nobody approves the high-risk actions of their own run.
The tokens go to ``<data_dir>/local-keys.json`` (mode 0600), which the CLI reads.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from runtime.store.base import RunStore
from server.auth.keys import mint_key
from server.auth.principal import ADMIN, ANY_SCOPE, APPROVER

log = logging.getLogger(__name__)
LOCAL_TENANT = "local"
LOCAL_KEYS_FILE = "local-keys.json"
LOCAL_KEYS: tuple[tuple[str, list[str], list[str]], ...] = (
    ("admin", [ADMIN], [ANY_SCOPE]),
    ("approver", [APPROVER], []),
)
"""The first start's keys: user (also the file's entry), roles, scopes."""


def local_keys_path(data_dir: Path) -> Path:
    return data_dir / LOCAL_KEYS_FILE


def read_local_keys(data_dir: Path) -> dict[str, str]:
    """The tokens the embedded default created (name → token), or none."""
    try:
        data = json.loads(local_keys_path(data_dir).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):  # not the file we wrote: as if there were none
        return {}
    return {
        str(k): str(v["token"]) for k, v in data.items() if isinstance(v, dict) and "token" in v
    }


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not tighten a file that already existed
    with os.fdopen(fd, "w") as f:
        f.write(text)


async def ensure_local_keys(store: RunStore, data_dir: Path) -> Path | None:
    """Create the two local keys if the store has no key at all; return the file's path."""
    path = local_keys_path(data_dir)
    if await store.has_api_keys():  # every start but the first: no write
        return path if path.exists() else None
    minted = {
        user: mint_key(
            tenant_id=LOCAL_TENANT,
            user_id=user,
            roles=roles,
            scopes=scopes,
            label=f"local {user} (created on first start)",
        )
        for user, roles, scopes in LOCAL_KEYS
    }
    # Checked again under a lock as they are inserted: another process starting on the
    # same database may have made the first keys since (its file holds their tokens).
    if not await store.create_first_api_keys([row for _, row in minted.values()]):
        return path if path.exists() else None
    made = {user: key for user, (key, _) in minted.items()}
    data = {
        user: {"token": key.token, "tenant_id": LOCAL_TENANT, "user_id": user}
        for user, key in made.items()
    }
    _write_private(path, json.dumps(data, indent=2))
    # On the trail like a key made with `agent-runtime keys create`; after the file,
    # so that a failed audit write cannot lose the keys' only copy.
    for user, roles, scopes in LOCAL_KEYS:
        await store.record_audit(
            LOCAL_TENANT,
            "bootstrap",
            "key.create",
            made[user].key_id,
            user_id=user,
            roles=roles,
            scopes=scopes,
        )
    admin, approver = made["admin"], made["approver"]
    log.warning(
        "\n  No API key existed: created two local keys (tenant %r), saved in %s\n"
        "    admin:    %s\n    approver: %s\n"
        "  Send one as 'Authorization: Bearer <key>'. The CLI reads that file by itself.\n"
        "  On a shared database keys come from 'agent-runtime keys create' instead.",
        LOCAL_TENANT,
        path,
        admin.token,
        approver.token,
    )
    return path
