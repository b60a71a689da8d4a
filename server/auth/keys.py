"""API keys: ``ark_<key_id>_<secret>``; the store keeps the key's row and a hash of the secret.

The secret is 32 random bytes, so a plain SHA-256 is enough: there is nothing for
a slow hash to protect against that 256 bits of entropy does not already.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from runtime.store.api_keys import NewApiKey
from runtime.store.base import RunStore
from server.auth.principal import NAME_RULE, ROLES, Principal, is_name

PREFIX = "ark_"
_TOKEN = re.compile(r"ark_([a-z0-9]{12})_([A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class NewKey:
    key_id: str
    token: str
    """The whole bearer token; shown once, never stored."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def mint_key(
    *,
    tenant_id: str,
    user_id: str,
    roles: list[str] | None = None,
    scopes: list[str] | None = None,
    label: str | None = None,
) -> tuple[NewKey, NewApiKey]:
    """A new key, checked: its token (for the holder) and its row (for the store)."""
    unknown = set(roles or ()) - ROLES
    if unknown:
        raise ValueError(f"unknown role(s): {', '.join(sorted(unknown))}")
    for what, name in (("tenant", tenant_id), ("user", user_id)):
        if not is_name(name):
            raise ValueError(f"a key needs a {what} id of {NAME_RULE}")
    bad = [scope for scope in scopes or () if not is_name(scope)]
    if bad:
        raise ValueError(f"scopes are names of {NAME_RULE} ({len(bad)} are not)")
    if label is not None and not is_name(label):
        raise ValueError(f"a label is {NAME_RULE}")
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    row = NewApiKey(
        key_id=key_id,
        key_hash=hash_secret(secret),
        tenant_id=tenant_id,
        user_id=user_id,
        roles=sorted(set(roles or ())),
        scopes=sorted(set(scopes or ())),
        label=label,
    )
    return NewKey(key_id, f"{PREFIX}{key_id}_{secret}"), row


async def create_key(
    store: RunStore,
    *,
    tenant_id: str,
    user_id: str,
    roles: list[str] | None = None,
    scopes: list[str] | None = None,
    label: str | None = None,
    audited_by: str | None = None,
) -> NewKey:
    """``audited_by``: who the audit trail says made it, written with it."""
    key, row = mint_key(
        tenant_id=tenant_id, user_id=user_id, roles=roles, scopes=scopes, label=label
    )
    await store.create_api_key(row, audited_by=audited_by)
    return key


async def principal_for_key(store: RunStore, token: str) -> Principal | None:
    """The principal of a live key, or None for a malformed, unknown or revoked one."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return None
    key_id, secret = match.groups()
    row = await store.get_api_key(key_id)
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.key_hash, hash_secret(secret)):
        return None
    return Principal(
        user_id=row.user_id,
        tenant_id=row.tenant_id,
        roles=frozenset(row.roles),
        scopes=frozenset(row.scopes),
        via=f"key:{key_id}",
    )
