"""Approvals: the inbox, and the one decision per approval."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import Field

from runtime.model import Approval, ApprovalStatus, Strict
from server.api.deps import EngineDep, RunDep, StoreDep
from server.api.problems import PROBLEM_RESPONSES

router = APIRouter(tags=["approvals"], responses=PROBLEM_RESPONSES)


class DecisionRequest(Strict):
    decision: Literal["approve", "reject"]
    comment: str | None = Field(default=None, max_length=2000)
    decided_by: str = Field(default="anonymous", min_length=1, max_length=200)


@router.get("/approvals", response_model=list[Approval])
async def list_approvals(
    store: StoreDep,
    state: ApprovalStatus | None = "pending",
    run_id: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[Approval]:
    return await store.list_approvals(status=state, run_id=run_id, limit=limit)


@router.post(
    "/runs/{run_id}/approvals/{approval_id}",
    response_model=Approval,
    responses={202: {"model": Approval, "description": "decided now; the run resumes"}},
)
async def decide(
    run: RunDep, approval_id: str, body: DecisionRequest, engine: EngineDep
) -> JSONResponse:
    approval, won = await engine.decide(
        run.run_id, approval_id, body.decision, decided_by=body.decided_by, comment=body.comment
    )
    return JSONResponse(approval.model_dump(mode="json"), status_code=202 if won else 200)
