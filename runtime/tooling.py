"""What a tool is, to the runtime: the contract between the registry, the guard and the executor."""

from __future__ import annotations

import copy
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from runtime.memory import Memory
from runtime.model import Artifact, RunContext, problems_of

Risk = Literal["low", "medium", "high"]
REDACTED = "[redacted]"


class ToolBusinessError(Exception):
    """The business state forbids the action; the planner decides what next."""


class ToolUnavailable(Exception):
    """A transient fault (network, timeout, service down); retried with backoff."""


class ArtifactSink(Protocol):
    async def put(self, content: bytes, media_type: str, name: str) -> Artifact:
        """Keep ``content`` (its hash is its id) and put it on the run's record.
        ``ValueError`` for a media type or name runtime.artifact_naming refuses."""
        ...


@dataclass(frozen=True)
class ToolContext:
    """What a handler is given besides its arguments."""

    run_id: str
    tool_call_id: str
    idempotency_key: str
    """Stable across retries and restarts: a side effect keyed by it happens once."""
    context: RunContext
    artifacts: ArtifactSink
    memory: Memory | None = None
    """The run's user's long-term memory (runtime.memory); None where the graph runs
    without a store."""
    cut_off: bool = False
    """Set for ``reconcile`` when a cancel, the run's time budget or the tool's own
    timeout cut the call off, or its handler gave up (``ToolUnavailable``): work it
    started may still be finishing out of the runtime's reach (a thread, a request in
    flight), and the answer is final. Where the effect has not landed, reconcile
    must see that it never does (void the idempotency key) or say it took place."""


Handler = Callable[[Any, ToolContext], Awaitable[Any]]
Reconciler = Callable[[Any, ToolContext], Awaitable[Any | None]]
"""Asks the real system what happened; returns the output if the effect happened, else None."""
Compensator = Callable[[Any, Any, ToolContext], Awaitable[None]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    version: str
    description: str
    args_model: type[BaseModel]
    handler: Handler
    risk: Risk = "low"
    side_effect: bool = False
    idempotent: bool = True
    timeout_s: float = 30.0
    max_attempts: int = 3
    reconcile: Reconciler | None = None
    compensate: Compensator | None = None
    required_scopes: Callable[[BaseModel], list[str]] = field(default=lambda _args: [])
    on_reject: Literal["fail", "replan"] = "fail"
    on_deny: Literal["fail", "replan"] = "fail"
    """What a policy denial of a call does (DESIGN §8: stop the action): fail the run,
    or tell the planner (a POLICY_DENIED observation) so that it takes another path. A
    policy that wants a human for a call answers "approve", not "deny"."""
    secret_args: frozenset[str] = frozenset()
    """Top-level argument names whose values never appear in events, traces or logs."""
    four_eyes: bool = True
    """When a call needs approval, the run's own user may not give it."""

    def redact(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``args`` as events, traces and logs may show them."""
        return {k: (REDACTED if k in self.secret_args else v) for k, v in args.items()}

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def stored_args(self, args: Mapping[str, Any]) -> BaseModel:
        """A call's args as stored (its ledger row, the run's state), as this tool's
        model. Where they no longer validate (the tool's args changed since), the error
        says what is wrong by field, never a value: a validation error's text quotes
        its input, a secret argument's too, in every traceback that prints it."""
        try:
            return self.args_model.model_validate(args)
        except ValidationError as exc:
            why = "; ".join(problems_of(exc))
            raise ValueError(f"{self.ref}: its stored args no longer validate: {why}") from None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "risk": self.risk,
            "side_effect": self.side_effect,
            "idempotent": self.idempotent,
            "reconcile": self.reconcile is not None,
            "compensate": self.compensate is not None,
            "secret_args": sorted(self.secret_args),
            "schema": copy.deepcopy(_args_schema(self.args_model)),
        }


@functools.cache
def _args_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Generating a schema costs ~1 ms, and the planner node describes every tool at
    # every step; a model class does not change, so its schema is made once.
    return model.model_json_schema()


class ToolResolver(Protocol):
    def resolve(self, name: str, version: str | None = None) -> ToolSpec | None: ...

    def specs(self) -> list[ToolSpec]: ...


class ChainedTools:
    """An agent's tools and those of the agents its graph hosts, for what resolves a
    ledger row by its tool's name and version (a cancel's compensation, a cut-off call's
    reconcile, the redaction of its secret arguments)."""

    def __init__(self, own: ToolResolver, *hosted: ToolResolver) -> None:
        self._own = own
        self._resolvers = (own, *hosted)

    def resolve(self, name: str, version: str | None = None) -> ToolSpec | None:
        """The one tool of that name and version; None where two agents have different
        ones (a row does not say whose call it was, and another's undo must not run)."""
        found = self._found(name, version)
        return found[0] if len(found) == 1 else None

    def ambiguous(self, name: str, version: str | None = None) -> bool:
        """Whether two of the agents define that name and version differently: no other
        agent's definition may stand in for theirs (its secrets, its four eyes)."""
        return len(self._found(name, version)) > 1

    def _found(self, name: str, version: str | None) -> list[ToolSpec]:
        found: list[ToolSpec] = []
        for resolver in self._resolvers:
            spec = resolver.resolve(name, version)
            # Equal specs (the same handlers, built twice by one factory) are one tool.
            if spec is not None and not any(spec is seen or spec == seen for seen in found):
                found.append(spec)
        return found

    def specs(self) -> list[ToolSpec]:
        """The agent's own: those its planner is offered, and ``GET /agents`` lists."""
        return self._own.specs()
