"""A run's events as JSON or as a stream, by the weights of the client's Accept header."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api


@pytest.mark.parametrize(
    ("accept", "media_type"),
    [
        (["text/event-stream;q=0.5, application/json"], "application/json"),
        (["application/json, text/plain, */*"], "application/json"),
        (["application/json;q=0, */*"], "text/event-stream"),
        # Field lines of one name are one list (RFC 9110 §5.3), in the order sent.
        (["text/event-stream;q=0.5", "application/json"], "application/json"),
        (["application/json;q=0.5", "text/event-stream"], "text/event-stream"),
    ],
)
async def test_the_client_weighs_json_against_the_stream(
    api: Api, accept: list[str], media_type: str
) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    ended = await api.client.get(f"/runs/{run['run_id']}", headers={"Prefer": "wait=30"})
    assert ended.json()["state"] == "succeeded"

    resp = await api.client.get(
        f"/runs/{run['run_id']}/events", headers=[("Accept", line) for line in accept]
    )

    assert resp.status_code == 200
    assert resp.headers["content-type"].split(";")[0] == media_type
    if media_type == "application/json":
        assert resp.json()[-1]["type"] == "state"
    else:  # an ended run's stream replays its log and closes
        assert "event: state" in resp.text
