"""The chat-model planner with langchain-core's fake chat model: messages in, decision out."""

from __future__ import annotations

import json
import logging
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.outputs import ChatResult
from pydantic import Field

from graphs.chat_planner import (
    DEFAULT_SYSTEM_PROMPT,
    ChatModelPlanner,
    ModelOutputError,
    PlannerModelError,
    build_messages,
    handoff_schemas,
    is_transient,
    to_decision,
    tool_schemas,
)
from graphs.retail_analyst import RETAIL_PROMPT, build_agent, make_planner
from runtime.budget import SPENT_CAP, counted
from runtime.model import RunContext
from runtime.planner import Observation, PlannerView, llm_calls_of, spent_of
from server.agents import load_agents
from server.settings import Settings
from tools.retail import RetailPlanner, build_registry, generate

SECRET = "SECRET-CHAIN-OF-THOUGHT"
ART = "sha256:" + "a" * 64


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel (no ``bind_tools`` of its own) that records what it was shown."""

    disable_streaming: bool = True
    calls: list[list[BaseMessage]] = Field(default_factory=list)
    bound: list[list[dict[str, Any]]] = Field(default_factory=list)
    fail: str | None = None
    raises: list[Exception] = Field(default_factory=list)
    """Raised one by one by the next calls, before any reply."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        self.bound.append(list(tools))
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(list(messages))
        if self.fail:
            raise RuntimeError(self.fail)
        if self.raises:
            raise self.raises.pop(0)
        return super()._generate(messages, stop, run_manager, **kwargs)


def tool_call(name: str, call_id: str = "call-1", **args: Any) -> ToolCall:
    return ToolCall(name=name, args=args, id=call_id, type="tool_call")


def reply(
    *calls: ToolCall, content: str | list[str | dict[str, Any]] = "", tokens: int | None = None
) -> AIMessage:
    usage = (
        {"input_tokens": tokens - 1, "output_tokens": 1, "total_tokens": tokens}
        if tokens is not None
        else None
    )
    return AIMessage(content=content, tool_calls=list(calls), usage_metadata=usage)


def scripted(*replies: AIMessage) -> ScriptedChatModel:
    return ScriptedChatModel(messages=iter(replies))


@pytest.fixture
def tools(tmp_path: Path) -> list[dict[str, Any]]:
    db = tmp_path / "retail.db"
    generate(db)
    return [spec.describe() for spec in build_registry(db).specs()]


def view(tools: list[dict[str, Any]], *observations: Observation, notify: str = "") -> PlannerView:
    extra = {"notify": notify} if notify else {}
    return PlannerView(
        run_id="run-1",
        input="Which SKUs drove last week's sales drop in the east region?",
        context=RunContext(user_id="u1", tenant_id="t1", scope=["sales_region:east"], **extra),
        step_index=len({o.step_index for o in observations}),
        observations=list(observations),
        tools=tools,
    )


def obs(step: int, tc: str, tool: str, status: str = "succeeded", **kw: Any) -> Observation:
    return Observation(step_index=step, tool_call_id=tc, tool=tool, status=status, **kw)


HISTORY = (
    obs(0, "tc-a", "query_sales", "TOOL_ARGUMENT_INVALID", error="region: bad", summary="x"),
    obs(1, "tc-b", "teleport", "TOOL_NOT_FOUND", error="no tool teleport", summary="no tool"),
    obs(2, "tc-c", "query_sales", output={"region": "east", "top": ["SKU-1008"]}, summary="s"),
    obs(3, "tc-d", "write_report", output={"size": 9}, artifact_id=ART, summary="s"),
    obs(3, "tc-e", "publish_report", "APPROVAL_REJECTED", error="not now", summary="rejected"),
    obs(4, "", "finish", "FINISH_REFUSED", error="an approval is still open"),
)


def answered_call_id(message: BaseMessage) -> str:
    """The id of the tool call ``message`` answers: it must be a tool message."""
    assert isinstance(message, ToolMessage), message
    return message.tool_call_id


def test_tools_become_openai_function_schemas(tools: list[dict[str, Any]]) -> None:
    schemas = tool_schemas(tools)
    assert [s["function"]["name"] for s in schemas] == [
        "publish_report",
        "query_sales",
        "write_report",
    ]
    query = schemas[1]
    assert query["type"] == "function"
    assert query["function"]["description"].startswith("Revenue by SKU")
    params = query["function"]["parameters"]
    assert params == tools[1]["schema"]
    assert params["required"] == ["region"]
    assert params["properties"]["region"]["enum"] == ["east", "north", "south", "west"]


def test_messages_are_rebuilt_from_the_observations(tools: list[dict[str, Any]]) -> None:
    v = view(tools, *HISTORY, notify="ops@example.com")
    messages = build_messages(v)
    assert messages == build_messages(v.model_copy(deep=True)), "deterministic"
    assert [type(m).__name__ for m in messages] == [
        "SystemMessage",
        "HumanMessage",
        "AIMessage",  # step 0
        "ToolMessage",
        "AIMessage",  # step 1
        "ToolMessage",
        "AIMessage",  # step 2
        "ToolMessage",
        "AIMessage",  # step 3: both calls of the step in one message
        "ToolMessage",
        "ToolMessage",
        "AIMessage",  # step 4: the refused finish, a runtime note
        "HumanMessage",
    ]
    system, human = messages[0], messages[1]
    assert isinstance(system, SystemMessage) and system.content == DEFAULT_SYSTEM_PROMPT
    assert isinstance(human, HumanMessage)
    assert isinstance(human.content, str) and human.content.startswith(v.input)
    note = json.loads(human.content.split("Run context: ", 1)[1])
    assert note == {
        "user_id": "u1",
        "tenant_id": "t1",
        "scope": ["sales_region:east"],
        "notify": "ops@example.com",
    }

    step3 = messages[8]
    assert isinstance(step3, AIMessage)
    assert [(c["name"], c["id"], c["args"]) for c in step3.tool_calls] == [
        ("write_report", "tc-d", {}),
        ("publish_report", "tc-e", {}),
    ]
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.name, m.status) for m in tool_messages] == [
        ("tc-a", "query_sales", "error"),
        ("tc-b", "teleport", "error"),
        ("tc-c", "query_sales", "success"),
        ("tc-d", "write_report", "success"),
        ("tc-e", "publish_report", "error"),
    ]
    contents = [m.content for m in tool_messages]
    assert contents[0] == "TOOL_ARGUMENT_INVALID: region: bad"
    assert contents[1] == "TOOL_NOT_FOUND: no tool teleport"
    assert json.loads(str(contents[2])) == {"region": "east", "top": ["SKU-1008"]}
    assert contents[3] == f'{{"size": 9}}\nartifact_id: {ART}'
    assert contents[4] == "APPROVAL_REJECTED: not now"
    # Every tool call is answered by a tool message with its id, right after it.
    for i, message in enumerate(messages):
        if isinstance(message, AIMessage) and message.tool_calls:
            answered = [
                answered_call_id(m) for m in messages[i + 1 : i + 1 + len(message.tool_calls)]
            ]
            assert answered == [c["id"] for c in message.tool_calls]
    assert messages[-1].content == "[runtime] FINISH_REFUSED: an approval is still open"


def test_long_outputs_are_clipped_and_duplicate_ids_stay_unique(
    tools: list[dict[str, Any]],
) -> None:
    big = obs(0, "tc-a", "query_sales", output={"rows": "x" * 50_000})
    again = obs(0, "tc-a", "query_sales", "TOOL_OUTCOME_UNKNOWN", error="not run again")
    messages = ChatModelPlanner(scripted(), max_observation_chars=100).messages(
        view(tools, big, again)
    )
    ai, first, second = messages[2], messages[3], messages[4]
    assert isinstance(ai, AIMessage) and [c["id"] for c in ai.tool_calls] == ["tc-a", "tc-a-2"]
    assert isinstance(first, ToolMessage) and len(str(first.content)) == 100
    assert isinstance(second, ToolMessage) and second.tool_call_id == "tc-a-2"
    assert second.content == "TOOL_OUTCOME_UNKNOWN: not run again"


async def test_tool_calls_become_a_decision(tools: list[dict[str, Any]]) -> None:
    model = scripted(
        reply(
            tool_call("query_sales", "c1", region="east", top_n=3),
            tool_call("write_report", "c2", title="t"),
            content=f"Let me think. {SECRET}",
            tokens=120,
        )
    )
    planner = ChatModelPlanner(model, cost_per_token=0.5)
    v = view(tools, *HISTORY[:3])
    decision = await planner.next_step(v)
    assert decision.kind == "tool_calls"
    assert [(c.tool, c.version, c.args) for c in decision.tool_calls] == [
        ("query_sales", "1", {"region": "east", "top_n": 3}),
        ("write_report", "1", {"title": "t"}),
    ]
    assert decision.summary == "call query_sales, write_report"
    assert decision.answer is None
    assert decision.usage.model_dump() == {"llm_calls": 1, "tokens": 120, "cost_usd": 60.0}
    assert SECRET not in decision.model_dump_json()
    # The model got the registry's tools and the rebuilt conversation.
    assert model.bound == [tool_schemas(tools)]
    assert model.calls == [build_messages(v)]


async def test_unknown_tools_keep_no_version(tools: list[dict[str, Any]]) -> None:
    planner = ChatModelPlanner(scripted(reply(tool_call("teleport", where="mars"))))
    decision = await planner.next_step(view(tools))
    assert [(c.tool, c.version, c.args) for c in decision.tool_calls] == [
        ("teleport", None, {"where": "mars"})
    ]


async def test_a_final_message_finishes_without_its_reasoning(
    tools: list[dict[str, Any]],
) -> None:
    content: list[str | dict[str, Any]] = [
        {"type": "reasoning", "reasoning": SECRET},
        {"type": "thinking", "thinking": SECRET},
        {"type": "text", "text": "SKU-1008 fell 55%. "},
        {"type": "text", "text": "The report was queued."},
    ]
    planner = ChatModelPlanner(scripted(reply(content=content)))
    decision = await planner.next_step(view(tools, *HISTORY[:3]))
    assert decision.kind == "finish"
    assert decision.answer == "SKU-1008 fell 55%. The report was queued."
    assert decision.summary == decision.answer
    assert decision.tool_calls == []
    assert decision.usage.model_dump() == {"llm_calls": 1, "tokens": 0, "cost_usd": 0.0}
    assert SECRET not in decision.model_dump_json()


async def test_a_long_answer_has_a_short_summary(tools: list[dict[str, Any]]) -> None:
    long = "word " * 200
    decision = await ChatModelPlanner(scripted(reply(content=long))).next_step(view(tools))
    assert decision.answer == long.strip()
    assert len(decision.summary) == 200 and decision.summary.endswith("…")


async def test_a_reply_with_nothing_in_it_is_no_answer(tools: list[dict[str, Any]]) -> None:
    """What a content filter or a cut-off leaves: it succeeded the run with an empty
    answer. The reply was paid for: its call and tokens count."""
    planner = ChatModelPlanner(scripted(reply(content=" ", tokens=40)), cost_per_token=1e-6)
    with pytest.raises(ModelOutputError) as empty:
        await planner.next_step(view(tools))
    spent = spent_of(empty.value)
    assert (spent.llm_calls, spent.tokens) == (1, 40)
    assert spent.cost_usd == pytest.approx(4e-5)


async def test_an_unparsable_reply_counts_its_tokens(tools: list[dict[str, Any]]) -> None:
    broken = AIMessage(
        content="",
        invalid_tool_calls=[
            {"name": "x", "args": "{", "id": "c", "error": "bad", "type": "invalid_tool_call"}
        ],
        usage_metadata={"input_tokens": 499, "output_tokens": 1, "total_tokens": 500},
    )
    with pytest.raises(ModelOutputError) as bad:
        await ChatModelPlanner(scripted(broken)).next_step(view(tools))
    assert (spent_of(bad.value).llm_calls, spent_of(bad.value).tokens) == (1, 500)


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        ({"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}, 10),
        ({"input_tokens": 7, "output_tokens": 3, "total_tokens": 0}, 10),  # total not given
        ({"input_tokens": "7", "output_tokens": None, "total_tokens": float("nan")}, 0),
        ({"input_tokens": 0, "output_tokens": 0, "total_tokens": -1_000_000}, -1_000_000),
        ({"input_tokens": 0, "output_tokens": 0, "total_tokens": 2**64}, 2**64),
    ],
    ids=["total", "parts", "not_counts", "negative", "huge"],
)
def test_a_reply_s_tokens_are_what_its_provider_reports(usage: dict[str, Any], tokens: int) -> None:
    """Read as reported; the node bounds them (``counted``): a negative report gave the
    budget back, and 2**64 failed the run's write."""
    message = AIMessage(content="done")
    message.usage_metadata = usage  # type: ignore[assignment]  # as a provider's may be
    decision = to_decision(message, cost_per_token=1e-6)
    assert decision.usage.tokens == tokens
    bounded = counted(decision.usage)
    assert 0 <= bounded.tokens <= SPENT_CAP and 0 <= bounded.cost_usd < float("inf")
    assert bounded.tokens == min(max(tokens, 0), SPENT_CAP)


def test_a_model_s_broken_token_is_kept_as_a_replacement_character() -> None:
    answer = to_decision(AIMessage(content="fin\ud800e"))
    assert answer.answer == "fin\ufffde"
    handoff = to_decision(
        AIMessage(content="", tool_calls=[tool_call("handoff_to_writer", task="do \udcff it")]),
        agents=[{"agent_id": "writer"}],
    )
    assert handoff.handoff is not None and handoff.handoff.task == "do \ufffd it"


@pytest.mark.parametrize("agent_id", ["sales.report_writer", "a" * 100, "writer"])
def test_a_handoff_is_offered_under_a_name_every_provider_takes(agent_id: str) -> None:
    (schema,) = handoff_schemas([{"agent_id": agent_id}])
    name = schema["function"]["name"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name), name
    if agent_id == "writer":
        assert name == "handoff_to_writer"  # as the run's events name it
    decision = to_decision(
        AIMessage(content="", tool_calls=[tool_call(name, task="go")]),
        agents=[{"agent_id": agent_id}, {"agent_id": "other"}],
    )
    assert decision.handoff is not None and decision.handoff.agent_id == agent_id
    # Told back at the next step under the same name: a past call the provider
    # refuses is a 400 as well.
    back = Observation(
        step_index=0, tool_call_id="ho-1", tool=f"handoff_to_{agent_id}", status="succeeded"
    )
    history = build_messages(view([], back))
    assert [c["name"] for m in history if isinstance(m, AIMessage) for c in m.tool_calls] == [name]
    assert [m.name for m in history if isinstance(m, ToolMessage)] == [name]


def test_a_registry_tool_is_offered_called_and_told_back_under_one_name() -> None:
    """Registry names are free: one with a dot was offered as it was, and every call of
    its planner was a 400. Offered under a name providers take, a call under that name
    is the registry's tool, and its past calls are told back under the same name."""
    tools = [{"name": "sales.query", "version": "2", "description": "d", "schema": {}}]
    (schema,) = tool_schemas(tools)
    name = schema["function"]["name"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) and name.startswith("sales_query_")
    decision = to_decision(AIMessage(content="", tool_calls=[tool_call(name)]), tools)
    assert [(c.tool, c.version) for c in decision.tool_calls] == [("sales.query", "2")]
    past = Observation(step_index=0, tool_call_id="tc-1", tool="sales.query", status="succeeded")
    history = build_messages(view([], past))
    assert [m.name for m in history if isinstance(m, ToolMessage)] == [name]
    (plain,) = tool_schemas([{"name": "query_sales"}])
    assert plain["function"]["name"] == "query_sales"  # a name providers take stays


async def test_usage_metadata_sets_tokens_and_cost(tools: list[dict[str, Any]]) -> None:
    planner = ChatModelPlanner(scripted(reply(content="done", tokens=1000)), cost_per_token=2e-6)
    decision = await planner.next_step(view(tools))
    assert decision.usage.llm_calls == 1
    assert decision.usage.tokens == 1000
    assert decision.usage.cost_usd == pytest.approx(0.002)


async def test_unparsable_tool_calls_and_model_errors_propagate(
    tools: list[dict[str, Any]],
) -> None:
    bad = AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "type": "invalid_tool_call",
                "id": "c1",
                "name": "query_sales",
                "args": "{region:",
                "error": "bad JSON",
            }
        ],
    )
    with pytest.raises(ModelOutputError, match="query_sales"):
        await ChatModelPlanner(scripted(bad)).next_step(view(tools))
    with pytest.raises(RuntimeError, match="model down"):
        await ChatModelPlanner(ScriptedChatModel(messages=iter(()), fail="model down")).next_step(
            view(tools)
        )


def test_build_agent_keeps_the_deterministic_planner_by_default(tmp_path: Path) -> None:
    agent = build_agent(tmp_path / "retail.db")
    assert agent.agent_id == "retail_analyst"
    assert agent.metadata == {"planner": "RetailPlanner"}
    given = build_agent(tmp_path / "retail.db", ChatModelPlanner(scripted()))
    assert given.metadata == {"planner": "ChatModelPlanner"}


def test_planner_model_uses_init_chat_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    fake = scripted()

    def init_chat_model(model: str) -> ScriptedChatModel:
        made.append(model)
        return fake

    langchain = types.ModuleType("langchain")
    chat_models = types.ModuleType("langchain.chat_models")
    chat_models.init_chat_model = init_chat_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langchain", langchain)
    monkeypatch.setitem(sys.modules, "langchain.chat_models", chat_models)
    agent = build_agent(tmp_path / "retail.db", planner_model="openai:gpt-4o-mini")
    assert made == ["openai:gpt-4o-mini"]
    assert agent.metadata == {"planner": "ChatModelPlanner", "planner_model": "openai:gpt-4o-mini"}
    # A planner given explicitly wins over the model name.
    explicit = build_agent(tmp_path / "retail.db", RetailPlanner(), planner_model="x:y")
    assert explicit.metadata == {"planner": "RetailPlanner"} and made == ["openai:gpt-4o-mini"]


def test_the_planner_model_s_price_is_what_cost_budgets_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its tokens had no price and none could be given: runs' max_cost_usd (and the
    server's cap) counted nothing for the one planner a deployment configures."""
    chat_models = types.ModuleType("langchain.chat_models")
    chat_models.init_chat_model = lambda _model: scripted()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langchain", types.ModuleType("langchain"))
    monkeypatch.setitem(sys.modules, "langchain.chat_models", chat_models)
    priced = make_planner("openai:gpt-4o", usd_per_million_tokens=2.5)
    assert isinstance(priced, ChatModelPlanner) and priced.cost_per_token == 2.5e-6

    settings = Settings(data_dir=tmp_path, planner_model="openai:gpt-4o")
    with caplog.at_level(logging.WARNING, logger="server.agents"):
        load_agents(settings)
    assert "max_cost_usd budgets count no cost" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="server.agents"):
        agents = load_agents(settings.model_copy(update={"planner_usd_per_million_tokens": 2.5}))
    assert caplog.text == "" and "retail_analyst" in agents


def test_planner_model_without_langchain_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "langchain", None)
    monkeypatch.setitem(sys.modules, "langchain.chat_models", None)
    with pytest.raises(RuntimeError, match=r"agent-runtime\[llm\]"):
        build_agent(tmp_path / "retail.db", planner_model="openai:gpt-4o-mini")


def test_a_model_that_cannot_be_made_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever init_chat_model raises (an unknown provider, its package missing, a
    provider SDK without its API key): one line the server's start can name the
    setting with."""

    class OpenAIError(Exception):  # as openai's, with no OPENAI_API_KEY
        pass

    def init_chat_model(model: str) -> ScriptedChatModel:
        raise OpenAIError("Missing credentials.\n  Set OPENAI_API_KEY.")

    chat_models = types.ModuleType("langchain.chat_models")
    chat_models.init_chat_model = init_chat_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langchain", types.ModuleType("langchain"))
    monkeypatch.setitem(sys.modules, "langchain.chat_models", chat_models)
    with pytest.raises(PlannerModelError) as raised:
        build_agent(tmp_path / "retail.db", planner_model="openai:gpt-4o-mini")
    assert str(raised.value) == (
        "planner model 'openai:gpt-4o-mini' cannot be made: "
        "Missing credentials. Set OPENAI_API_KEY."
    )


def test_retail_prompt_is_added_for_a_configured_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphs import chat_planner

    seen: list[ChatModelPlanner] = []
    real = chat_planner.ChatModelPlanner

    def spy(model: Any, **kwargs: Any) -> ChatModelPlanner:
        planner = real(model, **kwargs)
        seen.append(planner)
        return planner

    chat_models = types.ModuleType("langchain.chat_models")
    chat_models.init_chat_model = lambda model: scripted()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langchain", types.ModuleType("langchain"))
    monkeypatch.setitem(sys.modules, "langchain.chat_models", chat_models)
    monkeypatch.setattr(chat_planner, "ChatModelPlanner", spy)
    build_agent(tmp_path / "retail.db", planner_model="openai:gpt-4o-mini")
    assert len(seen) == 1
    assert seen[0].system_prompt.startswith(DEFAULT_SYSTEM_PROMPT)
    assert seen[0].system_prompt.endswith(RETAIL_PROMPT)


def test_the_setting_reads_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_RUNTIME_PLANNER_MODEL", raising=False)
    assert Settings().planner_model is None
    monkeypatch.setenv("AGENT_RUNTIME_PLANNER_MODEL", "openai:gpt-4o-mini")
    assert Settings().planner_model == "openai:gpt-4o-mini"


class RateLimitError(Exception):
    """Named like the provider SDKs' (openai.RateLimitError): a 429."""

    status_code = 429


class BadRequestError(Exception):
    status_code = 400


async def test_a_transient_model_error_is_asked_again(tools: list[dict[str, Any]]) -> None:
    model = scripted(reply(tool_call("query_sales", region="east")))
    model.raises = [RateLimitError("slow down"), TimeoutError("read timed out")]
    planner = ChatModelPlanner(model, backoff_s=0)

    decision = await planner.next_step(view(tools))

    assert decision.kind == "tool_calls" and len(model.calls) == 3
    assert model.calls[0] == model.calls[2]  # the same question each time
    assert decision.usage.llm_calls == 3  # each attempt counts against the budget


async def test_a_model_error_that_is_not_transient_is_not_retried(
    tools: list[dict[str, Any]],
) -> None:
    model = scripted(reply(tool_call("query_sales", region="east")))
    model.raises = [BadRequestError("context too long")]
    with pytest.raises(BadRequestError):
        await ChatModelPlanner(model, backoff_s=0).next_step(view(tools))
    assert len(model.calls) == 1


async def test_retries_are_bounded(tools: list[dict[str, Any]]) -> None:
    model = scripted(reply(tool_call("query_sales", region="east")))
    model.raises = [RateLimitError(str(i)) for i in range(5)]
    with pytest.raises(RateLimitError, match="2") as failed:
        await ChatModelPlanner(model, backoff_s=0, max_attempts=3).next_step(view(tools))
    assert len(model.calls) == 3
    assert llm_calls_of(failed.value) == 3  # what the planner node adds to the run's usage


async def test_retries_stay_within_the_runs_llm_budget(tools: list[dict[str, Any]]) -> None:
    model = scripted(reply(tool_call("query_sales", region="east")))
    model.raises = [RateLimitError(str(i)) for i in range(5)]
    last_two = view(tools).model_copy(update={"llm_calls_left": 2})
    with pytest.raises(RateLimitError, match="1"):
        await ChatModelPlanner(model, backoff_s=0, max_attempts=3).next_step(last_two)
    assert len(model.calls) == 2

    model = scripted(reply(tool_call("query_sales", region="east")))
    model.raises = [RateLimitError("0")]
    last_one = view(tools).model_copy(update={"llm_calls_left": 1})
    with pytest.raises(RateLimitError):
        await ChatModelPlanner(model, backoff_s=0).next_step(last_one)
    assert len(model.calls) == 1


class ConnectError(Exception):
    """Named like httpx.ConnectError."""


class QuotaError(RateLimitError):
    code = "insufficient_quota"


class WrappedStatus(Exception):
    status_code = "503"


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (RateLimitError(), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (ConnectError(), True),
        (WrappedStatus(), True),
        (BadRequestError(), False),
        (QuotaError(), False),  # waiting does not refill a quota
        (ValueError("bad"), False),
    ],
)
def test_what_counts_as_transient(exc: Exception, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_a_wrapped_transient_error_is_transient() -> None:
    try:
        try:
            raise TimeoutError("read timed out")
        except TimeoutError as inner:
            raise RuntimeError("model call failed") from inner
    except RuntimeError as outer:
        assert is_transient(outer)
