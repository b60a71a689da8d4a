"""A deterministic planner for report_writer: write_report, then publish_report, then finish.

The retail analyst hands it a brief (``task_data``): title, question, findings,
recipients and whether to publish. Run on its own, the brief is the run's input
as a JSON object. Its finish hands back the report's artifact id and what became
of publishing, for the caller to answer with.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.errors import Code
from runtime.model import Decision, DecisionUsage, ProposedCall
from runtime.planner import Observation, PlannerView
from runtime.storable import MAX_NESTING, nests_deeper
from tools.retail.report import has_cjk

AGENT_ID = "report_writer"


class Brief(BaseModel):
    """What report_writer is asked to do."""

    model_config = ConfigDict(extra="ignore")
    title: str = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1)
    findings: dict[str, Any]
    recipients: list[str] = Field(default_factory=list)
    publish: bool = True


def _of(view: PlannerView, tool: str) -> list[Observation]:
    return [o for o in view.observations if o.tool.split("@", 1)[0] == tool]


def _succeeded(observations: list[Observation]) -> Observation | None:
    return next((o for o in reversed(observations) if o.status == "succeeded"), None)


def brief_of(view: PlannerView) -> Brief | str:
    """The brief, or why there is none."""
    raw: Any = view.task_data
    if raw is None:
        try:
            raw = json.loads(view.input)
        except (ValueError, RecursionError):  # JSON nested past Python's stack: no brief
            return "the input is not a JSON brief {title, question, findings, recipients?}"
    if nests_deeper(raw):
        return f"the brief nests deeper than {MAX_NESTING} levels"
    try:
        return Brief.model_validate(raw)
    except ValidationError as exc:
        return f"the brief is incomplete: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"


def publish_data(
    report: str | None, publish_status: str, outbox_id: Any = None, note: str | None = None
) -> dict[str, Any]:
    """What a finish records of the report and its publication."""
    data: dict[str, Any] = {
        "report_artifact_id": report,
        "published": publish_status == "succeeded",
        "publish_status": publish_status,
    }
    if outbox_id is not None:
        data["outbox_id"] = outbox_id
    if note:
        data["note"] = note
    return data


def publish_sentence(report: str | None, publish_status: str, zh: bool) -> str:
    if report is None:
        return "未生成报告。" if zh else "No report was written."
    if publish_status == "succeeded":
        return "报告已生成并提交发送。" if zh else "The report was written and queued for email."
    if publish_status == Code.APPROVAL_REJECTED:
        return (
            "报告已生成，发布未获批准。"
            if zh
            else "The report was written; publishing was not approved."
        )
    if publish_status == "not_requested":
        return "报告已生成，未发布。" if zh else "The report was written and not published."
    return (
        f"报告已生成，发布失败（{publish_status}）。"
        if zh
        else f"The report was written; publishing failed ({publish_status})."
    )


class ReportWriterPlanner:
    """Writes the report it is briefed on and publishes it (publishing needs approval)."""

    async def next_step(self, view: PlannerView) -> Decision:
        brief = brief_of(view)
        if isinstance(brief, str):
            return Decision(
                kind="finish",
                summary="no brief",
                answer=f"Could not write a report: {brief}",
                data={"error": brief, "report_artifact_id": None, "publish_status": "none"},
            )
        zh = has_cjk(brief.question)
        reports = _of(view, "write_report")
        report = _succeeded(reports)
        if report is None:
            if reports:
                return self._finish(None, "not_requested", zh, note=reports[-1].error)
            return Decision(
                kind="tool_calls",
                summary=f"write report {brief.title[:80]}",
                tool_calls=[
                    ProposedCall(
                        tool="write_report",
                        version="1",
                        args={
                            "title": brief.title,
                            "question": brief.question,
                            "findings": brief.findings,
                        },
                    )
                ],
                usage=DecisionUsage(),
            )
        out = report.output if isinstance(report.output, dict) else {}
        art = out.get("artifact_id") or report.artifact_id
        publishes = _of(view, "publish_report")
        if publishes or not brief.publish or not brief.recipients or art is None:
            # One attempt only: a rejected or failed publish is not retried with other args.
            status = publishes[-1].status if publishes else "not_requested"
            published = _succeeded(publishes)
            outbox = published.output.get("outbox_id") if published and published.output else None
            return self._finish(art, status, zh, outbox_id=outbox)
        return Decision(
            kind="tool_calls",
            summary=f"publish report {art[:19]} to {len(brief.recipients)} recipient(s)",
            tool_calls=[
                ProposedCall(
                    tool="publish_report",
                    version="1",
                    args={
                        "artifact_id": art,
                        "channel": "email",
                        "recipients": brief.recipients,
                        "subject": brief.title,
                    },
                )
            ],
            usage=DecisionUsage(),
        )

    def _finish(
        self,
        report: str | None,
        publish_status: str,
        zh: bool,
        *,
        outbox_id: Any = None,
        note: str | None = None,
    ) -> Decision:
        data = publish_data(report, publish_status, outbox_id, note)
        return Decision(
            kind="finish",
            summary=f"report {report or 'not written'}, publish {publish_status}",
            answer=publish_sentence(report, publish_status, zh),
            data=data,
            usage=DecisionUsage(),
        )
