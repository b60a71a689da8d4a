"""How a number in a path or query is spelled: its decimal digits, nothing else.

pydantic reads "3_0" as 30 and "+3", " 3" and "3.0" as 3, so one page or step had many
addresses (and a cache as many entries for it); a client's typo went unnoticed."""

from __future__ import annotations

from pydantic import BeforeValidator


def _digits(value: object) -> object:
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a whole number, in decimal digits")
    return value


DIGITS = BeforeValidator(_digits)
"""Beside the parameter's ``Query``/``Path`` in its ``Annotated`` (inside a type of its
own, it hid their bounds from the OpenAPI document: ``ge``, not ``minimum``)."""
