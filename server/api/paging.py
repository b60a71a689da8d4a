"""Lists that go on: the next page's address in an RFC 8288 ``Link`` header.

The body stays what it was (a list, or a map by key), so a client that reads only
the first page keeps working.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request


def next_link(request: Request, **params: Any) -> str:
    """``<this path and query, params replaced>; rel="next"``: a reference relative to
    the request (RFC 8288 §3.2), so it never names a host the request's Host header made
    up."""
    url = request.url.include_query_params(**params)
    return f'<{url.path}?{url.query}>; rel="next"'
