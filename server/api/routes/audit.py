"""The tenant's audit trail (runtime.store.audit), for its admins."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from runtime.errors import Code, RuntimeProblem
from runtime.store.audit import AuditAction, AuditEntry
from server.api.deps import PrincipalDep, StoreDep
from server.api.openapi import AUTHENTICATED, headers, problem_responses
from server.api.paging import next_link
from server.api.params import DIGITS
from server.auth.principal import ADMIN

router = APIRouter(tags=["audit"])


@router.get(
    "/audit",
    responses={
        **problem_responses(*AUTHENTICATED, Code.ROLE_REQUIRED),
        200: {"headers": headers("Link")},
    },
)
async def list_audit(
    request: Request,
    response: Response,
    store: StoreDep,
    principal: PrincipalDep,
    action: AuditAction | None = None,
    limit: Annotated[int, Query(ge=1, le=500), DIGITS] = 100,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> list[AuditEntry]:
    """What people did outside any run's log in the caller's tenant, oldest first; a
    longer trail gives its next page in a ``Link: <…>; rel="next"`` header."""
    if not principal.has_role(ADMIN):
        raise RuntimeProblem(Code.ROLE_REQUIRED, "the audit trail needs a tenant admin")
    page, next_cursor = await store.page_audit(
        principal.tenant_id, action=action, limit=limit, cursor=cursor
    )
    if next_cursor is not None:
        response.headers["Link"] = next_link(request, cursor=next_cursor)
    return page
