"""Typed dependencies for the routes: services, the caller, and the caller's objects."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from runtime.engine import Engine
from runtime.errors import Code, RuntimeProblem
from runtime.eventbus import EventBus
from runtime.model import Run
from runtime.store.base import RunStore
from runtime.worker import Worker
from server.auth import Principal
from server.auth.authenticate import Authenticator, one_authorization
from server.auth.principal import ADMIN
from server.settings import Settings
from server.sse import StreamSlots


@dataclass
class Services:
    settings: Settings
    store: RunStore
    engine: Engine
    bus: EventBus
    auth: Authenticator
    streams: StreamSlots = field(default_factory=StreamSlots)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server begins to shut down: waiting requests answer at once."""
    worker: Worker | None = None
    """The process's worker, whose grace starts with the shutdown (None: none)."""


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_store(services: ServicesDep) -> RunStore:
    return services.store


def get_engine(services: ServicesDep) -> Engine:
    return services.engine


StoreDep = Annotated[RunStore, Depends(get_store)]
EngineDep = Annotated[Engine, Depends(get_engine)]


_BEARER = HTTPBearer(
    auto_error=False, description="An API key (`ark_…`) or a JWT; see README, Who may do what."
)


async def get_principal(
    services: ServicesDep,
    request: Request,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
) -> Principal:
    return await services.auth.authenticate(one_authorization(request))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_run(run_id: str, store: StoreDep, principal: PrincipalDep) -> Run:
    run = await store.get_run(run_id)
    # Another tenant's run is as absent as a run that never was: a 403 would confirm it.
    if run is None or run.context.tenant_id != principal.tenant_id:
        raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run_id}")
    return run


RunDep = Annotated[Run, Depends(get_run)]


def may_steer(principal: Principal, run: Run) -> bool:
    """Whether the principal may cancel the run: its own user, or a tenant admin."""
    return principal.user_id == run.context.user_id or principal.has_role(ADMIN)
