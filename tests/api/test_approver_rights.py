"""Who may approve, and whose run it is: the principal wins over the body."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api
from tests.api.helpers import count_runs, parked_demo_run, problem
from tests.auth import MGR, bearer

OPS_APPROVER = bearer(roles=["approver"])
"""The runs' own user (u-ops-001), who also holds the approver role."""


async def test_four_eyes_the_runs_own_user_cannot_approve(api: Api) -> None:
    run_id, approval_id, _ = await parked_demo_run(api)
    decide = f"/runs/{run_id}/approvals/{approval_id}"
    resp = await api.client.post(decide, json={"decision": "approve"}, headers=OPS_APPROVER)
    problem(resp, 403, "FOUR_EYES")
    assert (await api.client.get(f"/runs/{run_id}")).json()["state"] == "waiting_human"

    resp = await api.client.post(
        decide, json={"decision": "approve", "comment": "checked the numbers"}, headers=MGR
    )
    assert resp.status_code == 202, resp.text
    final = await api.settle(run_id)
    assert final["state"] == "succeeded"
    trace = (await api.client.get(f"/runs/{run_id}/trace")).json()
    (approval,) = trace["approvals"]
    assert approval["decided_by"] == "u-mgr-002" and approval["decided_at"]
    assert approval["comment"] == "checked the numbers"
    (result,) = [e for e in trace["events"] if e["type"] == "approval_result"]
    assert result["data"]["decided_by"] == "u-mgr-002"
    assert result["data"]["comment"] == "checked the numbers"
    assert result["data"]["via"] == "jwt:HS256"  # how the decider proved who they are


async def test_a_tool_may_allow_self_approval(api: Api) -> None:
    run = await api.create(agent_id="self_approver", input="note", context={})
    await api.wait_event(run["run_id"], lambda e: e["data"].get("to") == "waiting_human")
    approval_id = (await api.client.get(f"/runs/{run['run_id']}")).json()["pending_approval"][
        "approval_id"
    ]
    decide = f"/runs/{run['run_id']}/approvals/{approval_id}"
    # Self-approval is allowed for this tool, the approver role is still needed.
    problem(await api.client.post(decide, json={"decision": "approve"}), 403, "ROLE_REQUIRED")
    resp = await api.client.post(decide, json={"decision": "approve"}, headers=OPS_APPROVER)
    assert resp.status_code == 202, resp.text
    assert (await api.settle(run["run_id"]))["state"] == "succeeded"


async def test_decided_by_in_the_body_must_be_the_caller(api: Api) -> None:
    run_id, approval_id, _ = await parked_demo_run(api)
    resp = await api.client.post(
        f"/runs/{run_id}/approvals/{approval_id}",
        json={"decision": "approve", "decided_by": "u-ceo"},
        headers=MGR,
    )
    problem(resp, 403, "PRINCIPAL_MISMATCH")
    approval = await api.engine_services.store.get_approval(approval_id)
    assert approval is not None and approval.status == "pending"


@pytest.mark.parametrize(
    ("context", "code"),
    [
        ({"tenant_id": "other-co"}, "PRINCIPAL_MISMATCH"),
        ({"user_id": "u-ceo"}, "PRINCIPAL_MISMATCH"),
        ({"tenant_id": "other-co", "user_id": "u-ops-001"}, "PRINCIPAL_MISMATCH"),
        ({"scope": ["sales_region:east", "payroll:all"]}, "SCOPE_NOT_GRANTED"),
    ],
)
async def test_forged_context_is_403_and_writes_nothing(
    api: Api, context: dict[str, object], code: str
) -> None:
    east_only = bearer(scopes=["sales_region:east"])
    resp = await api.client.post(
        "/runs", json={"input": "q", "context": context}, headers=east_only
    )
    problem(resp, 403, code)
    assert await count_runs(api) == 0


async def test_context_defaults_to_the_principal(api: Api) -> None:
    caller = bearer(user="u-7", tenant="acme", scopes=["sales_region:east", "sales_region:west"])
    resp = await api.client.post(
        "/runs", json={"input": "q", "agent_id": "typo_fixer"}, headers=caller
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["context"] == {
        "user_id": "u-7",
        "tenant_id": "acme",
        "scope": ["sales_region:east", "sales_region:west"],
    }
    # Naming yourself is fine; a narrower scope too.
    resp = await api.client.post(
        "/runs",
        json={"input": "q", "context": {"tenant_id": "acme", "scope": ["sales_region:west"]}},
        headers=caller,
    )
    assert resp.status_code == 201 and resp.json()["context"]["scope"] == ["sales_region:west"]
