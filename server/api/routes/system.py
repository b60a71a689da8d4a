"""Agents, artifacts and health."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Request, Response

from graphs.run_graph import handoff_map
from runtime.errors import Code, RuntimeProblem
from server.api.deps import EngineDep, PrincipalDep, StoreDep, get_principal
from server.api.head import is_head
from server.api.openapi import AUTHENTICATED, headers, problem_responses

log = logging.getLogger(__name__)

READY_WITHIN_S = 2.0
"""How long ``/readyz`` waits for the database's answer before it says not ready."""

router = APIRouter()

SAFE_INLINE = {"text/plain", "text/markdown", "application/json", "text/csv"}


@router.get(
    "/agents",
    tags=["agents"],
    dependencies=[Depends(get_principal)],
    responses=problem_responses(*AUTHENTICATED),
)
async def list_agents(engine: EngineDep) -> list[dict[str, Any]]:
    return [
        {
            "agent_id": spec.agent_id,
            "description": spec.description,
            "default": spec.agent_id == engine.default_agent,
            "tools": [t.describe() for t in spec.tools.specs()],
            # Which agent of its graph may hand the run to which (its own id first).
            "handoffs": handoff_map(spec.builder, spec.agent_id),
        }
        for spec in engine.agents.values()
    ]


@router.get(
    "/artifacts/{artifact_id}",
    tags=["artifacts"],
    # No JSON of FastAPI's default: the bytes go in the artifact's own media type.
    response_class=Response,
    responses={
        **problem_responses(*AUTHENTICATED, Code.ARTIFACT_NOT_FOUND),
        200: {
            "description": "The artifact's bytes, in its own media type (text/markdown, say)",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
            "headers": headers("ETag"),
        },
        304: {
            "description": "`If-None-Match` names the artifact: the client holds its bytes",
            "headers": headers("ETag"),
        },
    },
)
async def get_artifact(
    artifact_id: str,
    store: StoreDep,
    principal: PrincipalDep,
    request: Request,
    # Read with every If-None-Match line below; declared for the API's docs.
    _if_none_match: Annotated[str | None, Header(alias="if-none-match")] = None,
) -> Response:
    # Another tenant's artifact is as absent as one that never was; the same bytes
    # written by two tenants are served to each under its own name.
    naming = await store.artifact_for_tenant(artifact_id, principal.tenant_id)
    if naming is None:
        raise RuntimeProblem(Code.ARTIFACT_NOT_FOUND, f"no artifact {artifact_id}")
    etag = f'"{artifact_id}"'
    cached = {"ETag": etag, "Cache-Control": "private, max-age=31536000, immutable"}
    if _matches(request.headers.getlist("if-none-match"), etag):
        # RFC 9110 §13.1.2: the client holds these bytes already (a name that is a
        # hash of them); not read, nor sent, again.
        return Response(status_code=304, headers=cached)
    length: dict[str, str] = {}
    if is_head(request):
        # What a GET would send, but the bytes: not read (a 100 MB artifact took seconds).
        size = await store.artifact_size(artifact_id)
        content, length = (None, {}) if size is None else (b"", {"Content-Length": str(size)})
    else:
        content = await store.artifact_content(artifact_id)
    if content is None:
        raise RuntimeProblem(Code.ARTIFACT_NOT_FOUND, f"no artifact {artifact_id}")
    disposition = "inline" if naming.media_type in SAFE_INLINE else "attachment"
    return Response(
        content,
        media_type=naming.media_type,
        headers={
            "Content-Disposition": content_disposition(disposition, naming.name),
            "X-Content-Type-Options": "nosniff",
            **cached,
            **length,
        },
    )


def _matches(if_none_match: list[str], etag: str) -> bool:
    """Whether If-None-Match (its every line: one list) names ``etag`` (weakly, as
    §13.1.2 compares) or is ``*``."""
    tags = [tag.strip() for line in if_none_match for tag in line.split(",")]
    return "*" in tags or etag in (tag.removeprefix("W/") for tag in tags)


@router.get(
    "/readyz",
    tags=["health"],
    dependencies=[Depends(get_principal)],
    # Its one failure of its own, an unreachable database, is UNAVAILABLE among these.
    responses=problem_responses(*AUTHENTICATED),
)
async def readyz(store: StoreDep) -> dict[str, str]:
    try:
        # A probe is answered within its own bound, not the pool's wait for a
        # connection (30 s), which outlasts any prober's timeout.
        async with asyncio.timeout(READY_WITHIN_S):
            await store.ping()
    except Exception as exc:
        log.warning("not ready: the database did not answer a ping: %r", exc)
        why = (
            f"did not answer within {READY_WITHIN_S:g} s"
            if isinstance(exc, TimeoutError)
            else "is unavailable"
        )
        raise RuntimeProblem(Code.UNAVAILABLE, f"the database {why}", retry_after=1) from exc
    return {"status": "ready"}


def content_disposition(disposition: str, name: str) -> str:
    """RFC 6266: an ASCII fallback name, and the real one UTF-8 encoded (RFC 5987)."""
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name
    )
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
