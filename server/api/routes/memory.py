"""A user's long-term memory (runtime.memory), as that user sees it: what agents keep
about them from one run to the next, and the right to have it forgotten.

Callers reach their own memory; a tenant admin may reach a user of the tenant
(``?user_id=``), to answer an erasure request.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import StringConstraints
from starlette.convertors import Convertor, register_url_convertor

from runtime.aio import KeyedLock, to_the_end
from runtime.errors import Code, RuntimeProblem
from runtime.ids import content_hash
from runtime.memory import MAX_DEPTH, MAX_KEY, MAX_LABEL, Memory
from runtime.store.audit import AuditAction
from runtime.store.codec import decode_cursor, encode_cursor
from server.api.deps import EngineDep, PrincipalDep
from server.api.openapi import AUTHENTICATED, headers, problem_responses
from server.api.paging import next_link
from server.api.params import DIGITS
from server.auth import Principal
from server.auth.principal import ADMIN, NAME_RULE, is_name

router = APIRouter(tags=["memory"])
T = TypeVar("T")

_REFUSALS = problem_responses(*AUTHENTICATED, Code.NOT_FOUND, Code.ROLE_REQUIRED)
"""Of every memory route (memory_of): NOT_FOUND where the server keeps no memory."""

ERASING = KeyedLock()
"""A user's erasures one at a time in this process, so that an item erased by two
requests at once is on the trail once (the store does not say which delete found it).
Processes of a PostgreSQL deployment do not share it: there, such a race can still put
an erasure on the trail twice, never leave one off."""

UserQuery = Annotated[str | None, Query(min_length=1, max_length=200)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL)]
SubQuery = Annotated[list[Label] | None, Query(max_length=MAX_DEPTH)]


def memory_of(engine: EngineDep, principal: Principal, user_id: str | None) -> Memory:
    if engine.memory is None:
        raise RuntimeProblem(Code.NOT_FOUND, "this server keeps no long-term memory")
    if user_id is not None and not is_name(user_id):
        # No principal has such a name: the erasure would go on the trail under a
        # subject that prints as someone else's ("ann\u200b" as "ann").
        raise RuntimeProblem(Code.VALIDATION_ERROR, f"user_id must be {NAME_RULE}")
    user = user_id or principal.user_id
    if user != principal.user_id and not principal.has_role(ADMIN):
        raise RuntimeProblem(Code.ROLE_REQUIRED, "another user's memory needs a tenant admin")
    return Memory(engine.memory, principal.tenant_id, user)


async def audit(
    engine: EngineDep,
    principal: Principal,
    action: AuditAction,
    user_id: str | None,
    **detail: Any,
) -> None:
    """Put an erasure on the tenant's audit trail. After it: were the record to fail,
    the erasure still stands (and the request is a 500)."""
    await engine.store.record_audit(
        principal.tenant_id,
        f"{principal.user_id} via {principal.via}",
        action,
        user_id or principal.user_id,
        **detail,
    )


async def _erased(memory: Memory, erasure: Awaitable[T]) -> T:
    """Carry out an erasure of the user's after the others', and to its end even if the
    client hangs up: between the erasure and its audit entry, that would leave it off
    the trail."""

    async def in_turn() -> T:
        async with ERASING.hold(memory.owner):
            return await erasure

    return await to_the_end(in_turn())


CURSOR = "memory"
"""The first part of a memory listing's cursor: one of another list is refused."""
MAX_OFFSET = 1_000_000


def cursor_offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    [offset] = decode_cursor(cursor, 1, kind=CURSOR)
    # ASCII digits only: str.isdigit() admits "²", which int() refuses.
    if not re.fullmatch(r"[0-9]{1,7}", offset) or int(offset) > MAX_OFFSET:
        raise RuntimeProblem(Code.VALIDATION_ERROR, "cursor is not valid")
    return int(offset)


@router.get("/memory", responses={**_REFUSALS, 200: {"headers": headers("Link")}})
async def list_memory(
    request: Request,
    response: Response,
    engine: EngineDep,
    principal: PrincipalDep,
    user_id: UserQuery = None,
    sub: SubQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000), DIGITS] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, dict[str, Any]]:
    """The memories in a namespace (``?sub=a&sub=b``; the user's top one by default), by
    key, in the store's order (the most recently written first; those written within the
    same second in no set order). More than ``limit``: the next page's address is in a
    ``Link: <…>; rel="next"`` header."""
    memory = memory_of(engine, principal, user_id)
    items, more = await memory.page(*(sub or []), limit=limit, offset=cursor_offset(cursor))
    if more is not None:
        response.headers["Link"] = next_link(request, cursor=encode_cursor(CURSOR, str(more)))
    return items


class AnyKey(Convertor[str]):
    """Any text at all: a key may hold "/" (sent as is or as %2F) and line breaks
    (Starlette's ``path`` is ``.*``, whose dot stops at a newline: a key an agent wrote
    with one was listed, and could not be erased on its own)."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("memory_key", AnyKey())


@router.delete("/memory/{key:memory_key}", status_code=204, responses=_REFUSALS)
async def forget_one(
    key: Annotated[str, Path(min_length=1, max_length=MAX_KEY)],
    engine: EngineDep,
    principal: PrincipalDep,
    user_id: UserQuery = None,
    sub: SubQuery = None,
) -> None:
    memory = memory_of(engine, principal, user_id)

    async def erase() -> None:
        if await memory.get(key, *(sub or [])) is None:
            return  # nothing erased, nothing to put on the trail
        await memory.delete(key, *(sub or []))
        # Which item, as a hash: an agent's key or label may itself say something
        # personal, and the trail outlives the erasure.
        item = content_hash({"sub": sub or [], "key": key})
        await audit(engine, principal, "memory.delete", user_id, item=item, items=1)

    await _erased(memory, erase())


@router.delete("/memory", responses=_REFUSALS)
async def forget_all(
    request: Request, engine: EngineDep, principal: PrincipalDep, user_id: UserQuery = None
) -> dict[str, int]:
    """Everything agents keep about the user, in every namespace: gone."""
    # Any other query parameter refused, not ignored: ``?sub=…`` meant for one entry's
    # route (or a filter this one does not have) erased all of the user's memory.
    unknown = sorted(set(request.query_params) - {"user_id"})
    if unknown:
        raise RuntimeProblem(
            Code.VALIDATION_ERROR,
            f"DELETE /memory erases all of the user's memory and takes only ?user_id=, "
            f"not {', '.join(map(repr, unknown))} (one entry: DELETE /memory/{{key}}?sub=…)",
        )
    memory = memory_of(engine, principal, user_id)

    async def erase() -> int:
        forgotten = await memory.forget()
        await audit(engine, principal, "memory.forget", user_id, forgotten=forgotten)
        return forgotten

    return {"forgotten": await _erased(memory, erase())}
