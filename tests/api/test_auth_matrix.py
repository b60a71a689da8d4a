"""Every endpoint: no token → 401, another tenant → 404 (or an empty list), the right
token → success, and 403 where the object is the caller's tenant's but a role is missing."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.ledger import StoreArtifacts
from runtime.memory import Memory
from tests.api.conftest import Api
from tests.api.helpers import parked_demo_run, problem
from tests.auth import MGR, bearer

EVE = bearer(user="u-eve", tenant="other-co", roles=["approver", "admin"])
"""Every role, in the wrong tenant."""
COLLEAGUE = bearer(user="u-ops-777")
"""Same tenant as the run's user, no role."""
PUBLIC = {("GET", "/healthz")}
OWN_TOKEN = {("GET", "/metrics")}
"""Not for principals: a scraper's token of its own (tests/api/test_metrics.py)."""


async def test_every_endpoint_needs_the_right_principal(api: Api) -> None:
    run_id, approval_id, artifact_id = await parked_demo_run(api)
    doomed = (await api.create(agent_id="slow_worker", input="sleep 30"))["run_id"]
    json_accept = {"Accept": "application/json"}
    # (method, route, concrete path, body, extra headers, what another tenant gets)
    matrix: list[tuple[str, str, str, Any, dict[str, str], str]] = [
        ("POST", "/runs", "/runs", {"input": "q", "agent_id": "typo_fixer"}, {}, "own"),
        ("POST", "/run", "/run", {"input": "q", "agent_id": "typo_fixer"}, {}, "own"),
        ("GET", "/runs", "/runs", None, {}, "empty"),
        ("GET", "/runs/{run_id}", f"/runs/{run_id}", None, {}, "404"),
        ("GET", "/runs/{run_id}/events", f"/runs/{run_id}/events", None, json_accept, "404"),
        ("GET", "/runs/{run_id}/steps", f"/runs/{run_id}/steps", None, {}, "404"),
        ("GET", "/runs/{run_id}/tool-calls", f"/runs/{run_id}/tool-calls", None, {}, "404"),
        ("GET", "/runs/{run_id}/trace", f"/runs/{run_id}/trace", None, {}, "404"),
        ("GET", "/runs/{run_id}/checkpoint", f"/runs/{run_id}/checkpoint", None, {}, "404"),
        (
            "GET",
            "/runs/{run_id}/planner-context/{step}",
            f"/runs/{run_id}/planner-context/0",
            None,
            {},
            "404",
        ),
        ("GET", "/approvals", "/approvals", None, {}, "empty"),
        ("GET", "/artifacts/{artifact_id}", f"/artifacts/{artifact_id}", None, {}, "404"),
        ("GET", "/agents", "/agents", None, {}, "own"),
        ("GET", "/readyz", "/readyz", None, {}, "own"),
        ("GET", "/memory", "/memory", None, {}, "own"),
        ("DELETE", "/memory/{key}", "/memory/color", None, {}, "own"),
        ("DELETE", "/memory", "/memory", None, {}, "own"),
        ("GET", "/audit", "/audit", None, bearer(roles=["admin"]), "empty"),
        (
            "POST",
            "/runs/{run_id}/cancel",
            f"/runs/{doomed}/cancel",
            {"reason": "matrix"},
            {},
            "404",
        ),
        (
            "POST",
            "/runs/{run_id}/approvals/{approval_id}",
            f"/runs/{run_id}/approvals/{approval_id}",
            {"decision": "approve"},
            MGR,
            "404",
        ),
    ]
    assert api.app is not None
    documented = {
        (method.upper(), path)
        for path, operations in api.app.openapi()["paths"].items()
        for method in operations
    }
    expected = {(m, r) for m, r, *_ in matrix}
    assert documented - PUBLIC - OWN_TOKEN == expected, "endpoint missing"

    assert api.engine.memory is not None  # the caller's own memory, which EVE must not reach
    await Memory(api.engine.memory, "demo-retail", "u-ops-001").put("color", {"v": "teal"})
    client = api.client
    for method, route, path, body, headers, other in matrix:
        nobody = await client.request(
            method, path, json=body, headers={**headers, "Authorization": ""}
        )
        problem(nobody, 401, "UNAUTHENTICATED")
        assert nobody.headers["www-authenticate"] == "Bearer"
        forged = await client.request(
            method, path, json=body, headers={**headers, "Authorization": "Bearer ark_x_y"}
        )
        problem(forged, 401, "UNAUTHENTICATED")

        stranger = await client.request(method, path, json=body, headers={**headers, **EVE})
        if other == "404":
            assert stranger.status_code == 404, (route, stranger.text)
            assert stranger.json()["code"].endswith("NOT_FOUND")
        elif other == "empty":
            assert stranger.status_code == 200, (route, stranger.text)
            page = stranger.json()
            items = page["items"] if isinstance(page, dict) else page
            # Only what the stranger made itself: none of this tenant's runs or approvals.
            assert not {i.get("run_id") for i in items} & {run_id, doomed}, route
            assert all(
                i.get("context", {}).get("tenant_id", "other-co") == "other-co"
                and i.get("tenant_id", "other-co") == "other-co"  # an audit entry's
                for i in items
            )
        else:
            assert stranger.status_code in (200, 201, 204), (route, stranger.text)
            if route.startswith("/run"):
                assert stranger.json()["context"]["tenant_id"] == "other-co"
            if route == "/memory":  # EVE's own memory: empty, nothing of ours to forget
                assert stranger.json() == ({} if method == "GET" else {"forgotten": 0})

        owner = await client.request(method, path, json=body, headers=headers)
        assert owner.status_code in (200, 201, 202, 204), (route, owner.text)
        if (method, route) == ("GET", "/memory"):
            assert owner.json() == {"color": {"v": "teal"}}

    # Nothing another tenant did touched the run: it was approved by MGR only.
    trace = (await client.get(f"/runs/{run_id}/trace")).json()
    assert [(a["status"], a["decided_by"]) for a in trace["approvals"]] == [
        ("approved", "u-mgr-002")
    ]


async def test_missing_roles_are_403_on_the_callers_own_objects(api: Api) -> None:
    run_id, approval_id, _ = await parked_demo_run(api)
    decide = f"/runs/{run_id}/approvals/{approval_id}"
    problem(await api.client.post(decide, json={"decision": "approve"}), 403, "ROLE_REQUIRED")
    problem(
        await api.client.post(decide, json={"decision": "approve"}, headers=COLLEAGUE),
        403,
        "ROLE_REQUIRED",
    )
    problem(
        await api.client.post(f"/runs/{run_id}/cancel", headers=COLLEAGUE),
        403,
        "ROLE_REQUIRED",
    )
    # A tenant admin may cancel a colleague's run.
    admin = bearer(user="u-admin-1", roles=["admin"])
    resp = await api.client.post(f"/runs/{run_id}/cancel", headers=admin)
    assert resp.status_code == 200 and resp.json()["outcome"]["code"] == "RUN_CANCELLED"
    assert "(requested by u-admin-1)" in resp.json()["outcome"]["message"]


@pytest.mark.parametrize(
    "header",
    [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer not-a-jwt",
        "Bearer ark_000000000000_" + "A" * 43,
    ],
)
async def test_malformed_credentials_are_401(api: Api, header: str) -> None:
    problem(
        await api.client.get("/runs", headers={"Authorization": header}), 401, "UNAUTHENTICATED"
    )


async def test_healthz_needs_no_token(api: Api) -> None:
    resp = await api.client.get("/healthz", headers={"Authorization": ""})
    assert resp.status_code == 200


async def test_an_artifact_both_tenants_wrote_is_each_ones_own(api: Api) -> None:
    """Artifacts are content-addressed across tenants: the same bytes, one row, and each
    tenant that wrote them may read them; a third may not."""
    acme = bearer(user="u-acme", tenant="acme")
    ours = await api.create(agent_id="typo_fixer", input="x", context={})
    theirs = (
        await api.client.post("/runs", json={"agent_id": "typo_fixer", "input": "x"}, headers=acme)
    ).json()
    # The echo tool's outputs are small and inline: write the same bytes for both runs.
    store = api.engine_services.store
    a = await StoreArtifacts(store, ours["run_id"]).put(b"same bytes", "text/plain", "a.txt")
    b = await StoreArtifacts(store, theirs["run_id"]).put(b"same bytes", "text/plain", "报告.md")
    assert a.artifact_id == b.artifact_id
    for headers, name in (
        ({}, 'filename="a.txt"'),
        (acme, "filename*=UTF-8''%E6%8A%A5%E5%91%8A.md"),
    ):
        resp = await api.client.get(f"/artifacts/{a.artifact_id}", headers=headers)
        assert resp.status_code == 200 and resp.content == b"same bytes"
        assert resp.headers["x-content-type-options"] == "nosniff"
        # Each tenant sees its own name for the bytes, never the other's.
        assert name in resp.headers["content-disposition"], resp.headers["content-disposition"]
    problem(
        await api.client.get(f"/artifacts/{a.artifact_id}", headers=EVE), 404, "ARTIFACT_NOT_FOUND"
    )
