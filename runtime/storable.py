"""What the stores and the checkpoint cannot keep, and what becomes of it.

Neither store keeps lone UTF-16 surrogates (half of a broken emoji: not UTF-8), integers
beyond 64 bits (the checkpoint's msgpack) or NaN and infinities (not JSON, though
Python's parser reads them and pydantic writes them); PostgreSQL's text keeps no NUL.
A request that carries one is refused (:func:`reject_unstorable`, on every request
model). Output a planner or a tool has already produced cannot be refused without
losing the work, so it is made keepable instead (:func:`plain_json`, :func:`utf8`): big
integers as text, NaN and infinities as null, surrogates as U+FFFD; a NUL is escaped
in the JSON text both stores keep.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

INT64 = (-(2**63), 2**63 - 1)

MAX_NESTING = 64
"""How deep the JSON a planner or a tool hands the runtime may nest. The checkpoint's
msgpack stops at 255 levels, pydantic's serialiser a little past that, Python's json
at about 1,000 (its stack): deeper, a step could not be recorded once its work was done
(a tool's call was left running after its side effect). Real data nests a few levels."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> str:
    """``text`` with lone surrogates as U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _int64_or_text(digits: str) -> int | str:
    value = int(digits)
    return value if INT64[0] <= value <= INT64[1] else digits


def nests_deeper(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value``'s dicts and lists nest more than ``limit`` levels (without
    recursion: the values in question can be past Python's stack)."""
    containers = (dict, list, tuple)
    level = [value] if isinstance(value, containers) else []
    for _ in range(limit):
        # Each container once a level: one shared by reference many times over (a
        # DAG) would otherwise double the level's length at every level.
        level = list(
            {
                id(child): child
                for item in level
                for child in (item.values() if isinstance(item, dict) else item)
                if isinstance(child, containers)
            }.values()
        )
        if not level:
            return False
    return bool(level)


def plain_json(value: Any) -> tuple[Any, bytes]:
    """``value`` as its JSON reads back, made keepable, and that JSON: datetimes and
    decimals as text too (what an artifact of it holds)."""
    text = utf8(json.dumps(value, default=str, ensure_ascii=False))
    constants: list[str] = []
    plain = json.loads(text, parse_int=_int64_or_text, parse_constant=constants.append)
    if constants:  # read back as None: write the null
        text = json.dumps(plain, ensure_ascii=False)
    return plain, text.encode()


def reject_unstorable(value: Any) -> Any:
    """Refuse, up front and on every dialect alike, what a request could carry that the
    stores cannot keep as given (the module's list)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("text must not contain NUL characters")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError("text must not contain lone UTF-16 surrogates") from None
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise ValueError("integers must fit in 64 bits (signed)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("numbers must be finite: JSON has no NaN or Infinity")
    elif isinstance(value, dict):
        for key, item in value.items():
            reject_unstorable(key)
            reject_unstorable(item)
    elif isinstance(value, list | tuple):
        for item in value:
            reject_unstorable(item)
    return value
