"""The retail planner as a state machine over observations, alone and driving the real tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.ids import artifact_id
from runtime.model import Artifact, Decision, RunContext, utcnow
from runtime.planner import Observation, PlannerView
from runtime.tooling import ToolContext
from tools.retail import RetailPlanner, build_registry, count_outbox, generate
from tools.retail.data import DECLINE_FACTORS
from tools.retail.writer import ReportWriterPlanner

ZH = "上周华东区销售下滑的主要 SKU 是什么？"
EN = "Which SKUs drove last week's sales drop in the east region?"
ART = "sha256:" + "b" * 64
FINDINGS: dict[str, Any] = {
    "region": "east",
    "week_start": "2026-11-16",
    "prior_week_start": "2026-11-09",
    "total_last": 900.0,
    "total_prior": 1000.0,
    "change_pct": -10.0,
    "top_decliners": [
        {
            "sku": "SKU-1008",
            "name": "Olive Oil",
            "last": 45.0,
            "prior": 100.0,
            "delta": -55.0,
            "change_pct": -55.0,
        },
        {
            "sku": "SKU-1014",
            "name": "Cold Brew",
            "last": 60.0,
            "prior": 100.0,
            "delta": -40.0,
            "change_pct": -40.0,
        },
        {
            "sku": "SKU-1007",
            "name": "Rice",
            "last": 98.0,
            "prior": 100.0,
            "delta": -2.0,
            "change_pct": -2.0,
        },
    ],
}


def obs(
    tool: str,
    status: str = "succeeded",
    output: Any = None,
    error: str | None = None,
    artifact: str | None = None,
    step: int = 0,
) -> Observation:
    return Observation(
        step_index=step,
        tool_call_id=f"tc-{tool}-{step}",
        tool=tool,
        status=status,
        output=output,
        error=error,
        artifact_id=artifact,
    )


def view(
    text: str = EN, observations: list[Observation] | None = None, context: RunContext | None = None
) -> PlannerView:
    return PlannerView(
        run_id="run-1",
        input=text,
        context=context or RunContext(),
        step_index=len(observations or []),
        observations=observations or [],
    )


async def step(v: PlannerView) -> Decision:
    decision = await RetailPlanner().next_step(v)
    assert decision.summary
    assert decision.usage.llm_calls == 0 and decision.usage.tokens == 0
    return decision


QUERIED = [obs("query_sales", output=FINDINGS)]
REPORTED = [
    *QUERIED,
    obs(
        "write_report",
        output={"artifact_id": ART, "size": 10, "media_type": "text/markdown"},
        step=1,
    ),
]


async def test_first_step_queries_the_parsed_region() -> None:
    d = await step(view(EN))
    assert d.kind == "tool_calls"
    assert d.tool_calls[0].tool == "query_sales"
    assert d.tool_calls[0].args == {"region": "east", "top_n": 5}
    assert "east" in d.summary and "2026-11-16" in d.summary
    for text, region in (
        ("华北上周怎么样", "north"),
        ("South region sales?", "south"),
        ("华西区", "west"),
        (ZH, "east"),
    ):
        assert (await step(view(text))).tool_calls[0].args["region"] == region


async def test_region_defaults_to_scope_then_east() -> None:
    ctx = RunContext(scope=["reports:write", "sales_region:west", "sales_region:north"])
    assert (await step(view("Which SKUs fell?", context=ctx))).tool_calls[0].args[
        "region"
    ] == "west"
    assert (await step(view("Which SKUs fell?"))).tool_calls[0].args["region"] == "east"


async def test_walks_query_report_publish_finish() -> None:
    d = await step(view(EN, QUERIED))
    call = d.tool_calls[0]
    assert call.tool == "write_report"
    assert call.args["findings"] == FINDINGS and call.args["question"] == EN
    assert call.args["title"] == "East region sales decline, week of 2026-11-16"

    d = await step(view(EN, REPORTED))
    call = d.tool_calls[0]
    assert call.tool == "publish_report"
    assert call.args == {
        "artifact_id": ART,
        "channel": "email",
        "recipients": ["sales-ops@example.com"],
        "subject": "East region sales decline, week of 2026-11-16",
    }

    published = obs(
        "publish_report",
        output={"outbox_id": 7, "status": "queued", "idempotency_key": "idem-x"},
        step=2,
    )
    d = await step(view(EN, [*REPORTED, published]))
    assert d.kind == "finish"
    assert d.answer is not None
    assert "SKU-1008" in d.answer and "-55.0%" in d.answer and "SKU-1014" in d.answer
    assert "SKU-1007" not in d.answer  # a 2% dip is noise, not a driver
    assert d.data is not None
    assert d.data["top_skus"] == ["SKU-1008", "SKU-1014"]
    assert d.data["region"] == "east" and d.data["week_start"] == "2026-11-16"
    assert d.data["published"] is True and d.data["outbox_id"] == 7


async def test_report_artifact_id_may_come_from_the_observation() -> None:
    reported = [*QUERIED, obs("write_report", output=None, artifact=ART, step=1)]
    d = await step(view(EN, reported))
    assert d.tool_calls[0].args["artifact_id"] == ART


async def test_recipients_come_from_context_notify() -> None:
    ctx = RunContext.model_validate({"notify": ["a@example.com", "b@example.com"]})
    d = await step(view(EN, REPORTED, ctx))
    assert d.tool_calls[0].args["recipients"] == ["a@example.com", "b@example.com"]


async def test_corrects_an_invalid_argument() -> None:
    text = "Which SKUs dropped in the east in the week of 2026-11-18?"
    first = await step(view(text))
    assert first.tool_calls[0].args["week_start"] == "2026-11-18"
    bad = obs(
        "query_sales",
        "TOOL_ARGUMENT_INVALID",
        error="week_start: Value error, week_start must be a Monday",
    )
    d = await step(view(text, [bad]))
    assert d.tool_calls[0].tool == "query_sales"
    assert d.tool_calls[0].args == {"region": "east", "top_n": 5}


async def test_gives_up_after_repeated_invalid_arguments() -> None:
    bad = [
        obs("query_sales", "TOOL_ARGUMENT_INVALID", error="args: nonsense", step=i)
        for i in range(3)
    ]
    d = await step(view(EN, bad))
    assert d.kind == "finish" and d.answer is not None and "nonsense" in d.answer


async def test_business_error_finishes_with_the_reason() -> None:
    failed = obs("query_sales", "TOOL_BUSINESS_ERROR", error="no sales data for region east")
    d = await step(view(EN, [failed]))
    assert d.kind == "finish" and d.answer is not None and "no sales data" in d.answer


async def test_rejected_publish_finishes_without_publishing() -> None:
    rejected = obs("publish_report", "APPROVAL_REJECTED", error="not today", step=2)
    d = await step(view(EN, [*REPORTED, rejected]))
    assert d.kind == "finish" and not d.tool_calls
    assert d.data is not None and d.data["published"] is False
    assert d.data["publish_status"] == "APPROVAL_REJECTED"
    assert d.answer is not None and "not approved" in d.answer


async def test_no_publish_in_the_question_skips_publish() -> None:
    for text in ("East sales drop? no publish", "上周华东区销售下滑的主要 SKU，不发布"):
        d = await step(view(text, REPORTED))
        assert d.kind == "finish"
        assert d.data is not None and d.data["published"] is False


async def test_chinese_question_gets_chinese_answer_and_title() -> None:
    d = await step(view(ZH, QUERIED))
    assert d.tool_calls[0].args["title"] == "华东区销售下滑分析（2026-11-16 当周）"
    published = obs("publish_report", output={"outbox_id": 1, "status": "queued"}, step=2)
    d = await step(view(ZH, [*REPORTED, published]))
    assert d.answer is not None
    assert "华东" in d.answer and "主要下滑 SKU" in d.answer and "SKU-1008" in d.answer
    assert "-55.0%" in d.answer


class Sink:
    async def put(self, content: bytes, media_type: str, name: str) -> Artifact:
        return Artifact(
            artifact_id=artifact_id(content),
            media_type=media_type,
            size=len(content),
            name=name,
            created_at=utcnow(),
        )


async def test_drives_the_real_tools_to_an_answer(tmp_path: Path) -> None:
    db = tmp_path / "retail.db"
    generate(db)
    registry = build_registry(db)
    observations: list[Observation] = []
    ctx = RunContext(scope=["sales_region:east"])
    for index in range(6):
        d = await step(view(ZH, observations, ctx))
        if d.kind == "finish":
            break
        proposed = d.tool_calls[0]
        spec = registry.resolve(proposed.tool, proposed.version)
        assert spec is not None
        args = spec.args_model.model_validate(proposed.args)
        assert all(s in ctx.scope for s in spec.required_scopes(args))
        tctx = ToolContext(
            run_id="run-1",
            tool_call_id=f"tc-{index}",
            idempotency_key=f"idem-{index}",
            context=ctx,
            artifacts=Sink(),
        )
        output = await spec.handler(args, tctx)
        observations.append(
            obs(spec.name, output=output, step=index, artifact=output.get("artifact_id"))
        )
    assert [o.tool for o in observations] == ["query_sales", "write_report", "publish_report"]
    assert d.kind == "finish" and d.data is not None
    assert set(d.data["top_skus"]) == set(DECLINE_FACTORS)
    assert count_outbox(db) == 1


async def test_a_long_notify_list_is_handed_off_whole_and_named_in_brief() -> None:
    """The recipients go to the report writer as data; the task's text (bounded, as
    every handoff's) names a few, so a long list cannot make the decision invalid."""
    notify = [f"{'x' * 200}{i}@example.com" for i in range(150)]
    notify[1] = "y" * 100_000  # not an address at all: the publish tool will say so
    ctx = RunContext.model_validate({"notify": notify})
    d = await RetailPlanner(report_agent="report_writer").next_step(view(EN, QUERIED, ctx))
    assert d.kind == "handoff" and d.handoff is not None
    assert d.handoff.data is not None and d.handoff.data["recipients"] == notify
    assert notify[0] in d.handoff.task and "147 more" in d.handoff.task
    assert len(d.handoff.task) < 1_000


@pytest.mark.parametrize("depth", [65, 300, 900, 2_000, 100_000])
async def test_a_brief_nested_too_deep_is_no_brief_not_a_failed_run(depth: int) -> None:
    """The writer's answer to any brief it cannot use. Past Python's stack the run
    failed PLANNER_ERROR on a RecursionError; from a few hundred levels, INTERNAL_ERROR,
    as its decision could not be recorded (a fuzzing helper, then a review, found)."""
    deep = "[" * depth + "]" * depth
    brief = '{"title": "t", "question": "q", "findings": {"x": ' + deep + "}}"
    for text in (deep, brief):
        view = PlannerView(run_id="r", input=text, context=RunContext(), step_index=0)
        decision = await ReportWriterPlanner().next_step(view)
        assert decision.kind == "finish" and decision.data is not None
        error = decision.data["error"]
        no_brief = ("the input is not a JSON brief", "the brief nests deeper", "the brief is")
        assert error.startswith(no_brief), error
