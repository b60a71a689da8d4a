"""API keys: who a bearer key belongs to. Only a hash of each key's secret is kept."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from runtime.store.audit import insert_audit
from runtime.store.codec import _enc, _ts
from runtime.store.core import StoreCore
from runtime.store.tx import Row


@dataclass(frozen=True)
class NewApiKey:
    """A key row to insert: the hash of its secret, never the secret."""

    key_id: str
    key_hash: str
    tenant_id: str
    user_id: str
    roles: list[str]
    scopes: list[str]
    label: str | None


@dataclass(frozen=True)
class ApiKeyRow(NewApiKey):
    """A stored key row."""

    created_at: datetime
    revoked_at: datetime | None


_INSERT = (
    "INSERT INTO api_keys (key_id, key_hash, tenant_id, user_id, roles, scopes, "
    "label, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
FIRST_KEYS_LOCK = "api-keys:first"


def _params(key: NewApiKey) -> tuple[object, ...]:
    return (
        key.key_id,
        key.key_hash,
        key.tenant_id,
        key.user_id,
        _enc(key.roles),
        _enc(key.scopes),
        key.label,
        _ts(),
    )


class ApiKeyQueries(StoreCore):
    """API key rows."""

    async def create_api_key(self, key: NewApiKey, *, audited_by: str | None = None) -> None:
        """``audited_by``: the actor the audit trail names, in the same transaction (a
        key live and off the trail was one failed print away)."""
        async with self.tx() as tx:
            await tx.execute(_INSERT, _params(key))
            if audited_by is not None:
                await insert_audit(
                    tx,
                    key.tenant_id,
                    audited_by,
                    "key.create",
                    key.key_id,
                    user_id=key.user_id,
                    roles=sorted(set(key.roles)),
                    scopes=sorted(set(key.scopes)),
                )

    async def create_first_api_keys(self, keys: Sequence[NewApiKey]) -> bool:
        """Insert ``keys`` only if the store has no key at all, as one transaction;
        False (nothing inserted) if it has one. Servers starting at once on one
        database make one set of first keys between them, not one each."""
        async with self.tx() as tx:
            await self._lock_key(tx, FIRST_KEYS_LOCK)
            if await tx.fetchone("SELECT 1 AS one FROM api_keys LIMIT 1") is not None:
                return False
            for key in keys:
                await tx.execute(_INSERT, _params(key))
        return True

    async def get_api_key(self, key_id: str) -> ApiKeyRow | None:
        async with self.read() as tx:
            row = await tx.fetchone("SELECT * FROM api_keys WHERE key_id = ?", (key_id,))
        return _key(row) if row else None

    async def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRow]:
        where, params = ("WHERE tenant_id = ?", (tenant_id,)) if tenant_id else ("", ())
        async with self.read() as tx:
            rows = await tx.fetchall(
                f"SELECT * FROM api_keys {where} ORDER BY created_at, key_id", params
            )
        return [_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str, *, audited_by: str | None = None) -> bool:
        """Whether it was live (and is revoked now); ``audited_by`` as for a create."""
        async with self.tx() as tx:
            row = await tx.fetchone(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL "
                "RETURNING tenant_id, user_id",
                (_ts(), key_id),
            )
            if row is not None and audited_by is not None:
                await insert_audit(
                    tx, row["tenant_id"], audited_by, "key.revoke", key_id, user_id=row["user_id"]
                )
        return row is not None

    async def has_api_keys(self) -> bool:
        async with self.read() as tx:
            row = await tx.fetchone("SELECT 1 AS one FROM api_keys LIMIT 1")
        return row is not None


def _key(row: Row) -> ApiKeyRow:
    revoked = row["revoked_at"]
    return ApiKeyRow(
        key_id=str(row["key_id"]),
        key_hash=str(row["key_hash"]),
        tenant_id=str(row["tenant_id"]),
        user_id=str(row["user_id"]),
        roles=[str(r) for r in json.loads(row["roles"])],
        scopes=[str(s) for s in json.loads(row["scopes"])],
        label=row["label"],
        created_at=datetime.fromisoformat(str(row["created_at"])),
        revoked_at=datetime.fromisoformat(str(revoked)) if revoked else None,
    )
