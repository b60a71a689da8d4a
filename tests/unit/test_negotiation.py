"""Content negotiation of a run's events: SSE unless the client weighs JSON higher."""

from __future__ import annotations

import pytest

from server.api.negotiation import prefers

JSON, SSE = "application/json", "text/event-stream"


@pytest.mark.parametrize(
    ("accept", "json"),
    [
        ("", False),
        ("*/*", False),
        (SSE, False),
        (JSON, True),
        ("Application/JSON", True),
        # axios's default: JSON named, the stream only by a wildcard
        ("application/json, text/plain, */*", True),
        (f"{JSON}, {SSE}", False),  # both named alike: the default
        (f"{JSON};q=0", False),  # "not JSON"
        (f"{JSON};q=0, */*", False),  # the most specific range decides
        (f"{SSE};q=0.5, {JSON}", True),
        (f"{SSE}; q=0.9, {JSON}; q=0.8", False),
        ("application/*", True),
        ("application/*;q=0.2, text/*;q=0.1", True),
        (f"{JSON};q=oops", False),
        (f"{JSON};q=nan", False),
        (f"{JSON}, {SSE};q=nan", True),
        (f"{JSON};q=inf", True),  # read as 1
        (f"{JSON};q=7", True),  # read as 1
    ],
)
def test_json_only_when_weighed_above_the_stream(accept: str, json: bool) -> None:
    assert prefers(accept, JSON, SSE) is json
