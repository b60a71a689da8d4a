"""What model and tool output becomes before the stores and the checkpoint keep it.

A request that carries a value no store keeps is refused (``runtime.model``); output a
planner or a tool has already produced cannot be refused without losing the work, so it
is made keepable instead: integers beyond 64 bits as text (the checkpoint's msgpack),
NaN and infinities as null (not JSON; pydantic writes them so), lone UTF-16 surrogates
(half of a broken emoji: not UTF-8, which neither store writes) as U+FFFD.
"""

from __future__ import annotations

import json
import re
from typing import Any

INT64 = (-(2**63), 2**63 - 1)

_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> str:
    """``text`` with lone surrogates as U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _int64_or_text(digits: str) -> int | str:
    value = int(digits)
    return value if INT64[0] <= value <= INT64[1] else digits


def plain_json(value: Any) -> tuple[Any, bytes]:
    """``value`` as its JSON reads back, made keepable, and that JSON: datetimes and
    decimals as text too (what an artifact of it holds)."""
    text = utf8(json.dumps(value, default=str, ensure_ascii=False))
    constants: list[str] = []
    plain = json.loads(text, parse_int=_int64_or_text, parse_constant=constants.append)
    if constants:  # read back as None: write the null
        text = json.dumps(plain, ensure_ascii=False)
    return plain, text.encode()
