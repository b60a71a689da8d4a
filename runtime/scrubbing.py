"""A tool call's secret args, scrubbed out of the text that tells of it (an error's
message, before it reaches the ledger, events, the planner or the log)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from runtime.storable import utf8
from runtime.tooling import REDACTED, ToolSpec

MIN_SCRUBBED_CHARS = 4
"""Shorter secret values are not scrubbed from error text: "1" would mangle every digit."""


def secret_values(spec: ToolSpec, args: BaseModel) -> list[str]:
    """The values of the call's secret args as text, longest first (to scrub them out)."""
    if not spec.secret_args:
        return []
    dumped = args.model_dump(mode="json")
    found = []
    for name in spec.secret_args:
        value = dumped.get(name)
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text) >= MIN_SCRUBBED_CHARS:
            found += _spellings(text)
    return sorted(set(found), key=len, reverse=True)


def _spellings(text: str) -> list[str]:
    """``text`` as it may appear inside a message: as is, or escaped by ``repr`` (which
    escapes a single quote only when the whole message holds both kinds) or JSON."""
    plain_quotes = repr(text)[1:-1].replace("\\'", "'")
    return [
        text,
        plain_quotes,
        plain_quotes.replace("'", "\\'"),
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
    ]


def scrub(text: str, secrets: list[str]) -> str:
    """An error's text as the ledger keeps it: secret values replaced, storable."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return utf8(text)
