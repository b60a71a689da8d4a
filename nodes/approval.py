"""The approval node: a LangGraph ``interrupt()`` per call that policy says needs a human.

Everything before ``interrupt()`` is deterministic and idempotent: the approval
id derives from the tool-call id, and the row is created only if absent, so a
replay after resume finds the same approval. The approval row, decided by a
compare-and-set, is the truth; the resume payload decides only a row that is
still pending (a graph resumed directly, as in LangGraph Studio).
"""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from nodes.not_run import in_call_order, not_run
from runtime import ids
from runtime.context import Context, services
from runtime.errors import Code
from runtime.events import summarize
from runtime.model import Approval, ApprovalDecision, Awaiting, utcnow
from runtime.state import RunState, failed, run_context
from runtime.tooling import ToolResolver

NodeFn = Any


APPROVE = frozenset({"approve", "approved", "yes", "true"})
REJECT = frozenset({"reject", "rejected", "no", "false"})


def parse_decision(
    answer: Any, approval_id: str | None = None
) -> tuple[ApprovalDecision, str | None, str]:
    """(approved|rejected, comment, decided_by) from a resume payload.

    A decision that is neither (a typo, "maybe") or an ``approval_id`` naming another
    approval is a ValueError: it must not be taken for a rejection, nor decide the
    wrong call.
    """
    if isinstance(answer, dict):
        raw = str(answer.get("decision", "")).lower()
        comment = answer.get("comment")
        if comment is not None and not isinstance(comment, str):
            raise ValueError("a comment is text")
        by = str(answer.get("decided_by") or "graph-resume")
        named = answer.get("approval_id")
        if named is not None and approval_id is not None and named != approval_id:
            raise ValueError(f"the resume names approval {named!r:.80}; {approval_id} is asked")
    else:
        raw, comment, by = str(answer).lower(), None, "graph-resume"
    if raw not in APPROVE | REJECT:
        raise ValueError(f"a resume decides 'approve' or 'reject', not {raw!r:.80}")
    return ("approved" if raw in APPROVE else "rejected"), comment, by


def make_approval_node(tools: ToolResolver) -> NodeFn:
    async def approval_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = await services(runtime, state)
        context = run_context(state)
        rejected: list[dict[str, Any]] = []
        for call in state.get("calls", []):
            if not call["needs_approval"]:
                continue
            spec = tools.resolve(call["tool"], call["version"])
            assert spec is not None, "the guard resolved this tool"
            approval_id = ids.call_approval_id(call)
            kind = call.get("kind", "tool_call")
            # The approver sees the call as the trace shows it: secret args stay hidden,
            # and args_hash still binds the decision to the real values.
            shown = spec.redact(call["args"])
            request = {
                "kind": kind,
                "approval_id": approval_id,
                "run_id": ctx.run_id,
                "tool_call_id": call["tool_call_id"],
                "tool": spec.name,
                "version": spec.version,
                "args": shown,
                "args_summary": summarize(shown),
                "risk": spec.risk,
                "reason": call["reason"],
                "awaiting": Awaiting(
                    tenant_id=context.tenant_id,
                    not_user=context.user_id if spec.four_eyes else None,
                ).model_dump(),
            }
            row = await ctx.store.ensure_approval(
                Approval(
                    approval_id=approval_id,
                    run_id=ctx.run_id,
                    tool_call_id=call["tool_call_id"],
                    tool=spec.name,
                    version=spec.version,
                    args=shown,
                    args_hash=call["args_hash"],
                    risk=spec.risk,
                    reason=call["reason"],
                    status="pending",
                    created_at=utcnow(),
                ),
                request,
            )
            # Called for every approval, decided or not, and as often as its answers
            # were refused, so that resume values stay matched to interrupts by position
            # when the node replays: how often depends on the answers alone, never on
            # whether the row was decided meanwhile.
            answer = interrupt(request)
            while True:
                try:
                    status, comment, by = parse_decision(answer, approval_id)
                    break
                except ValueError as exc:
                    # Asked again, saying why (LangGraph's way to check a human's answer):
                    # raising would fail the task with the bad value kept as its resume.
                    answer = interrupt({**request, "refused": str(exc)})
            if row.status == "pending":
                row, _ = await ctx.store.decide_approval(
                    approval_id,
                    status,
                    decided_by=by,
                    comment=comment,  # type: ignore[arg-type]
                )
            if row.status != "approved" or row.args_hash != call["args_hash"]:
                # "Don't run it again" after an unknown outcome is a planner matter.
                on_reject = "replan" if kind == "outcome_unknown" else spec.on_reject
                rejected.append({"call": call, "on_reject": on_reject, "row": row})
                if on_reject == "fail" or kind != "outcome_unknown":
                    # The run ends, or its planner decides again (DESIGN §3: rejected →
                    # failed or planning): the step's other calls will not run, so
                    # asking about them is pointless. (Whether an unknown outcome is
                    # to be run again is asked of each: it happened or not regardless.)
                    break
        if not rejected:
            return {}
        if all(r["on_reject"] == "replan" for r in rejected):
            calls = state.get("calls", [])
            gone = {r["call"]["tool_call_id"] for r in rejected}
            why = ", ".join(f"{r['call']['tool']} {r['call']['tool_call_id']}" for r in rejected)
            dropped = await not_run(
                ctx,
                state["step_index"],
                # Not an unknown outcome: it ran once, and is decided on its own.
                (
                    c
                    for c in calls
                    if c["tool_call_id"] not in gone and c.get("kind") != "outcome_unknown"
                ),
                f"the rejection of {why}",
            )
            return {
                # Unknown outcomes are decided each alone: those a human sent back to
                # run again do (the others' "not again" is an observation).
                "calls": [
                    c
                    for c in calls
                    if c.get("kind") == "outcome_unknown" and c["tool_call_id"] not in gone
                ],
                "observations": in_call_order(
                    dropped
                    + [
                        {
                            "step_index": state["step_index"],
                            "tool_call_id": r["call"]["tool_call_id"],
                            "tool": r["call"]["tool"],
                            "status": (
                                Code.TOOL_OUTCOME_UNKNOWN.value
                                if r["call"].get("kind") == "outcome_unknown"
                                else Code.APPROVAL_REJECTED.value
                            ),
                            "error": r["row"].comment or "rejected",
                            "summary": (
                                "a human decided it is not to be run again"
                                if r["call"].get("kind") == "outcome_unknown"
                                else "a human rejected it"
                            ),
                        }
                        for r in rejected
                    ],
                    calls,
                ),
                # An unknown outcome not to be run again was executed all the same (once):
                # the checkpoint lists it, as the ledger does.
                "tool_calls": [
                    r["call"]["tool_call_id"]
                    for r in rejected
                    if r["call"].get("kind") == "outcome_unknown"
                ],
                "memory_version": state.get("memory_version", 0) + 1,
            }
        # The rejection that ends the run (the loop stopped at it), not one sent back.
        stopper = next(r for r in rejected if r["on_reject"] == "fail")
        row, call = stopper["row"], stopper["call"]
        # Its step's other calls, approved or not asked about, are on the record too
        # (not an unknown outcome: that one ran, and is listed with the effects).
        await not_run(
            ctx,
            state["step_index"],
            (
                c
                for c in state.get("calls", [])
                if c["tool_call_id"] != call["tool_call_id"] and c.get("kind") != "outcome_unknown"
            ),
            f"the rejection of {call['tool']} {call['tool_call_id']}",
            ended=True,
        )
        message = f"{call['tool']}@{call['version']} rejected by {row.decided_by}" + (
            f": {row.comment}" if row.comment else ""
        )
        outcome = failed(
            Code.APPROVAL_REJECTED, message, tool_call_id=stopper["call"]["tool_call_id"]
        )
        return {"outcome": outcome, "calls": []}

    return approval_node
