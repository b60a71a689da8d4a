"""The public objects of DESIGN §2 as pydantic models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from runtime.errors import Code
from runtime.events import LEGACY_HANDOFF, EventType, legacy_handoff
from runtime.lifecycle import State
from runtime.storable import reject_unstorable

MAX_INPUT_CHARS = 20_000
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Strict(BaseModel):
    """A request body: no unknown fields, and no value of another JSON type coerced
    ("3" or true for a number, "yes" for a flag: 422, not a guess)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        return reject_unstorable(data)


class Stored(BaseModel):
    """A row the store reads back: a validation error's text never quotes its values
    (a secret argument's among them), wherever it is printed (a log's traceback, a
    failed run's message); what is wrong with it is said by field (``problems_of``)."""

    model_config = ConfigDict(hide_input_in_errors=True)


MAX_SCOPES = 200
"""Scopes a run's context carries at most."""


class RunContext(BaseModel):
    """Who the run is for; passed unchanged into policy and tools."""

    model_config = ConfigDict(extra="allow")
    user_id: str = Field(default="anonymous", min_length=1, max_length=200)
    tenant_id: str = Field(default="default", min_length=1, max_length=200)
    scope: list[str] = Field(default_factory=list, max_length=MAX_SCOPES)


MOST_STEPS = 10_000
MOST_CALLS = 100_000
MOST_TOKENS = 1_000_000_000
MOST_COST_USD = 1_000_000
MOST_TIMEOUT_S = 30 * 86400
"""The largest budgets a run may have: a request asks for at most these, a server's
ceilings are at most these."""


class BudgetLimits(Strict):
    max_llm_calls: int | None = Field(default=None, ge=0, le=MOST_CALLS)
    max_tool_calls: int | None = Field(default=None, ge=0, le=MOST_CALLS)
    max_tokens: int | None = Field(default=None, ge=0, le=MOST_TOKENS)
    max_cost_usd: float | None = Field(default=None, ge=0, le=MOST_COST_USD)
    timeout_s: float | None = Field(default=None, gt=0, le=MOST_TIMEOUT_S)


class RunOptions(Strict):
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    max_steps: int | None = Field(default=None, ge=1, le=MOST_STEPS)
    budget: BudgetLimits = Field(default_factory=BudgetLimits)


class RunCreate(Strict):
    agent_id: str | None = Field(default=None, min_length=1, max_length=100)
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    context: RunContext = Field(default_factory=RunContext)
    options: RunOptions = Field(default_factory=RunOptions)

    @field_validator("input")
    @classmethod
    def _says_something(cls, text: str) -> str:
        # A blank task would cost a planning round (an LLM call, with a real planner)
        # to learn nothing; it is most often an empty variable in the caller's script.
        if text.isspace():
            raise ValueError("input must not be blank")
        return text

    @field_validator("options")
    @classmethod
    def _budget_can_be_spent(cls, options: RunOptions) -> RunOptions:
        # Spent before the first plan is checked, so none of the planner's budgets may
        # be zero (the run would fail before it started, LLM or not); a run may be
        # allowed no tool call. Asked of requests only: runs stored before kept theirs.
        budget = options.budget
        zero = [
            name
            for name in ("max_llm_calls", "max_tokens", "max_cost_usd")
            if getattr(budget, name) == 0
        ]
        if zero:
            raise ValueError(f"budget {', '.join(zero)} must be above zero")
        return options


class Limits(BaseModel):
    """The effective limits of a run: request options capped by server maxima."""

    max_steps: int
    max_llm_calls: int
    max_tool_calls: int
    max_tokens: int
    max_cost_usd: float
    timeout_s: float


class Usage(BaseModel):
    steps: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    active_s: float = 0.0


APPROVER_ROLE: Final = "approver"
"""The role that decides approvals (of runs in the decider's own tenant)."""


class Awaiting(BaseModel):
    """Who a parked run waits for (DESIGN §3: it knows why, for whom, and where it goes on)."""

    tenant_id: str
    role: str = APPROVER_ROLE
    not_user: str | None = None
    """The run's own user, where the tool wants four eyes: not theirs to approve."""


class PendingApproval(BaseModel):
    """Why the run waits (``reason``), where it goes on (the call), and for whom."""

    approval_id: str
    tool_call_id: str
    tool: str
    reason: str
    awaiting: Awaiting | None = None
    """None on runs parked before it was recorded."""


class Outcome(BaseModel):
    """Why a run ended, and what it left behind."""

    status: Literal["succeeded", "failed"]
    code: Code | None = None
    message: str = ""
    side_effects: list[str] = Field(default_factory=list)
    """tool_call_ids of side-effecting calls that did happen, or may have (an effect
    cut off, or unknown). A run failed without its ledger read (its rows no longer
    validate: ``RunStore.fail_unread``) lists every side-effecting call it made, as one
    that may have happened, its ``message`` saying its tool calls could not be read; an
    empty list there, the message saying its side effects are unknown, where not even
    their ids could be read."""
    compensations: list[str] = Field(default_factory=list)
    """tool_call_ids whose compensation ran."""
    artifacts: list[str] = Field(default_factory=list)
    """Of a failed run: the artifacts it made before it failed (its log's ``artifact``
    events), oldest first: its partial results, kept. A run that succeeded names
    those of its answer in its ``result``."""


class Run(Stored):
    run_id: str
    agent_id: str
    input: str
    context: RunContext
    options: RunOptions
    state: State
    step_index: int = 0
    usage: Usage = Field(default_factory=Usage)
    limits: Limits
    pending_approval: PendingApproval | None = None
    result: dict[str, Any] | None = None
    outcome: Outcome | None = None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None = None


class ProposedCall(BaseModel):
    """One tool call the planner proposes; the runtime decides whether it runs."""

    tool: str
    version: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)


class DecisionUsage(BaseModel):
    llm_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class Handoff(BaseModel):
    """Hand the run to another agent, which works on ``task`` and then hands control back."""

    agent_id: str = Field(min_length=1, max_length=100)
    task: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    data: dict[str, Any] | None = None
    """Structured input for the sub-agent (its planner sees it as ``PlannerView.task_data``)."""


class Decision(BaseModel):
    """A planner's structured decision: tool calls, a handoff, or finish. Never raw reasoning.

    A sub-agent's ``finish`` hands control back to the agent that handed off to it;
    only the run's own agent finishes the run.
    """

    kind: Literal["tool_calls", "finish", "handoff"]
    summary: str = Field(default="", max_length=2000)
    tool_calls: list[ProposedCall] = Field(default_factory=list)
    handoff: Handoff | None = None
    answer: str | None = None
    data: dict[str, Any] | None = None
    usage: DecisionUsage = Field(default_factory=DecisionUsage)
    agent_id: str | None = None
    """Set by the runtime, not the planner: the agent whose planner decided (None: not known)."""

    @model_validator(mode="after")
    def _handoff_named(self) -> Decision:
        if (self.kind == "handoff") != (self.handoff is not None):
            raise ValueError("a handoff decision, and only one, names its handoff")
        return self


class Step(Stored):
    run_id: str
    step_index: int
    decision: Decision
    started_at: datetime
    ended_at: datetime | None = None


ToolCallStatus = Literal["running", "succeeded", "failed", "unknown", "cancelled"]


class ToolCall(Stored):
    tool_call_id: str
    run_id: str
    step_index: int
    call_index: int
    tool: str
    version: str
    args: dict[str, Any]
    args_hash: str
    status: ToolCallStatus
    output: Any = None
    artifact_id: str | None = None
    error: dict[str, Any] | None = None
    idempotency_key: str
    attempts: int = 0
    retried: list[dict[str, Any]] = []
    """Why each attempt before the last has no outcome of its own, ``{attempt, code,
    message}``: a transient fault that was retried, or a drive that stopped mid-call.
    Written before the next attempt starts; a call a human sends back to run again
    starts a new list (its earlier attempts were answered by their own result)."""
    side_effect: bool = False
    compensated: bool = False
    created_at: datetime
    updated_at: datetime


ApprovalStatus = Literal["pending", "approved", "rejected", "expired"]
ApprovalDecision = Literal["approved", "rejected", "expired"]


class Approval(Stored):
    approval_id: str
    run_id: str
    tool_call_id: str
    tool: str
    """The tool's name, as in its tool call and events."""
    version: str = ""
    """The tool's version ("" on rows of a store older than the column that had none)."""
    args: dict[str, Any]
    args_hash: str
    risk: str
    reason: str
    status: ApprovalStatus
    decided_by: str | None = None
    comment: str | None = None
    created_at: datetime
    decided_at: datetime | None = None


def problems_of(exc: ValidationError) -> list[str]:
    """What does not validate: each field's path and what is wrong with it, never its
    value (a stored row's may be a secret argument, and its errors' text quotes it)."""
    return [
        f"{'.'.join(str(p) for p in e['loc']) or '(row)'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False)
    ]


class Unreadable(BaseModel):
    """A stored row that no longer validates against its model: shown by its keys and
    status as the database holds them, none of its other values (an arg declared secret
    is redacted by reading its tool off a valid row)."""

    model_config = ConfigDict(coerce_numbers_to_str=True)

    unreadable: Literal[True]
    """Always true: what tells this form from the row's own (no default, so that the
    schema requires it)."""
    problems: list[str]
    """What does not validate: a field's path and what is wrong with it, never its value."""


class UnreadableToolCall(Unreadable):
    """A ledger row that no longer validates: its keys and status as stored, no other value."""

    tool_call_id: str
    run_id: str
    status: str
    """As stored: not necessarily one of ToolCall's."""


class UnreadableApproval(Unreadable):
    """An approval that no longer validates: its keys and status as stored, no other value."""

    approval_id: str
    run_id: str
    tool_call_id: str
    status: str
    """As stored: not necessarily one of Approval's."""


class UnreadableStep(Unreadable):
    """A step that no longer validates: its keys as stored, no other value."""

    run_id: str
    step_index: int


class Artifact(Stored):
    artifact_id: str
    media_type: str
    size: int
    name: str
    run_id: str | None = None
    created_at: datetime


class Event(Stored):
    run_id: str
    seq: int
    type: EventType
    """The fixed vocabulary's: a stored type outside it is not an event anyone can read
    (and must not reach an SSE ``event:`` line as it is)."""
    ts: datetime
    data: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _read_legacy_handoff(cls, row: Any) -> Any:
        if isinstance(row, dict) and row.get("type") == LEGACY_HANDOFF:
            mapped = legacy_handoff(row.get("data"))
            if mapped is not None:
                return {**row, "type": mapped[0], "data": mapped[1]}
        return row


class UnreadableEvent(Unreadable):
    """An event that no longer validates: its keys and type as stored, not its data."""

    run_id: str
    seq: int
    type: str
    """As stored: not necessarily one of the vocabulary's."""


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = None
