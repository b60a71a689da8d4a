"""What a tool may call an artifact it writes: a media type any HTTP response can carry
as it is, and a name both stores keep.

Checked as the artifact is written, not served: bytes stored under a media type no
header can carry were a 500 (or a dropped connection) on every read of them, and a NUL
in a name failed the tool on PostgreSQL where SQLite kept it.
"""

from __future__ import annotations

import re

from runtime.storable import reject_unstorable

MAX_MEDIA_TYPE = 255
"""Characters of a media type, its parameters included (RFC 6838 names are shorter)."""
MAX_NAME = 255
"""Characters of an artifact's name: a file name, as a download offers it."""

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~]|\\[\t -~])*"'
MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:[ \t]*;(?:[ \t]*{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*")
"""RFC 9110 §8.3.1's ``media-type``: type/subtype and its parameters (§5.6.6: one may
be empty, as in the ``text/html; charset=UTF-8;`` some servers send), ASCII alone,
with no whitespace at its end (no header value has any)."""


def is_media_type(text: str) -> bool:
    return len(text) <= MAX_MEDIA_TYPE and MEDIA_TYPE.fullmatch(text) is not None


def check_naming(media_type: str, name: str) -> None:
    """Refuse (``ValueError``) what an artifact may not be called."""
    if not is_media_type(media_type):
        raise ValueError(
            f"an artifact's media type is type/subtype with optional parameters, in ASCII,"
            f" at most {MAX_MEDIA_TYPE} characters (RFC 9110): got {media_type[:80]!r}"
        )
    if not 1 <= len(name) <= MAX_NAME:
        raise ValueError(f"an artifact's name has 1 to {MAX_NAME} characters")
    try:
        reject_unstorable(name)
    except ValueError as exc:
        raise ValueError(f"an artifact's name: {exc}") from None
