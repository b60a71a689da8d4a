"""Every HTTP request the benchmarks make to *our* server goes through this module.

When the server requires authentication (``Authorization: Bearer <token>`` on every
route but ``/healthz``), set ``AGENT_RUNTIME_TOKEN`` in the benchmark's environment:
:func:`server_headers` adds it to every request, and :func:`server_env` passes it to
the server and worker processes the benchmarks start. Requests to ``langgraph dev``
(the peer) do not use it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import httpx

TOKEN_ENV = "AGENT_RUNTIME_TOKEN"


def server_headers() -> dict[str, str]:
    """Headers every request to our server carries (``Authorization`` once auth is on)."""
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def server_env() -> dict[str, str]:
    """Environment a benchmark's server/worker subprocess needs for :func:`server_headers`.

    The integrator maps the token onto whatever setting the server reads (e.g.
    ``AGENT_RUNTIME_API_TOKENS``); today the token is passed through unchanged.
    """
    token = os.environ.get(TOKEN_ENV)
    return {TOKEN_ENV: token} if token else {}


def async_client(base_url: str, connections: int = 100, timeout: float = 60) -> httpx.AsyncClient:
    """An async client for our server, with :func:`server_headers` on every request."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(
        base_url=base_url, headers=server_headers(), timeout=timeout, limits=limits
    )


def sync_client(base_url: str, timeout: float = 30) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers=server_headers(), timeout=timeout)


async def follow(
    client: httpx.AsyncClient,
    run_id: str,
    until: Callable[[dict[str, Any]], bool],
    after: int = 0,
    read_timeout: float = 120,
) -> list[dict[str, Any]]:
    """Read ``GET /runs/{id}/events`` (SSE) from ``after`` until ``until(event)``; the events."""
    events: list[dict[str, Any]] = []
    headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
    async with client.stream(
        "GET", f"/runs/{run_id}/events", headers=headers, timeout=read_timeout
    ) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                events.append(event)
                if until(event):
                    return events
    raise RuntimeError(f"stream of {run_id} ended before the awaited event: {events[-3:]}")


def state_is(*states: str) -> Callable[[dict[str, Any]], bool]:
    def until(event: dict[str, Any]) -> bool:
        data = event.get("data")
        return event.get("type") == "state" and isinstance(data, dict) and data["to"] in states

    return until
