"""An in-process app on each database, driven through its HTTP interface."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from runtime.agent import AgentSpec
from runtime.engine import Engine
from server.api.deps import Services
from server.app import create_app
from server.settings import Settings
from tests.api.contract import TALLY, Contract
from tests.auth import MGR, OPS, TEST_JWT_SECRET

QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"
"""The demo's question: the retail analyst queries, hands off a report, asks to publish."""
EAST = {"user_id": "u-ops-001", "tenant_id": "demo-retail", "scope": ["sales_region:east"]}
"""The context of the tests' runs: the OPS caller, with the scope the question needs."""


@dataclass
class Api:
    client: httpx.AsyncClient
    engine: Engine
    settings: Settings
    engine_services: Services
    app: FastAPI | None = None

    async def create(self, **body: Any) -> dict[str, Any]:
        body.setdefault("input", QUESTION)
        body.setdefault("context", EAST)
        # The client calls as u-ops-001 of demo-retail (OPS): the context names the caller.
        resp = await self.client.post("/runs", json=body)
        assert resp.status_code == 201, resp.text
        run: dict[str, Any] = resp.json()
        return run

    async def settle(self, run_id: str) -> dict[str, Any]:
        """Wait until this process's driver is done with the run; return the run."""
        await self.engine.wait_settled(run_id)
        resp = await self.client.get(f"/runs/{run_id}")
        assert resp.status_code == 200, resp.text
        run: dict[str, Any] = resp.json()
        return run

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        resp = await self.client.get(
            f"/runs/{run_id}/events", headers={"Accept": "application/json"}
        )
        assert resp.status_code == 200, resp.text
        events: list[dict[str, Any]] = resp.json()
        return events

    async def wait_event(
        self, run_id: str, predicate: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """Wait for the first event of the run that matches, woken by the event bus."""
        services = self.engine_services
        with services.bus.subscribe(run_id) as waiter:
            while True:
                waiter.clear()
                for event in await self.events(run_id):
                    if predicate(event):
                        return event
                await asyncio.wait_for(waiter.wait(), 30)

    async def decide(self, run_id: str, approval_id: str, decision: str) -> httpx.Response:
        return await self.client.post(
            f"/runs/{run_id}/approvals/{approval_id}",
            json={"decision": decision},
            headers=MGR,
        )


def states(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["to"] for e in events if e["type"] == "state"]


def make_settings(database_url: str, data_dir: Path, **overrides: Any) -> Settings:
    """The test agents, HS256 tokens from tests.auth, no local keys; plus ``overrides``."""
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents", "tests.security_agents:build_agents"],
        jwt_hs256_secret=TEST_JWT_SECRET,
        bootstrap_local_keys=False,
        **overrides,
    )


@pytest.fixture(scope="session", autouse=True)
def _contract_checked() -> Iterator[None]:
    """The API tests' responses were checked against the OpenAPI document: a hook that
    stopped running would pass every test and prove nothing."""
    apps, checked = TALLY.apps, TALLY.checked
    yield
    if TALLY.apps > apps:
        assert TALLY.checked > checked, "no response was checked against the OpenAPI document"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(
        f"OpenAPI contract: {TALLY.checked} responses checked in {TALLY.seconds:.1f} s"
        f" ({TALLY.undocumented} to no documented operation)"
    )


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return make_settings(database_url, data_dir)


@asynccontextmanager
async def open_api(
    settings: Settings,
    agents: Mapping[str, AgentSpec] | None = None,
    headers: Mapping[str, str] = OPS,
) -> AsyncIterator[Api]:
    """The app, started, behind a client that calls as ``headers`` say (OPS by default),
    and that checks every response against the app's OpenAPI document (tests.api.contract)."""
    app = create_app(settings, agents)
    TALLY.apps += 1
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://test",
            headers=dict(headers),
            event_hooks={"response": [Contract(app).check]},
        ) as client:
            services = app.state.services
            yield Api(client, services.engine, settings, services, app)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    async with open_api(settings) as opened:
        yield opened
