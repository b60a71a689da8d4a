"""Runs: create, read, list, follow, audit, cancel."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field, StringConstraints

from nodes.handoff import scoped, top
from runtime.errors import Code, RuntimeProblem
from runtime.lifecycle import TERMINAL, State
from runtime.model import (
    MAX_SCOPES,
    Page,
    Run,
    RunContext,
    RunCreate,
    Strict,
    Usage,
)
from runtime.planner import Observation
from runtime.store.records import ShownEvent, ShownStep, ShownToolCall
from server.api.deps import (
    EngineDep,
    PrincipalDep,
    RunDep,
    ServicesDep,
    StoreDep,
    may_steer,
)
from server.api.negotiation import prefers
from server.api.openapi import (
    AUTHENTICATED,
    OF_A_RUN,
    WITH_BODY,
    headers,
    problem_responses,
)
from server.api.paging import next_link
from server.api.params import DIGITS
from server.api.redaction import RunTools, redact_steps, redact_tool_calls
from server.api.trace import Trace, trace_body, trace_head
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
from server.auth import Principal
from server.sse import event_stream

MAX_SEQ = 10**15
MAX_EVENT_PAGE = 10_000
"""The most events one JSON page holds (the SSE stream has no such bound)."""
router = APIRouter(tags=["runs"])


class CancelRequest(Strict):
    reason: str = Field(default="cancelled by request", max_length=2000)
    compensate: bool = False
    """Also run the declared compensations of side effects that already happened."""


_CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **problem_responses(
        *AUTHENTICATED,
        *WITH_BODY,
        Code.PRINCIPAL_MISMATCH,
        Code.SCOPE_NOT_GRANTED,
        Code.AGENT_NOT_FOUND,
        Code.IDEMPOTENCY_CONFLICT,
        Code.TENANT_RUN_LIMIT,
        Code.TOO_MANY_STREAMS,  # a waiting create holds a stream slot
    ),
    201: {"description": "The run, created", "headers": headers("Location", "Preference-Applied")},
    200: {
        "model": Run,
        "description": "The run already created with this idempotency key",
        "headers": headers("Location", "Preference-Applied"),
    },
}


@router.post("/runs", status_code=201, response_model=Run, responses=_CREATE_RESPONSES)
# DESIGN §5 lists the alias in the stable surface: documented, and not deprecated, so a
# client generated from the document may call either.
@router.post(
    "/run",
    status_code=201,
    response_model=Run,
    responses=_CREATE_RESPONSES,
    operation_id="create_run_alias",
    summary="Create Run (alias of POST /runs)",
    description="The same operation as `POST /runs`, under the name the design also gives it.",
    openapi_extra={"x-alias-of": "create_run_runs_post"},
)
async def create_run(
    body: RunCreate,
    request: Request,
    engine: EngineDep,
    services: ServicesDep,
    principal: PrincipalDep,
    # Printable ASCII: a header arrives as bytes, read as latin-1, so "café" would be
    # stored as "cafÃ©" and name another run than the same key in the body.
    idempotency_key: Annotated[
        str | None, Header(min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$")
    ] = None,
    # Read with every Prefer line by wait_preference; declared for the API's docs.
    _prefer: Annotated[str | None, Header(alias="prefer", description=PREFER_WAIT)] = None,
) -> Any:
    body.context = context_for(body, principal)
    if len(request.headers.getlist("idempotency-key")) > 1:
        raise RuntimeProblem(Code.VALIDATION_ERROR, "more than one Idempotency-Key header")
    if idempotency_key is not None:
        if body.options.idempotency_key not in (None, idempotency_key):
            raise RuntimeProblem(
                Code.VALIDATION_ERROR, "Idempotency-Key header and options.idempotency_key differ"
            )
        body.options.idempotency_key = idempotency_key
    wait_s = wait_preference(request, services.settings.max_wait_s)
    # The slot is taken before a run is made (a 429 never follows a run made anyway);
    # a replay of a create whose run is parked or ended waits for nothing, and holds none.
    slot, at_rest = wait_s, None
    if wait_s:
        replayed = await engine.replayed(body)
        at_rest = None if replayed is None else await engine.settled_now(replayed.run_id)
        if at_rest is not None:
            slot = None
    with wait_slot(services, principal, slot):
        run, created = await engine.create_run(
            body, max_active=services.settings.max_active_runs_per_tenant
        )
        headers = {"Location": str(request.url_for("get_run", run_id=run.run_id).path), **VARY}
        if wait_s is not None:
            try:
                # Without a slot, no waiting: the replay answers with the run as found.
                if at_rest is not None and not created and at_rest.run_id == run.run_id:
                    run = at_rest
                else:
                    run = await settled(services, request, run, wait_s)
                headers.update(applied(wait_s))
            except Exception as exc:
                # The run exists: say so (201 and where it is), not that creating failed,
                # or a client retrying without an idempotency key makes a second one.
                log_unanswered(f"on new run {run.run_id}", exc)
    return JSONResponse(
        run.model_dump(mode="json"), status_code=201 if created else 200, headers=headers
    )


def context_for(body: RunCreate, principal: Principal) -> RunContext:
    """The run's context: who it is for comes from the caller, never from the body."""
    given = body.context.model_fields_set
    for name, own in (("tenant_id", principal.tenant_id), ("user_id", principal.user_id)):
        if name in given and getattr(body.context, name) != own:
            raise RuntimeProblem(
                Code.PRINCIPAL_MISMATCH, f"context.{name} must be the caller's own ({own!r})"
            )
    if "scope" in given:
        missing = [s for s in body.context.scope if not principal.grants(s)]
        if missing:
            raise RuntimeProblem(
                Code.SCOPE_NOT_GRANTED, f"the caller does not hold scope {', '.join(missing)}"
            )
        scope = body.context.scope
    else:
        scope = principal.default_scope
        if len(scope) > MAX_SCOPES:
            raise RuntimeProblem(
                Code.VALIDATION_ERROR,
                f"the caller holds {len(scope)} scopes, more than a run carries "
                f"({MAX_SCOPES}): name the run's own in context.scope",
            )
    return body.context.model_copy(
        update={"tenant_id": principal.tenant_id, "user_id": principal.user_id, "scope": scope}
    )


AgentIdFilter = Annotated[str, StringConstraints(min_length=1, max_length=100)]
MAX_AGENT_FILTERS = 20


@router.get("/runs", response_model=Page[Run], responses=problem_responses(*AUTHENTICATED))
async def list_runs(
    store: StoreDep,
    principal: PrincipalDep,
    state: Annotated[list[State] | None, Query(max_length=len(State))] = None,
    agent_id: Annotated[list[AgentIdFilter] | None, Query(max_length=MAX_AGENT_FILTERS)] = None,
    limit: Annotated[int, Query(ge=1, le=200), DIGITS] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page[Run]:
    """Newest first; ``state`` or ``agent_id`` given more than once: runs in any of
    them (each took the last one given)."""
    runs, next_cursor = await store.list_runs(
        states=[s.value for s in state or ()],
        agent_ids=agent_id or (),
        tenant_id=principal.tenant_id,
        limit=limit,
        cursor=cursor,
    )
    return Page[Run](items=runs, next_cursor=next_cursor)


@router.get(
    "/runs/{run_id}",
    response_model=Run,
    responses={
        **problem_responses(*OF_A_RUN, Code.TOO_MANY_STREAMS),  # a wait holds a slot
        200: {"headers": headers("Preference-Applied")},
    },
)
async def get_run(
    run: RunDep,
    services: ServicesDep,
    principal: PrincipalDep,
    request: Request,
    response: Response,
    # Read with every Prefer line by wait_preference; declared for the API's docs.
    _prefer: Annotated[str | None, Header(alias="prefer", description=PREFER_WAIT)] = None,
) -> Run:
    response.headers.update(VARY)
    wait_s = wait_preference(request, services.settings.max_wait_s)
    if wait_s is None:
        return run
    response.headers.update(applied(wait_s))
    return await settled_in_slot(services, principal, request, run, wait_s)


ACCEPT = {"Vary": "Accept"}
"""The events are a stream or a JSON page by ``Accept``: a cache must not answer one
for the other (RFC 9110 §12.5.5)."""


@router.get(
    "/runs/{run_id}/events",
    response_model=list[ShownEvent],
    responses={
        **problem_responses(*OF_A_RUN, Code.TOO_MANY_STREAMS),
        200: {
            "description": "The run's events: as JSON if `Accept` prefers it, else a stream",
            # The JSON form's schema comes from response_model.
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "headers": headers("Link"),  # the JSON form's next page
        },
    },
)
async def run_events(
    run: RunDep,
    services: ServicesDep,
    principal: PrincipalDep,
    request: Request,
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ), DIGITS] = None,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENT_PAGE), DIGITS] = MAX_EVENT_PAGE,
) -> Response:
    """SSE by default. As JSON, at most ``limit`` events after ``after``; a longer log
    says where its next page is in a ``Link: <…>; rel="next"`` header. An event that
    no longer validates is shown unreadable (as SSE: ``event: unreadable``)."""
    start = after or 0
    if last_event_id is not None:
        if not re.fullmatch(r"[0-9]{1,15}", last_event_id):
            raise RuntimeProblem(Code.VALIDATION_ERROR, "Last-Event-ID must be a sequence number")
        start = max(start, int(last_event_id))
    accept = ", ".join(request.headers.getlist("accept"))  # lines of one field, one list
    if prefers(accept, "application/json", "text/event-stream"):
        events = await services.store.shown_events(run.run_id, start, limit=limit + 1)
        page = JSONResponse([e.model_dump(mode="json") for e in events[:limit]], headers=ACCEPT)
        if len(events) > limit:
            page.headers["Link"] = next_link(request, after=events[limit - 1].seq)
        return page
    release = services.streams.acquire(
        (principal.tenant_id, principal.user_id), services.settings.max_streams_per_principal
    )
    stream = event_stream(
        services.store,
        services.bus,
        run.run_id,
        start,
        services.settings.sse_keepalive_s,
        services.stopping,
        services.auth.recheck(request.headers.get("authorization")),
    )
    return StreamingResponse(
        services.streams.hold(stream, release),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **ACCEPT},
    )


@router.get(
    "/runs/{run_id}/steps", response_model=list[ShownStep], responses=problem_responses(*OF_A_RUN)
)
async def run_steps(run: RunDep, store: StoreDep, engine: EngineDep) -> list[ShownStep]:
    """The run's steps; one that no longer validates is shown unreadable."""
    return redact_steps(RunTools(engine, run), await store.shown_steps(run.run_id))


@router.get(
    "/runs/{run_id}/tool-calls",
    response_model=list[ShownToolCall],
    responses=problem_responses(*OF_A_RUN),
)
async def run_tool_calls(run: RunDep, store: StoreDep, engine: EngineDep) -> list[ShownToolCall]:
    """The run's ledger; a row that no longer validates is shown unreadable."""
    return redact_tool_calls(RunTools(engine, run), await store.shown_tool_calls(run.run_id))


@router.get("/runs/{run_id}/trace", response_model=Trace, responses=problem_responses(*OF_A_RUN))
async def run_trace(run: RunDep, store: StoreDep, engine: EngineDep) -> StreamingResponse:
    """The whole record as of one instant, its events streamed (server.api.trace): no
    cap, no page."""
    record = await store.run_record(run.run_id)
    if record is None:  # pruned since it was authorised
        raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run.run_id} not found")
    head = trace_head(RunTools(engine, record.run), record)
    return StreamingResponse(trace_body(store, record, head), media_type="application/json")


class PlannerContext(BaseModel):
    """What the planner was handed to decide a step (the checkpoint view's
    ``planner_context_ref``), read back from the checkpoint written just before."""

    run_id: str
    step_index: int
    agent_id: str
    """The agent that planned: the run's own, or a sub-agent it had handed off to."""
    input: str
    """The run's input, or a sub-agent's task."""
    task_data: dict[str, Any] | None = None
    observations: list[Observation]
    """What that agent had seen by then: summaries and refs (ledger ids, artifacts)."""
    usage: Usage
    """The run's budget used before the step."""


@router.get(
    "/runs/{run_id}/planner-context/{step}",
    response_model=PlannerContext,
    responses=problem_responses(*OF_A_RUN, Code.STEP_NOT_FOUND),
)
async def planner_context(
    run: RunDep,
    engine: EngineDep,
    store: StoreDep,
    step: Annotated[int, Path(ge=0, le=10**6), DIGITS],
) -> PlannerContext:
    """Only for a step that was decided (listed in ``/steps``): one whose planner failed
    or was never asked (a budget ran out) has no decision to explain."""
    values = None
    if await store.get_step(run.run_id, step) is not None:  # cheap, before any checkpoint
        values = await engine.state_before_planning(run, step)
    if values is None:
        raise RuntimeProblem(Code.STEP_NOT_FOUND, f"{run.run_id} decided no step {step}")
    view = scoped(values)  # type: ignore[arg-type]
    frame = top(values)  # type: ignore[arg-type]
    return PlannerContext(
        run_id=run.run_id,
        step_index=step,
        agent_id=run.agent_id if frame is None else str(frame["agent_id"]),
        input=str(view.get("input") or ""),
        task_data=view.get("task_data"),  # type: ignore[typeddict-item]
        observations=[Observation.model_validate(o) for o in view.get("observations", [])],
        usage=Usage.model_validate(values.get("usage") or {}),
    )


@router.get("/runs/{run_id}/checkpoint", responses=problem_responses(*OF_A_RUN))
async def run_checkpoint(run: RunDep, engine: EngineDep) -> dict[str, Any]:
    return await engine.checkpoint(run)


@router.post(
    "/runs/{run_id}/cancel",
    response_model=Run,
    responses={
        **problem_responses(*OF_A_RUN, *WITH_BODY, Code.ROLE_REQUIRED, Code.RUN_STATE_CONFLICT),
        202: {"model": Run, "description": "cancel recorded; the run is still stopping"},
    },
)
async def cancel_run(
    run: RunDep, engine: EngineDep, principal: PrincipalDep, body: CancelRequest | None = None
) -> JSONResponse:
    if not may_steer(principal, run):
        raise RuntimeProblem(
            Code.ROLE_REQUIRED, "only the run's own user or a tenant admin may cancel it"
        )
    body = body or CancelRequest()
    after = await engine.cancel(
        run.run_id, body.reason, compensate=body.compensate, requested_by=principal.user_id
    )
    done = after.state in TERMINAL
    return JSONResponse(after.model_dump(mode="json"), status_code=200 if done else 202)
