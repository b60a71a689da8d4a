"""Approvals: the inbox, and the one decision per approval."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from runtime.engine import Engine
from runtime.errors import Code, RuntimeProblem
from runtime.model import Approval, ApprovalStatus, Run, Strict, UnreadableApproval
from runtime.store.records import ShownApproval
from server.api.deps import EngineDep, PrincipalDep, RunDep, ServicesDep, StoreDep
from server.api.openapi import AUTHENTICATED, OF_A_RUN, WITH_BODY, headers, problem_responses
from server.api.paging import next_link
from server.api.params import DIGITS
from server.api.redaction import RunTools
from server.api.waiting import (
    PREFER_WAIT,
    VARY,
    applied,
    log_unanswered,
    settled,
    settled_in_slot,
    wait_preference,
    wait_slot,
)
from server.auth.principal import APPROVER

APPROVAL_STATUSES = get_args(ApprovalStatus)

router = APIRouter(tags=["approvals"])


class DecisionRequest(Strict):
    decision: Literal["approve", "reject"]
    comment: str | None = Field(default=None, max_length=2000)
    decided_by: str | None = Field(default=None, min_length=1, max_length=200)
    """Optional; when given it must be the caller: the decider is who authenticated."""


@router.get(
    "/approvals",
    response_model=list[Approval | UnreadableApproval],
    responses={**problem_responses(*AUTHENTICATED), 200: {"headers": headers("Link")}},
)
async def list_approvals(
    request: Request,
    response: Response,
    store: StoreDep,
    principal: PrincipalDep,
    state: Annotated[list[ApprovalStatus] | None, Query(max_length=len(APPROVAL_STATUSES))] = None,
    run_id: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=500), DIGITS] = 100,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> list[ShownApproval]:
    """Oldest first. A fuller inbox than ``limit`` says where its next page is in a
    ``Link: <…>; rel="next"`` header (RFC 8288), the list itself staying a list. An
    approval whose stored row no longer validates is listed marked, ``"unreadable":
    true``, by its keys and status as stored. ``state`` (``pending`` if not given),
    given more than once: approvals in any of them (it took the last one given)."""
    page, next_cursor = await store.page_approvals(
        statuses=state or ["pending"],
        run_id=run_id,
        tenant_id=principal.tenant_id,
        limit=limit,
        cursor=cursor,
    )
    if next_cursor is not None:
        response.headers["Link"] = next_link(request, cursor=next_cursor)
    return page


class DecisionResult(Approval):
    """The approval as decided; with ``Prefer: wait``, also the run after it."""

    run: Run | None = None
    """Only where ``Prefer: wait=N`` was applied: the run once it is parked again or has
    ended (or as it is after N seconds), as ``GET /runs/{id}`` with the same preference
    would answer. LangGraph's resume through ``runs/wait`` in one request."""


@router.post(
    "/runs/{run_id}/approvals/{approval_id}",
    response_model=DecisionResult,
    responses={
        **problem_responses(
            *OF_A_RUN,
            *WITH_BODY,
            Code.APPROVAL_NOT_FOUND,
            Code.PRINCIPAL_MISMATCH,
            Code.ROLE_REQUIRED,
            Code.FOUR_EYES,
            Code.APPROVAL_CONFLICT,
            Code.RUN_STATE_CONFLICT,
            Code.TOO_MANY_STREAMS,  # a waiting decision holds a stream slot
        ),
        200: {
            "description": "The same decision, taken before: nothing done again",
            "headers": headers("Preference-Applied"),
        },
        202: {
            "model": DecisionResult,
            "description": "decided now; the run resumes",
            "headers": headers("Preference-Applied"),
        },
    },
)
async def decide(
    run: RunDep,
    approval_id: Annotated[str, Path(max_length=200)],
    body: DecisionRequest,
    engine: EngineDep,
    store: StoreDep,
    services: ServicesDep,
    principal: PrincipalDep,
    request: Request,
    # Read with every Prefer line by wait_preference; declared for the API's docs.
    _prefer: Annotated[str | None, Header(alias="prefer", description=PREFER_WAIT)] = None,
) -> JSONResponse:
    approval = await store.shown_approval(approval_id)
    if approval is None or approval.run_id != run.run_id:
        raise RuntimeProblem(Code.APPROVAL_NOT_FOUND, f"no approval {approval_id} on {run.run_id}")
    if body.decided_by is not None and body.decided_by != principal.user_id:
        raise RuntimeProblem(Code.PRINCIPAL_MISMATCH, "decided_by must be the caller")
    if not principal.has_role(APPROVER):
        raise RuntimeProblem(Code.ROLE_REQUIRED, "deciding an approval needs the approver role")
    if principal.user_id == run.context.user_id and (
        # Its tool unknown, as if it forbade self-approval (four_eyes does the same).
        isinstance(approval, UnreadableApproval)
        or four_eyes(engine, run, approval.tool, approval.version)
    ):
        raise RuntimeProblem(
            Code.FOUR_EYES, "the user who started the run cannot approve its own action"
        )
    if isinstance(approval, UnreadableApproval):
        # Nobody can see what they would decide on (its tool, its arguments), nor can
        # the run read it when it resumes: the run is to be cancelled, not resumed.
        raise RuntimeProblem(
            Code.RUN_STATE_CONFLICT,
            f"approval {approval_id} is stored in a form that no longer validates"
            f" ({'; '.join(approval.problems)}): it cannot be decided; cancel the run",
        )
    wait_s = wait_preference(request, services.settings.max_wait_s)
    headers = dict(VARY)
    # A first decision takes its slot before it decides (a 429 never follows a decision
    # made anyway); a repeat decides nothing, and takes one only if it has to wait.
    first = approval.status == "pending"
    with wait_slot(services, principal, wait_s if first else None):
        approval, won = await engine.decide(
            run.run_id,
            approval_id,
            body.decision,
            decided_by=principal.user_id,
            comment=body.comment,
            via=principal.via,
        )
        answer = approval.model_dump(mode="json")
        if wait_s is not None:
            try:
                now = await store.get_run(run.run_id)
                if now is None:
                    raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run.run_id}")
                waited = (
                    await settled(services, request, now, wait_s)  # in the slot taken above
                    if first
                    else await settled_in_slot(services, principal, request, now, wait_s)
                )
                answer["run"] = waited.model_dump(mode="json")
                headers.update(applied(wait_s))
            except Exception as exc:
                if not won:  # this request decided nothing: its failure is the answer
                    raise
                # The decision is made: say so, not that deciding failed (the client
                # would decide again and be told it had, or 409 for the other one).
                log_unanswered(f"after a decision on {run.run_id}", exc)
    return JSONResponse(answer, status_code=202 if won else 200, headers=headers)


def four_eyes(engine: Engine, run: Run, tool: str, version: str) -> bool:
    """Whether the tool forbids self-approval; an unknown tool is treated as if it did."""
    spec = RunTools(engine, run).resolve(tool, version or None)
    return spec is None or spec.four_eyes
