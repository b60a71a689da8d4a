"""One page of a table's rows, by keyset: the store's listings (runs, approvals, audit)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from runtime.errors import Code, RuntimeProblem
from runtime.store.codec import decode_cursor, encode_cursor
from runtime.store.core import StoreCore
from runtime.store.tx import Row


async def keyset_page(
    store: StoreCore,
    table: str,
    where: list[str],
    params: list[Any],
    keys: tuple[str, str],
    *,
    limit: int,
    cursor: str | None,
    newest_first: bool = False,
    runs: bool = True,
    any_of: Sequence[tuple[str, Sequence[Any]]] = (),
) -> tuple[list[Row], str | None]:
    """One page of ``table``'s rows matching ``where``, in ``keys`` order (a time,
    then a unique key), by keyset (a row written meanwhile never shifts a page); the
    next page's cursor, tagged with the table (None: the last page). ``runs``: as
    for :meth:`StoreCore.read`. ``any_of``: columns and the values each may hold, each
    combination read from its own index range in order and merged (an IN list made
    both dialects filter the whole time index, or sort every match, for a page)."""
    first, second = keys
    op, order = ("<", "DESC") if newest_first else (">", "ASC")
    if cursor:
        at, key = decode_cursor(cursor, kind=table)
        try:
            datetime.fromisoformat(at)
        except ValueError:
            raise RuntimeProblem(Code.VALIDATION_ERROR, "cursor is not valid") from None
        # A row value, not (a < ? OR (a = ? AND b < ?)): both dialects read it as a
        # range of the index, where the OR was a filter on every row before it.
        where = [*where, f"({first}, {second}) {op} (?, ?)"]
        params = [*params, at, key]
    filters = [(column, values) for column, values in any_of if values]
    combos = list(itertools.product(*(values for _, values in filters)))
    ordered = f"ORDER BY {first} {order}, {second} {order} LIMIT ?"
    conditions = " AND ".join([*where, *(f"{column} = ?" for column, _ in filters)])
    sql = f"SELECT * FROM {table} WHERE {conditions} {ordered}"
    args = [*params, *combos[0], limit + 1]
    if len(combos) > 1:
        branches = " UNION ALL ".join(f"SELECT * FROM ({sql}) AS b{i}" for i in range(len(combos)))
        sql = f"SELECT * FROM ({branches}) AS merged {ordered}"
        args = [a for combo in combos for a in (*params, *combo, limit + 1)] + [limit + 1]
    async with store.read(runs=runs) as tx:
        rows = await tx.fetchall(sql, args)
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], encode_cursor(table, str(last[first]), str(last[second]))
