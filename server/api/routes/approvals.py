"""Approvals: the inbox, and the one decision per approval."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from runtime.engine import Engine
from runtime.errors import Code, RuntimeProblem
from runtime.model import Approval, ApprovalStatus, Run, Strict
from server.api.deps import EngineDep, PrincipalDep, RunDep, StoreDep
from server.api.paging import next_link
from server.api.problems import PROBLEM_RESPONSES
from server.api.redaction import RunTools
from server.auth.principal import APPROVER

router = APIRouter(tags=["approvals"], responses=PROBLEM_RESPONSES)


class DecisionRequest(Strict):
    decision: Literal["approve", "reject"]
    comment: str | None = Field(default=None, max_length=2000)
    decided_by: str | None = Field(default=None, min_length=1, max_length=200)
    """Optional; when given it must be the caller: the decider is who authenticated."""


@router.get("/approvals", response_model=list[Approval])
async def list_approvals(
    request: Request,
    response: Response,
    store: StoreDep,
    principal: PrincipalDep,
    state: ApprovalStatus | None = "pending",
    run_id: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> list[Approval]:
    """Oldest first. A fuller inbox than ``limit`` says where its next page is in a
    ``Link: <…>; rel="next"`` header (RFC 8288), the list itself staying a list."""
    page, next_cursor = await store.page_approvals(
        status=state, run_id=run_id, tenant_id=principal.tenant_id, limit=limit, cursor=cursor
    )
    if next_cursor is not None:
        response.headers["Link"] = next_link(request, cursor=next_cursor)
    return page


@router.post(
    "/runs/{run_id}/approvals/{approval_id}",
    response_model=Approval,
    responses={202: {"model": Approval, "description": "decided now; the run resumes"}},
)
async def decide(
    run: RunDep,
    approval_id: Annotated[str, Path(max_length=200)],
    body: DecisionRequest,
    engine: EngineDep,
    store: StoreDep,
    principal: PrincipalDep,
) -> JSONResponse:
    approval = await store.get_approval(approval_id)
    if approval is None or approval.run_id != run.run_id:
        raise RuntimeProblem(Code.APPROVAL_NOT_FOUND, f"no approval {approval_id} on {run.run_id}")
    if body.decided_by is not None and body.decided_by != principal.user_id:
        raise RuntimeProblem(Code.PRINCIPAL_MISMATCH, "decided_by must be the caller")
    if not principal.has_role(APPROVER):
        raise RuntimeProblem(Code.ROLE_REQUIRED, "deciding an approval needs the approver role")
    if principal.user_id == run.context.user_id and four_eyes(
        engine, run, approval.tool, approval.version
    ):
        raise RuntimeProblem(
            Code.FOUR_EYES, "the user who started the run cannot approve its own action"
        )
    approval, won = await engine.decide(
        run.run_id,
        approval_id,
        body.decision,
        decided_by=principal.user_id,
        comment=body.comment,
        via=principal.via,
    )
    return JSONResponse(approval.model_dump(mode="json"), status_code=202 if won else 200)


def four_eyes(engine: Engine, run: Run, tool: str, version: str) -> bool:
    """Whether the tool forbids self-approval; an unknown tool is treated as if it did."""
    spec = RunTools(engine, run).resolve(tool, version or None)
    return spec is None or spec.four_eyes
