"""Every HTTP request the benchmarks make to *our* server goes through this module.

The servers the benchmarks start accept HS256 JWTs signed with a secret made for this
benchmark process (:func:`server_env`); every request carries a token for the user who
starts runs (:func:`server_headers`), approvals one for a second user with the approver
role (:func:`approver_headers`), as four-eyes requires. The per-tenant run and stream
limits are lifted: the benchmarks measure throughput, not those limits. Requests to
``langgraph dev`` (the peer) carry no token.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import httpx
import jwt

_SECRET = secrets.token_urlsafe(32)
TENANT = "bench"


def _bearer(user: str, roles: list[str]) -> dict[str, str]:
    claims = {
        "sub": user,
        "tenant_id": TENANT,
        "roles": roles,
        "scope": "*",
        "exp": int(time.time()) + 86_400,
    }
    return {"Authorization": f"Bearer {jwt.encode(claims, _SECRET, algorithm='HS256')}"}


def server_headers() -> dict[str, str]:
    """Headers every request to our server carries: the user who starts the runs."""
    return _bearer("bench-ops", [])


def approver_headers() -> dict[str, str]:
    """A second user of the tenant, with the approver role."""
    return _bearer("bench-mgr", ["approver"])


def server_env() -> dict[str, str]:
    """Settings of a benchmark's server/worker subprocesses."""
    return {
        "AGENT_RUNTIME_JWT_HS256_SECRET": _SECRET,
        "AGENT_RUNTIME_BOOTSTRAP_LOCAL_KEYS": "false",
        "AGENT_RUNTIME_MAX_ACTIVE_RUNS_PER_TENANT": "1000000",
        "AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL": "100000",
    }


def async_client(base_url: str, connections: int = 100, timeout: float = 60) -> httpx.AsyncClient:
    """An async client for our server, with :func:`server_headers` on every request."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(
        base_url=base_url, headers=server_headers(), timeout=timeout, limits=limits
    )


def sync_client(base_url: str, timeout: float = 30) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers=server_headers(), timeout=timeout)


async def frames(
    client: httpx.AsyncClient,
    run_id: str,
    after: int = 0,
    read_timeout: float = 120,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[dict[str, Any]]:
    """``GET /runs/{id}/events`` (SSE) from ``after``: each event as its frame arrives.
    ``opened`` is called once the stream is open. Iterate it under ``aclosing``, or a
    consumer that stops early leaves the stream open until the generator is collected."""
    headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
    async with client.stream(
        "GET", f"/runs/{run_id}/events", headers=headers, timeout=read_timeout
    ) as resp:
        resp.raise_for_status()
        if opened is not None:
            opened()
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                yield json.loads(line[6:])


async def follow(
    client: httpx.AsyncClient,
    run_id: str,
    until: Callable[[dict[str, Any]], bool],
    after: int = 0,
    read_timeout: float = 120,
) -> list[dict[str, Any]]:
    """Read the run's events from ``after`` until ``until(event)``; the events."""
    events: list[dict[str, Any]] = []
    async with aclosing(frames(client, run_id, after, read_timeout)) as stream:
        async for event in stream:
            events.append(event)
            if until(event):
                return events
    raise RuntimeError(f"stream of {run_id} ended before the awaited event: {events[-3:]}")


def state_is(*states: str) -> Callable[[dict[str, Any]], bool]:
    def until(event: dict[str, Any]) -> bool:
        data = event.get("data")
        return event.get("type") == "state" and isinstance(data, dict) and data["to"] in states

    return until
