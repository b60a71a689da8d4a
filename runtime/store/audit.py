"""The audit trail of what people did outside any run's log.

A run's log (events) already says who created, approved or cancelled it. What has no
run to belong to is kept here, per tenant, oldest first: a user's long-term memory
erased (by the user, or by a tenant admin answering an erasure request), API keys
created and revoked. Rows say who did what to whom, never the content (a memory's
value, a key's secret).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel

from runtime.model import utcnow
from runtime.store.codec import _dec, _enc_col, _iso
from runtime.store.core import StoreCore
from runtime.store.paging import keyset_page
from runtime.store.tx import Tx

AuditAction = Literal["memory.forget", "memory.delete", "key.create", "key.revoke"]
"""Every action the trail records (and GET /audit filters on)."""


class AuditEntry(BaseModel):
    audit_id: str
    at: str
    tenant_id: str
    actor: str
    """Who did it: ``<user_id> via <how they signed in>``, or ``cli`` for an operator."""
    action: AuditAction
    subject: str
    """Whom or what it was done to: a user id, a key id."""
    detail: dict[str, Any]


async def insert_audit(
    tx: Tx, tenant_id: str, actor: str, action: AuditAction, subject: str, **detail: Any
) -> AuditEntry:
    """The entry, written in ``tx``: with what it records, where that is a write of its own."""
    entry = AuditEntry(
        audit_id=f"au-{uuid.uuid4().hex}",
        at=_iso(utcnow(), exact=True),  # pages are ordered by it as text
        tenant_id=tenant_id,
        actor=actor,
        action=action,
        subject=subject,
        detail=detail,
    )
    row = entry.model_dump()
    await tx.execute(
        f"INSERT INTO audit ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
        [_enc_col(k, v) for k, v in row.items()],
    )
    return entry


class AuditQueries(StoreCore):
    async def record_audit(
        self, tenant_id: str, actor: str, action: AuditAction, subject: str, **detail: Any
    ) -> AuditEntry:
        async with self.tx() as tx:
            return await insert_audit(tx, tenant_id, actor, action, subject, **detail)

    async def page_audit(
        self, tenant_id: str, *, action: str | None = None, limit: int, cursor: str | None
    ) -> tuple[list[AuditEntry], str | None]:
        """The tenant's entries, oldest first; the next page's cursor (None: the last)."""
        where, params = ["tenant_id = ?"], [tenant_id]
        if action is not None:
            where.append("action = ?")
            params.append(action)
        rows, next_cursor = await keyset_page(
            self,
            "audit",
            where,
            params,
            ("at", "audit_id"),
            limit=limit,
            cursor=cursor,
            runs=False,
        )
        return [AuditEntry.model_validate(_dec(r)) for r in rows], next_cursor
