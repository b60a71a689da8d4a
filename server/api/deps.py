"""Typed dependencies for the routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from runtime.engine import Engine
from runtime.errors import Code, RuntimeProblem
from runtime.eventbus import EventBus
from runtime.model import Run
from runtime.store.base import RunStore
from server.settings import Settings


@dataclass
class Services:
    settings: Settings
    store: RunStore
    engine: Engine
    bus: EventBus


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


async def get_run(run_id: str, store: StoreDep) -> Run:
    run = await store.get_run(run_id)
    if run is None:
        raise RuntimeProblem(Code.RUN_NOT_FOUND, f"no run {run_id}")
    return run


RunDep = Annotated[Run, Depends(get_run)]
