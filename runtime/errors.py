"""The one table of machine error codes: run outcomes, tool errors and API problems.

Each code says what kind of recovery it calls for, which lifecycle trigger a
run failing with it fires, and which HTTP status it maps to when an API call
is refused with it. An ``error`` event's own ``recovery`` says what the runtime
did: where it sent the problem back to the planner (a policy denial whose tool
says replan, a handoff to an agent it does not know) that is ``replan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runtime.lifecycle import Trigger


class Recovery(StrEnum):
    RETRY = "retry"
    REPLAN = "replan"
    RESUME = "resume"
    COMPENSATE = "compensate"
    HUMAN = "human"
    NONE = "none"


class Code(StrEnum):
    # Tool and run errors (DESIGN §8).
    TOOL_ARGUMENT_INVALID = "TOOL_ARGUMENT_INVALID"
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    POLICY_DENIED = "POLICY_DENIED"
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"
    TOOL_BUSINESS_ERROR = "TOOL_BUSINESS_ERROR"
    TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
    TOOL_FAILED = "TOOL_FAILED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    PLANNER_ERROR = "PLANNER_ERROR"
    RUN_BUDGET_EXCEEDED = "RUN_BUDGET_EXCEEDED"
    RUN_CANCELLED = "RUN_CANCELLED"
    APPROVAL_REJECTED = "APPROVAL_REJECTED"
    CHECKPOINT_ERROR = "CHECKPOINT_ERROR"
    WORKER_LOST = "WORKER_LOST"
    RUN_CRASH_LOOP = "RUN_CRASH_LOOP"
    CALL_NOT_RUN = "CALL_NOT_RUN"
    FINISH_REFUSED = "FINISH_REFUSED"
    HANDOFF_TOO_DEEP = "HANDOFF_TOO_DEEP"
    # API problems.
    VALIDATION_ERROR = "VALIDATION_ERROR"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    APPROVAL_NOT_FOUND = "APPROVAL_NOT_FOUND"
    ARTIFACT_NOT_FOUND = "ARTIFACT_NOT_FOUND"
    STEP_NOT_FOUND = "STEP_NOT_FOUND"
    AGENT_NOT_FOUND = "AGENT_NOT_FOUND"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    APPROVAL_CONFLICT = "APPROVAL_CONFLICT"
    RUN_STATE_CONFLICT = "RUN_STATE_CONFLICT"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PRINCIPAL_MISMATCH = "PRINCIPAL_MISMATCH"
    SCOPE_NOT_GRANTED = "SCOPE_NOT_GRANTED"
    ROLE_REQUIRED = "ROLE_REQUIRED"
    FOUR_EYES = "FOUR_EYES"
    TENANT_RUN_LIMIT = "TENANT_RUN_LIMIT"
    TOO_MANY_STREAMS = "TOO_MANY_STREAMS"
    JSON_TOO_DEEP = "JSON_TOO_DEEP"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"


@dataclass(frozen=True)
class CodeInfo:
    title: str
    recovery: Recovery
    http_status: int
    trigger: Trigger | None = None
    """The trigger a run failing with this code fires; None: plan_error/exec_error by phase."""


C, R = Code, Recovery
CODES: dict[Code, CodeInfo] = {
    C.TOOL_ARGUMENT_INVALID: CodeInfo("Tool arguments fail the schema", R.REPLAN, 422),
    C.TOOL_NOT_FOUND: CodeInfo("Unknown tool or version", R.REPLAN, 422),
    C.POLICY_DENIED: CodeInfo("Policy denies the action", R.HUMAN, 403),
    C.TOOL_UNAVAILABLE: CodeInfo("Tool unavailable after bounded retries", R.RETRY, 503),
    C.TOOL_BUSINESS_ERROR: CodeInfo("Business state forbids the action", R.REPLAN, 409),
    C.TOOL_OUTCOME_UNKNOWN: CodeInfo("A side effect may or may not have happened", R.HUMAN, 409),
    C.TOOL_FAILED: CodeInfo("Tool failed unexpectedly", R.NONE, 500),
    C.COMPENSATION_FAILED: CodeInfo("A compensation failed: its side effect stands", R.HUMAN, 500),
    C.PLANNER_ERROR: CodeInfo("The planner failed", R.NONE, 500, Trigger.PLAN_ERROR),
    C.RUN_BUDGET_EXCEEDED: CodeInfo("Run budget exhausted", R.HUMAN, 429, Trigger.BUDGET_EXCEEDED),
    C.RUN_CANCELLED: CodeInfo("Run cancelled", R.COMPENSATE, 409, Trigger.CANCEL),
    C.APPROVAL_REJECTED: CodeInfo("A human rejected the action", R.NONE, 409, Trigger.REJECTED),
    C.CHECKPOINT_ERROR: CodeInfo("State cannot be persisted", R.RESUME, 503),
    C.CALL_NOT_RUN: CodeInfo(
        "A call was not run: another call of its step was refused or rejected", R.REPLAN, 409
    ),
    C.FINISH_REFUSED: CodeInfo(
        "The planner proposed to finish while work was open: it plans again", R.REPLAN, 409
    ),
    C.HANDOFF_TOO_DEEP: CodeInfo(
        "Handoffs in progress at once are at their bound: the planner plans again", R.REPLAN, 409
    ),
    C.WORKER_LOST: CodeInfo(
        "The worker driving the run stopped; another resumed it from its checkpoint",
        R.RESUME,
        503,
    ),
    C.RUN_CRASH_LOOP: CodeInfo(
        "Worker after worker stopped driving the run before it moved on", R.HUMAN, 500
    ),
    C.VALIDATION_ERROR: CodeInfo("Request is invalid", R.NONE, 422),
    C.RUN_NOT_FOUND: CodeInfo("No such run", R.NONE, 404),
    C.APPROVAL_NOT_FOUND: CodeInfo("No such approval", R.NONE, 404),
    C.ARTIFACT_NOT_FOUND: CodeInfo("No such artifact", R.NONE, 404),
    C.STEP_NOT_FOUND: CodeInfo("No such step of the run", R.NONE, 404),
    C.AGENT_NOT_FOUND: CodeInfo("No such agent", R.NONE, 422),
    C.IDEMPOTENCY_CONFLICT: CodeInfo(
        "Idempotency key reused with a different request", R.NONE, 409
    ),
    C.APPROVAL_CONFLICT: CodeInfo("Approval already decided differently", R.NONE, 409),
    C.RUN_STATE_CONFLICT: CodeInfo("Run is not in a state that allows this", R.NONE, 409),
    C.PAYLOAD_TOO_LARGE: CodeInfo("Request body too large", R.NONE, 413),
    C.UNAUTHENTICATED: CodeInfo("Missing or invalid credentials", R.NONE, 401),
    C.PRINCIPAL_MISMATCH: CodeInfo("The body names someone other than the caller", R.NONE, 403),
    C.SCOPE_NOT_GRANTED: CodeInfo("The caller does not hold a requested scope", R.NONE, 403),
    C.ROLE_REQUIRED: CodeInfo("The caller lacks the role this needs", R.NONE, 403),
    C.FOUR_EYES: CodeInfo("The run's own user cannot approve its action", R.NONE, 403),
    C.TENANT_RUN_LIMIT: CodeInfo("Too many active runs for this tenant", R.RETRY, 429),
    C.TOO_MANY_STREAMS: CodeInfo("Too many open event streams", R.RETRY, 429),
    C.JSON_TOO_DEEP: CodeInfo("Request JSON is nested too deeply", R.NONE, 422),
    C.MALFORMED_REQUEST: CodeInfo("The request is not valid HTTP", R.NONE, 400),
    C.HEADERS_TOO_LARGE: CodeInfo("Request line and headers too large", R.NONE, 431),
    C.NOT_FOUND: CodeInfo("Not found", R.NONE, 404),
    C.METHOD_NOT_ALLOWED: CodeInfo("Method not allowed", R.NONE, 405),
    C.NOT_ACCEPTABLE: CodeInfo("Not acceptable", R.NONE, 406),
    C.UNSUPPORTED_MEDIA_TYPE: CodeInfo("The body is not JSON", R.NONE, 415),
    C.UNAVAILABLE: CodeInfo("Service unavailable", R.RETRY, 503),
    C.INTERNAL_ERROR: CodeInfo("Internal error", R.NONE, 500),
}


def failure_error(code: Code, message: str, *, compensated: bool) -> dict[str, str]:
    """The ``error`` event of a run failing with ``code``. Its ``recovery`` says what the
    runtime did: a cancel that undid nothing (none asked for, or none that took effect)
    compensated nothing."""
    recovery = CODES[code].recovery
    if recovery is Recovery.COMPENSATE and not compensated:
        recovery = Recovery.NONE
    return {"code": code.value, "message": message, "recovery": recovery.value}


def call_error_key(tool_call_id: str) -> str:
    """The dedupe key of the one error event that explains a call never run (refused,
    or not run): a node replaying, or a run's end, writes it once."""
    return f"error:{tool_call_id}"


def call_error(
    code: Code, call: Mapping[str, Any], step_index: int, message: str, recovery: Recovery | str
) -> dict[str, Any]:
    """The error event of a proposed call that never ran (refused, or not run): ``call``
    gives its tool_call_id and call_index."""
    return {
        "code": code.value,
        "message": message,
        # Never run, so in no ledger: where the step's decision proposed it.
        "tool_call_id": call["tool_call_id"],
        "step_index": step_index,
        "call_index": call["call_index"],
        "recovery": recovery,
    }


class RuntimeProblem(Exception):
    """An error carrying a machine code from :data:`CODES`."""

    def __init__(self, code: Code, message: str, **extra: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra

    @property
    def info(self) -> CodeInfo:
        return CODES[self.code]
