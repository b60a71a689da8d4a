"""Bearer tokens for tests: HS256 JWTs for any principal, signed with the test secret."""

from __future__ import annotations

import time
from collections.abc import Iterable

import jwt

TEST_JWT_SECRET = "agent-runtime-tests-only-secret-0123456789"


OPS_USER, OPS_TENANT = "u-ops-001", "demo-retail"
"""Whom :data:`OPS` (and a token with no principal named) speaks for."""


def token(
    user: str = OPS_USER,
    tenant: str = OPS_TENANT,
    roles: Iterable[str] = (),
    scopes: Iterable[str] = ("*",),
    ttl_s: float = 3600,
) -> str:
    claims = {
        "sub": user,
        "tenant_id": tenant,
        "roles": list(roles),
        "scope": " ".join(scopes),
        "exp": int(time.time() + ttl_s),
    }
    return jwt.encode(claims, TEST_JWT_SECRET, algorithm="HS256")


def bearer(**principal: object) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(**principal)}"}  # type: ignore[arg-type]


OPS = bearer()
"""The user who starts runs in the tests (u-ops-001 of tenant demo-retail, any scope)."""
MGR = bearer(user="u-mgr-002", roles=["approver"])
"""An approver of the same tenant: the second pair of eyes."""
