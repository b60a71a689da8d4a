"""A planner that asks a tool-calling chat model (any langchain-core ``BaseChatModel``).

The model only proposes: its tool calls become a :class:`Decision` that the guard
validates, policy authorises and the executor runs through the ledger. Each call
to :meth:`ChatModelPlanner.next_step` is one model invocation over a conversation
rebuilt from the :class:`PlannerView` alone: the system prompt, the question with
its run context, then for every step an ``AIMessage`` with the tool calls the
runtime saw and a ``ToolMessage`` per observation. The same view always gives the
same messages. Only the structured decision and a short summary are kept: text
the model sends beside its tool calls, and any reasoning blocks, are dropped.

Agents the planner may hand off to are offered as ``handoff_to_<agent_id>`` tools
(``task``, ``data``); a call to one, alone, is a ``handoff`` decision, and the
sub-agent's result comes back as that tool's message.

A transient model error (a rate limit, an overloaded or unreachable endpoint, a
timeout) is retried a few times with backoff: nothing has acted on the answer yet,
so asking again is safe. Other model errors, and a transient one that outlasts the
retries, propagate; the planner node records them as ``PLANNER_ERROR``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import math
import random
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages import ToolCall as LCToolCall
from pydantic import ValidationError

from runtime.budget import SPENT_CAP
from runtime.events import handoff_tool
from runtime.model import Decision, DecisionUsage, Handoff, ProposedCall
from runtime.planner import LLM_CALLS, LLM_SPENT, Observation, PlannerView
from runtime.storable import utf8

DEFAULT_SYSTEM_PROMPT = (
    "You are an enterprise analyst agent. Answer the user's question with the tools "
    "you are given, and only from what they return: never invent data. You must use "
    "the tools to act. The runtime, not you, executes every tool call: it validates "
    "the arguments, checks policy (some calls wait for a human's approval) and sends "
    "back each result, or the error to correct, as a tool message. When the task is "
    "done, reply with the final answer as plain text and no tool calls."
)
SUMMARY_CHARS = 200
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A function name every provider takes (OpenAI's rule; Anthropic's is the same)."""
MAX_OBSERVATION_CHARS = 16_000
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504, 529})
"""HTTP statuses of a model endpoint worth asking again: timeouts, rate limits, overload."""
TRANSIENT_NAMES = (
    "RateLimit", "Timeout", "Connection", "ConnectError", "NetworkError", "ReadError",
    "RemoteProtocol", "Overloaded", "ServiceUnavailable", "Throttl", "ResourceExhausted",
    "DeadlineExceeded",
)  # fmt: skip
"""Provider SDKs' and HTTP clients' exception classes for the same, whatever the SDK
(openai.RateLimitError, anthropic.OverloadedError, httpx.ConnectError …)."""
PERMANENT_CODES = frozenset({"insufficient_quota"})
"""Rate-limit errors that waiting does not cure (OpenAI's exhausted quota)."""

log = logging.getLogger(__name__)


def is_transient(exc: BaseException) -> bool:
    """Whether a model call's failure may pass if asked again (it, or what it wraps)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _transient(current):
            return True
        current = current.__cause__
    return False


def _transient(exc: BaseException) -> bool:
    if getattr(exc, "code", None) in PERMANENT_CODES:
        return False
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status: Any = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is not None:
        try:
            return int(status) in TRANSIENT_STATUS
        except (TypeError, ValueError):
            pass  # not a number: the class says
    return any(name in cls.__name__ for cls in type(exc).__mro__ for name in TRANSIENT_NAMES)


class PlannerModelError(RuntimeError):
    """A named chat model cannot be made (langchain or its provider's package missing,
    an unknown provider, a construction that failed); the message is one line."""


class ModelOutputError(ValueError):
    """The model's reply cannot be turned into a decision (e.g. unparsable tool arguments)."""


def tool_schemas(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The registry's tool descriptions as OpenAI-style function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": function_of(tool["name"]),
                "description": tool.get("description") or tool["name"],
                "parameters": tool.get("schema") or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


def handoff_schemas(agents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One function tool per agent the planner may hand the run to."""
    return [
        {
            "type": "function",
            "function": {
                "name": function_name(agent["agent_id"]),
                "description": f"Hand the task to {agent['agent_id']}, which works on it "
                f"with its own tools and hands back its answer. {agent.get('description', '')}",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "description": "What it is to do."},
                        "data": {"type": "object", "description": "Structured input for it."},
                    },
                    "required": ["task"],
                },
            },
        }
        for agent in agents
    ]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def context_note(view: PlannerView) -> str:
    ctx = view.context
    note: dict[str, Any] = {
        "user_id": ctx.user_id,
        "tenant_id": ctx.tenant_id,
        "scope": ctx.scope,
    }
    note.update(ctx.model_extra or {})
    return f"Run context: {_json(note)}"


def observation_text(obs: Observation, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """What the model is told a tool call returned: the output, or the error code and message."""
    if obs.status == "succeeded":
        text = _json(obs.output) if obs.output is not None else (obs.summary or "ok")
        if obs.artifact_id and obs.artifact_id not in text:
            text += f"\nartifact_id: {obs.artifact_id}"
        return _clip(text, limit)
    return _clip(f"{obs.status}: {obs.error or obs.summary or 'failed'}", limit)


def _steps(observations: Sequence[Observation]) -> list[list[Observation]]:
    """Observations grouped by step, steps in the order they first appear."""
    grouped: dict[int, list[Observation]] = {}
    for obs in observations:
        grouped.setdefault(obs.step_index, []).append(obs)
    return list(grouped.values())


def build_messages(
    view: PlannerView,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
) -> list[BaseMessage]:
    """The conversation so far, rebuilt deterministically from the view.

    Observations do not hold the arguments of a call, so the rebuilt tool calls
    carry ``{}``; the tool messages carry what happened.
    """
    task = view.input
    if view.task_data is not None:
        task += f"\n\nTask data: {_json(view.task_data)}"
    messages: list[BaseMessage] = [
        SystemMessage(content=system_prompt),
        HumanMessage(content=f"{task}\n\n{context_note(view)}"),
    ]
    for step in _steps(view.observations):
        calls = [o for o in step if o.tool_call_id]
        notes = [o for o in step if not o.tool_call_id]
        if calls:
            seen: dict[str, int] = {}
            ids: list[str] = []
            for obs in calls:
                n = seen[obs.tool_call_id] = seen.get(obs.tool_call_id, 0) + 1
                ids.append(obs.tool_call_id if n == 1 else f"{obs.tool_call_id}-{n}")
            messages.append(
                AIMessage(
                    content="",
                    tool_calls=[
                        LCToolCall(
                            name=function_of(obs.tool), args={}, id=call_id, type="tool_call"
                        )
                        for obs, call_id in zip(calls, ids, strict=True)
                    ],
                )
            )
            for obs, call_id in zip(calls, ids, strict=True):
                messages.append(
                    ToolMessage(
                        content=observation_text(obs, max_observation_chars),
                        tool_call_id=call_id,
                        # As it was offered: a past call under a name the provider
                        # refuses is a 400 too.
                        name=function_of(obs.tool),
                        status="success" if obs.status == "succeeded" else "error",
                    )
                )
        for obs in notes:
            # Not a tool call: the runtime refused a step (e.g. finish while work is open).
            messages.append(AIMessage(content=f"[{obs.tool}]"))
            messages.append(
                HumanMessage(
                    content=f"[runtime] {obs.status}: "
                    + _clip(obs.error or obs.summary or "", max_observation_chars)
                )
            )
    return messages


def answer_text(message: AIMessage) -> str:
    """The reply's text blocks only: reasoning/thinking blocks are never kept."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def _tokens(message: AIMessage) -> int:
    """The reply's tokens as its provider reports them (the total, or input and output
    where the total is missing); what is not a count of them counts as none. Bounds
    are the node's (``runtime.budget.counted``)."""
    usage: dict[str, Any] = dict(message.usage_metadata or {})

    def count(key: str) -> int:
        value = usage.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0
        return int(value) if math.isfinite(value) else 0

    return count("total_tokens") or count("input_tokens") + count("output_tokens")


def function_name(agent_id: str) -> str:
    """The function a model calls to hand off to ``agent_id``: ``handoff_to_<id>``, as
    the run's events name it, where providers take it."""
    return function_of(handoff_tool(agent_id))


def function_of(name: str) -> str:
    """A tool's name where providers take it as a function's (letters, digits, ``_``
    and ``-``, at most 64); else made so, with a hash of the name to keep it one tool's.
    An id with a dot (``sales.report``) made every call of its planner a 400."""
    if FUNCTION_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[:55]}_{digest}"


def to_decision(
    message: AIMessage,
    tools: Sequence[dict[str, Any]] = (),
    cost_per_token: float = 0.0,
    agents: Sequence[dict[str, Any]] = (),
) -> Decision:
    """The model's reply as a structured decision; its tool calls name the versions it saw."""
    try:
        return _decision(message, tools, cost_per_token, agents)
    except ModelOutputError as exc:
        setattr(exc, LLM_SPENT, _usage(message, cost_per_token))  # paid for all the same
        raise
    except ValidationError as exc:  # e.g. a handoff task longer than an input may be
        bad = ModelOutputError(f"the model's reply is not a valid decision: {exc}")
        setattr(bad, LLM_SPENT, _usage(message, cost_per_token))
        raise bad from None


def _usage(message: AIMessage, cost_per_token: float) -> DecisionUsage:
    tokens = _tokens(message)
    # (Capped before the product: 10**400 tokens times a price overflows a float.)
    cost = min(tokens, SPENT_CAP) * cost_per_token
    return DecisionUsage(llm_calls=1, tokens=tokens, cost_usd=cost)


def _decision(
    message: AIMessage,
    tools: Sequence[dict[str, Any]],
    cost_per_token: float,
    agents: Sequence[dict[str, Any]],
) -> Decision:
    usage = _usage(message, cost_per_token)
    if message.invalid_tool_calls:
        bad = ", ".join(
            f"{c.get('name') or '?'} ({c.get('error') or 'unparsable arguments'})"
            for c in message.invalid_tool_calls
        )
        raise ModelOutputError(f"the model proposed tool calls that cannot be parsed: {bad}")
    targets = {function_name(a["agent_id"]): str(a["agent_id"]) for a in agents}
    handoffs = [c for c in message.tool_calls if c["name"] in targets]
    if handoffs:
        if len(message.tool_calls) > 1:
            # Control cannot go to another agent and stay here to run tools at once.
            raise ModelOutputError("a handoff must be the reply's only tool call")
        args = handoffs[0]["args"]
        target = targets[handoffs[0]["name"]]
        data = args.get("data")
        task = utf8(str(args.get("task") or "")).strip()
        return Decision(
            kind="handoff",
            summary=_clip(f"hand off to {target}: {task}", SUMMARY_CHARS),
            handoff=Handoff(
                agent_id=target,
                task=task or "(no task given)",
                data=data if isinstance(data, dict) else None,
            ),
            usage=usage,
        )
    if message.tool_calls:
        versions = {t["name"]: t.get("version") for t in tools}
        named = {function_of(t["name"]): t["name"] for t in tools}  # as it was offered
        calls = [
            ProposedCall(tool=tool, version=versions.get(tool), args=c["args"])
            for c in message.tool_calls
            for tool in [named.get(c["name"], utf8(c["name"]))]
        ]
        summary = "call " + ", ".join(c.tool for c in calls)
        return Decision(
            kind="tool_calls",
            summary=_clip(summary, SUMMARY_CHARS),
            tool_calls=calls,
            usage=usage,
        )
    answer = utf8(answer_text(message)).strip()
    if not answer:
        # What a content filter or a cut-off leaves: no run succeeds on it.
        raise ModelOutputError("the model's reply has neither text nor a tool call")
    return Decision(kind="finish", summary=_clip(answer, SUMMARY_CHARS), answer=answer, usage=usage)


class ChatModelPlanner:
    """Implements :class:`runtime.planner.Planner` with a tool-calling chat model."""

    def __init__(
        self,
        model: BaseChatModel,
        *,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        cost_per_token: float = 0.0,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
        max_attempts: int = 3,
        backoff_s: float = 1.0,
    ) -> None:
        """``max_attempts``: model calls per step when they fail transiently; the waits
        between them start at ``backoff_s`` and double (with jitter)."""
        self.model = model
        self.system_prompt = system_prompt
        self.cost_per_token = cost_per_token
        self.max_observation_chars = max_observation_chars
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s

    def messages(self, view: PlannerView) -> list[BaseMessage]:
        return build_messages(view, self.system_prompt, self.max_observation_chars)

    async def next_step(self, view: PlannerView) -> Decision:
        bound = self.model.bind_tools(tool_schemas(view.tools) + handoff_schemas(view.agents))
        messages = self.messages(view)
        # Each attempt is a call the run's LLM budget counts: retries stay within it.
        allowed = self.max_attempts
        if view.llm_calls_left is not None:
            allowed = max(1, min(allowed, view.llm_calls_left))
        attempt = 1
        while True:
            try:
                reply = await bound.ainvoke(messages)
                break
            except Exception as exc:
                if attempt >= allowed or not is_transient(exc):
                    # The calls made still count against the run's budget.
                    setattr(exc, LLM_CALLS, attempt)
                    raise
                delay = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
                log.warning(
                    "model call %d of %d for %s failed (%r); asking again in %.1fs",
                    attempt, allowed, view.run_id, exc, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                attempt += 1
        try:
            decision = to_decision(reply, view.tools, self.cost_per_token, view.agents)
        except ModelOutputError as exc:
            setattr(exc, LLM_CALLS, attempt)  # the reply was paid for all the same
            raise
        # Every attempt is a model call the LLM-call budget counts (a timed-out one may
        # even have been billed); their tokens are unknown.
        usage = decision.usage.model_copy(update={"llm_calls": attempt})
        return decision.model_copy(update={"usage": usage})


def init_chat_planner(model: str, **kwargs: Any) -> ChatModelPlanner:
    """``ChatModelPlanner(init_chat_model(model))``, e.g. ``"openai:gpt-4o-mini"``.

    Needs the optional extra ``agent-runtime[llm]`` (``langchain``) and the
    provider's package; imported only here so the default install works without them.
    """
    try:
        chat_models = importlib.import_module("langchain.chat_models")
    except ImportError as exc:
        raise PlannerModelError(
            f"planner model {model!r} needs langchain: install agent-runtime[llm] "
            "and the provider's package (e.g. langchain-openai)"
        ) from exc
    try:
        chat_model: BaseChatModel = chat_models.init_chat_model(model)
    except Exception as exc:
        # Whatever the provider raises: unknown provider, its package missing, no API
        # key (openai.OpenAIError), a bad option. Its message may span lines.
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise PlannerModelError(f"planner model {model!r} cannot be made: {reason}") from exc
    return ChatModelPlanner(chat_model, **kwargs)
