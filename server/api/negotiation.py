"""Which of two representations a client's ``Accept`` header prefers (RFC 9110 §12.5.1)."""

from __future__ import annotations

import math

_NONE = (0.0, -1)


def _weight(accept: str, media_type: str) -> tuple[float, int]:
    """The q the header gives ``media_type`` and how specifically: that of its most
    specific matching range (2 ``type/sub``, 1 ``type/*``, 0 ``*/*``), or (0, -1)."""
    kind = media_type.split("/", 1)[0]
    ranks = {media_type: 2, f"{kind}/*": 1, "*/*": 0}
    best = _NONE
    for media_range in accept.split(","):
        name, *params = (part.strip() for part in media_range.split(";"))
        rank = ranks.get(name.lower())
        if rank is None or rank < best[1]:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = math.nan
                # An unreadable weight ("oops", "nan") accepts nothing.
                q = min(max(q, 0.0), 1.0) if math.isfinite(q) or q > 0 else 0.0
        if rank > best[1] or q > best[0]:
            best = (q, rank)
    return best


def prefers(accept: str, preferred: str, default: str) -> bool:
    """Whether ``accept`` weighs ``preferred`` above ``default``: by q, then by which is
    named more specifically (``application/json, */*`` asks for JSON); a tie, or no
    header, goes to the default."""
    weight = _weight(accept, preferred)
    return weight[0] > 0 and weight > _weight(accept, default)
