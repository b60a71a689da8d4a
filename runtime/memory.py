"""Long-term memory: what an agent keeps about a user from one run to the next (DESIGN §6).

It lives in LangGraph's ``BaseStore`` (the engine's is in the run database:
``AsyncSqliteStore`` or ``AsyncPostgresStore``; under ``langgraph dev``, the
server's own), under the namespace ``("memory", tenant_id, user_id, *sub, "=")``. A run
is handed a :class:`Memory` bound to its own tenant and user (tools get it as
``ToolContext.memory``), so no agent can name another user's namespace.

Working memory is something else: it lives in the graph state and its checkpoints.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from langgraph.store.base import BaseStore, PutOp

from runtime.dberrors import ServiceStore
from runtime.storable import reject_unstorable

ROOT = "memory"
LEAF = "="
"""Last label of every namespace holding items. BaseStore searches by namespace prefix,
so without it a search of one namespace would also page through those below it;
:func:`label` never produces it (its labels start with "~")."""


ESCAPED = "~.%_*?[\x00"
"""Escaped in labels: the escape itself, BaseStore's separator (a tenant id may well hold
a dot), and LIKE's and GLOB's wildcards, should a store ever match without escaping."""


MAX_KEY = 1000
"""Characters of a key; MAX_LABEL of a sub-namespace label, MAX_DEPTH labels at most. A
memory is written only within what the API can name, so that its user can see each one
and have it erased on its own (``DELETE /memory/{key}``)."""
MAX_LABEL = 200
MAX_DEPTH = 8
MAX_ADDRESS_BYTES = 2650
"""UTF-8 bytes of an item's namespace and key together: PostgreSQL's store indexes them
as one B-tree entry, refused beyond 2,704 bytes (less when they compress), so without
this bound a long key of varied characters was kept on SQLite and refused on
PostgreSQL with the database's message."""
MAX_VALUE_DEPTH = 32
"""Levels of nesting in a memory's value, the request bound's (``MAX_JSON_DEPTH``): a
deeper one was kept and then failed every listing of its user's memories with a 500
on PostgreSQL (past the serialiser's depth), and was refused on SQLite alone."""
MAX_VALUE_BYTES = 64 * 1024
"""UTF-8 bytes of a memory's value as JSON: a fact kept about a user, not a document
(an artifact is); a listing of a thousand of them stays a response a client can take."""
DOT_SEGMENTS = frozenset({".", ".."})
"""Not a part of a key between slashes: URL clients remove such segments before they
send (RFC 3986 §5.2.4), so ``DELETE /memory/.`` would go out as ``DELETE /memory``,
which erases every memory of the user, and ``/memory/a/b/..`` as another item's."""


def nested_deeper(value: Any, most: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``most`` levels deep (an
    object is one level), found without recursing."""
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list | tuple):
            if depth > most:
                return True
            children = item.values() if isinstance(item, dict) else item
            level.extend((child, depth + 1) for child in children)
    return False


def label(text: str) -> str:
    """A namespace label for ``text``: never empty (BaseStore forbids that), escaped
    reversibly, so two ids never share one."""
    return "~" + "".join(f"~{ord(c):02X}" if c in ESCAPED else c for c in text)


def first_label(text: str) -> str:
    """The label the first versions gave ``text`` (before wildcards were escaped): what
    they wrote under it is erased with the user's memory (:meth:`Memory.forget`). Their
    labels start with "%", never "~": no current label is one of them."""
    return "%" + text.replace("%", "%25").replace(".", "%2E").replace("\x00", "%00")


class Memory:
    """One user's long-term memory: JSON objects by key, grouped by optional sub-namespaces."""

    def __init__(self, store: BaseStore, tenant_id: str, user_id: str) -> None:
        self._store = store
        self._prefix = (ROOT, label(tenant_id), label(user_id))
        self._first_prefix = (ROOT, first_label(tenant_id), first_label(user_id))

    @classmethod
    def for_tool(cls, store: BaseStore, tenant_id: str, user_id: str) -> Memory:
        """As a tool reaches it: our store failing is :class:`ServiceUnavailable`, not
        the tool's failure."""
        return cls(ServiceStore(store), tenant_id, user_id)

    @property
    def owner(self) -> tuple[str, ...]:
        """Whose memory this is: the namespace every item of it lies under."""
        return self._prefix

    def _namespace(self, sub: tuple[str, ...]) -> tuple[str, ...]:
        return (*self._prefix, *(label(s) for s in sub), LEAF)

    async def get(self, key: str, *sub: str) -> dict[str, Any] | None:
        item = await self._store.aget(self._namespace(sub), key)
        return None if item is None else dict(item.value)

    async def put(self, key: str, value: dict[str, Any], *sub: str) -> None:
        if not 1 <= len(key) <= MAX_KEY:
            raise ValueError(f"a memory key has 1 to {MAX_KEY} characters")
        if DOT_SEGMENTS & set(key.split("/")):
            raise ValueError("a memory key has no '.' or '..' between its slashes")
        if len(sub) > MAX_DEPTH or not all(1 <= len(s) <= MAX_LABEL for s in sub):
            raise ValueError(
                f"a memory's sub-namespace has at most {MAX_DEPTH} labels"
                f" of 1 to {MAX_LABEL} characters"
            )
        # Before the walks below, which recurse.
        if nested_deeper(value, MAX_VALUE_DEPTH):
            raise ValueError(f"a memory's value nests at most {MAX_VALUE_DEPTH} levels deep")
        # What either store would refuse (a NUL, half an emoji, NaN), refused on both.
        reject_unstorable([key, *sub, value])
        try:
            encoded = json.dumps(value, ensure_ascii=False).encode()
        except TypeError as exc:  # a datetime, say: SQLite's store took it, PostgreSQL's not
            raise ValueError(f"a memory's value is plain JSON: {exc}") from None
        if len(encoded) > MAX_VALUE_BYTES:
            raise ValueError(f"a memory's value takes at most {MAX_VALUE_BYTES} bytes as JSON")
        namespace = self._namespace(sub)
        if len(".".join(namespace).encode()) + len(key.encode()) > MAX_ADDRESS_BYTES:
            raise ValueError(
                f"a memory's key and sub-namespace take at most {MAX_ADDRESS_BYTES} bytes"
                " of UTF-8 with its owner's ids"
            )
        await self._store.aput(namespace, key, value, index=False)

    async def delete(self, key: str, *sub: str) -> None:
        await self._store.adelete(self._namespace(sub), key)

    async def forget(self) -> int:
        """Delete every memory of this user, in every sub-namespace; how many there were.

        What the first versions wrote under the user's labels of then is erased too: no
        data migration moved it (it is not listed), and an erasure must reach it."""
        return await self._forget(self._prefix) + await self._forget(self._first_prefix)

    async def _forget(self, prefix: tuple[str, ...]) -> int:
        # Each item deleted, with the time of the write it deleted.
        gone: dict[tuple[tuple[str, ...], str], datetime] = {}
        again = False
        while True:
            # A search of the user's own prefix reaches every namespace below it.
            found = await self._store.asearch(prefix, limit=100, refresh_ttl=False)
            # Label by label: the first versions' labels hold "%" and "_", wildcards to a
            # store that matched a prefix without escaping them (ours escape them).
            page = {
                (tuple(item.namespace), item.key): item.updated_at
                for item in found
                if tuple(item.namespace[: len(prefix)]) == prefix
            }
            if not page:
                return len(gone)
            if page.keys() <= gone.keys() and all(page[k] == gone[k] for k in page):
                # As deleted, once deleted again: a store that keeps what it is told to
                # delete, which must not keep us here; what it kept is not counted.
                if again:
                    return len(gone) - len(page)
                # (Or written again within the store's clock tick: deleted once more.)
                again = True
            # Items written again since they were deleted (an agent's writes meanwhile)
            # were erased, and are erased again: counted once.
            await self._store.abatch(
                [PutOp(namespace, key, None) for namespace, key in sorted(page)]
            )
            gone.update(page)

    async def items(self, *sub: str, limit: int = 100) -> dict[str, dict[str, Any]]:
        """The memories in ``sub`` (not those of namespaces below it), by key."""
        return (await self.page(*sub, limit=limit))[0]

    async def page(
        self, *sub: str, limit: int = 100, offset: int = 0
    ) -> tuple[dict[str, dict[str, Any]], int | None]:
        """``limit`` memories of ``sub`` from ``offset`` in the store's order (the most
        recently written first; ties, such as writes within one second on SQLite, in no
        set order), by key, and the offset of the next page (None: the last).

        BaseStore pages by offset only: a memory written while someone pages may move an
        item across a page boundary (seen twice, or not at all in that listing)."""
        # No TTL to refresh (put sets none): a listing is a read, which PostgreSQL's
        # store otherwise sends as an UPDATE, refused while a failover is read-only.
        found = await self._store.asearch(
            self._namespace(sub), limit=limit + 1, offset=offset, refresh_ttl=False
        )
        more = len(found) > limit
        return {item.key: dict(item.value) for item in found[:limit]}, (
            offset + limit if more else None
        )
