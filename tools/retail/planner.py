"""A deterministic planner for retail_analyst: a state machine over the observations.

query_sales → write_report → publish_report → finish, or, given a report agent,
query_sales → handoff to it (it writes and publishes) → finish. Every decision is
derived from the input, the run context and what the tools returned, so
replaying the same observations always gives the same decision.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from pydantic import ValidationError

from runtime.errors import Code
from runtime.events import handoff_tool
from runtime.model import Decision, DecisionUsage, Handoff, ProposedCall
from runtime.planner import Observation, PlannerView
from tools.retail.data import LAST_WEEK_START, REGION_IDS
from tools.retail.report import Findings, has_cjk, pct, region_label
from tools.retail.tools import MAX_ADDRESS
from tools.retail.writer import publish_data, publish_sentence

DEFAULT_REGION = "east"
DEFAULT_RECIPIENTS = ("sales-ops@example.com",)
TOP_N = 5
MAX_ARG_FIXES = 2
MAX_NAMED = 3
MATERIAL_DROP_PCT = -10.0
"""A SKU counts as a driver of the decline only if it fell at least this much."""
_QUERY_OPTIONAL = ("week_start", "top_n")
_REGION_WORDS = (
    ("east", re.compile(r"华东|\beast(ern)?\b", re.I)),
    ("north", re.compile(r"华北|\bnorth(ern)?\b", re.I)),
    ("south", re.compile(r"华南|\bsouth(ern)?\b", re.I)),
    ("west", re.compile(r"华西|\bwest(ern)?\b", re.I)),
)
_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
_NO_PUBLISH = re.compile(r"no[ -]publish|don'?t publish|do not publish|不发布|不要发布", re.I)


def _tool(obs: Observation) -> str:
    return obs.tool.split("@", 1)[0]


def _of(view: PlannerView, tool: str) -> list[Observation]:
    return [o for o in view.observations if _tool(o) == tool]


def _succeeded(observations: list[Observation]) -> Observation | None:
    return next((o for o in reversed(observations) if o.status == "succeeded"), None)


def parse_region(view: PlannerView) -> str:
    hits = [(m.start(), rid) for rid, rx in _REGION_WORDS if (m := rx.search(view.input))]
    if hits:
        return min(hits)[1]
    for scope in view.context.scope:
        prefix, _, region = scope.partition(":")
        if prefix == "sales_region" and region in REGION_IDS:
            return region
    return DEFAULT_REGION


def _week_from_input(text: str) -> str | None:
    """An ISO date in the question names the week; the tool decides whether it is valid."""
    for raw in _ISO_DATE.findall(text):
        try:
            return date.fromisoformat(raw).isoformat()
        except ValueError:
            continue
    return None


def _bad_fields(observations: list[Observation]) -> set[str] | None:
    """Fields named by argument errors; None when an error names none we can drop."""
    bad: set[str] = set()
    for obs in observations:
        if obs.status != Code.TOOL_ARGUMENT_INVALID:
            continue
        named = {
            f for f in _QUERY_OPTIONAL if re.search(rf"(^|;\s*){f}\b", obs.error or obs.summary)
        }
        if not named:
            return None
        bad |= named
    return bad


def _decision(summary: str, call: ProposedCall) -> Decision:
    return Decision(kind="tool_calls", summary=summary, tool_calls=[call], usage=DecisionUsage())


def _title(findings: Findings, zh: bool) -> str:
    region = region_label(findings.region, zh)
    if zh:
        return f"{region}区销售下滑分析（{findings.week_start} 当周）"
    return f"{region} region sales decline, week of {findings.week_start}"


def _recipients(view: PlannerView) -> list[str]:
    notify = (view.context.model_extra or {}).get("notify")
    if isinstance(notify, str):
        notify = [notify]
    if isinstance(notify, list) and notify:
        return [str(r) for r in notify]
    return list(DEFAULT_RECIPIENTS)


def _named(recipients: list[str], most: int = 3) -> str:
    """A few recipients for a brief's text (the whole list goes along as data)."""
    # Anything longer than an address can be the publish tool refuses anyway.
    named = ", ".join(
        r if len(r) <= MAX_ADDRESS else r[: MAX_ADDRESS - 1] + "…" for r in recipients[:most]
    )
    rest = len(recipients) - most
    return f"{named} and {rest} more" if rest > 0 else named


class RetailPlanner:
    """Answers which SKUs drove a region's weekly sales drop, and files a report.

    With ``report_agent``, the report is that agent's job: the planner hands the
    run to it with a brief and answers from what it hands back.
    """

    def __init__(self, report_agent: str | None = None) -> None:
        self.report_agent = report_agent

    async def next_step(self, view: PlannerView) -> Decision:
        zh = has_cjk(view.input)
        region = parse_region(view)
        queries = _of(view, "query_sales")
        query = _succeeded(queries)
        if query is None:
            return self._query(view, region, queries, zh)
        try:
            findings = Findings.model_validate(query.output)
        except ValidationError:
            # Output too large to inline arrives as an artifact ref; it cannot be read here.
            return self._finish(view, None, zh, note=f"query_sales output: {query.artifact_id}")
        if self.report_agent is not None:
            return self._delegate(view, self.report_agent, findings, query, zh)
        reports = _of(view, "write_report")
        report = _succeeded(reports)
        if report is None:
            if reports:  # a failed report does not invalidate the answer
                return self._finish(view, findings, zh, note=reports[-1].error)
            return _decision(
                f"write report for {findings.region} week {findings.week_start}",
                ProposedCall(
                    tool="write_report",
                    version="1",
                    args={
                        "title": _title(findings, zh),
                        "question": view.input,
                        "findings": query.output,
                    },
                ),
            )
        publishes = _of(view, "publish_report")
        art = (report.output or {}).get("artifact_id") if isinstance(report.output, dict) else None
        art = art or report.artifact_id
        if publishes or _NO_PUBLISH.search(view.input) or art is None:
            # One attempt only: a rejected or failed publish is not retried with other args.
            return self._finish(view, findings, zh, report=art)
        recipients = _recipients(view)
        return _decision(
            f"publish report {art[:19]} to {len(recipients)} recipient(s)",
            ProposedCall(
                tool="publish_report",
                version="1",
                args={
                    "artifact_id": art,
                    "channel": "email",
                    "recipients": recipients,
                    "subject": _title(findings, zh),
                },
            ),
        )

    def _delegate(
        self, view: PlannerView, agent: str, findings: Findings, query: Observation, zh: bool
    ) -> Decision:
        handed = [o for o in view.observations if o.tool == handoff_tool(agent)]
        if not handed:
            title = _title(findings, zh)
            recipients = _recipients(view)
            publish = not _NO_PUBLISH.search(view.input)
            return Decision(
                kind="handoff",
                summary=f"hand the report on {findings.region} to {agent}",
                handoff=Handoff(
                    agent_id=agent,
                    task=f"Write the report '{title}'"
                    + (f" and publish it to {_named(recipients)}" if publish else ""),
                    data={
                        "title": title,
                        "question": view.input,
                        "findings": query.output,
                        "recipients": recipients,
                        "publish": publish,
                    },
                ),
                usage=DecisionUsage(),
            )
        back = handed[-1]
        if back.status != "succeeded":
            return self._finish(view, findings, zh, note=back.error or back.status)
        data = (back.output or {}).get("data") or {}
        return self._finish(
            view,
            findings,
            zh,
            report=data.get("report_artifact_id"),
            note=data.get("note"),
            publish=(str(data.get("publish_status", "not_requested")), data.get("outbox_id")),
        )

    def _query(
        self, view: PlannerView, region: str, queries: list[Observation], zh: bool
    ) -> Decision:
        args: dict[str, Any] = {"region": region, "top_n": TOP_N}
        week = _week_from_input(view.input)
        if week is not None:
            args["week_start"] = week
        if queries:
            last = queries[-1]
            fixes = sum(o.status == Code.TOOL_ARGUMENT_INVALID for o in queries)
            if last.status != Code.TOOL_ARGUMENT_INVALID or fixes > MAX_ARG_FIXES:
                return self._finish(view, None, zh, note=last.error or last.status)
            bad = _bad_fields(queries)
            for field in _QUERY_OPTIONAL if bad is None else bad:
                args.pop(field, None)
        week_label = args.get("week_start", LAST_WEEK_START.isoformat())
        return _decision(
            f"query {region} sales for week {week_label}",
            ProposedCall(tool="query_sales", version="1", args=args),
        )

    def _finish(
        self,
        view: PlannerView,
        findings: Findings | None,
        zh: bool,
        report: str | None = None,
        note: str | None = None,
        publish: tuple[str, Any] | None = None,
    ) -> Decision:
        """``publish``: (status, outbox id) as a report agent handed them back."""
        if findings is None:
            reason = note or "no data"
            answer = (
                f"无法完成销售分析：{reason}"
                if zh
                else f"Could not complete the sales analysis: {reason}"
            )
            return Decision(
                kind="finish",
                summary="finish without findings",
                answer=answer,
                data={"region": parse_region(view), "error": reason},
                usage=DecisionUsage(),
            )
        drivers = [
            d
            for d in findings.top_decliners
            if d.change_pct is not None and d.change_pct <= MATERIAL_DROP_PCT
        ][:MAX_NAMED]
        region = region_label(findings.region, zh)
        named = ("、" if zh else ", ").join(
            f"{d.sku}（{d.name}，{pct(d.change_pct)}）"
            if zh
            else f"{d.sku} ({d.name}, {pct(d.change_pct)})"
            for d in drivers
        )
        total = pct(findings.change_pct)
        if zh:
            answer = f"{findings.week_start} 当周{region}区销售额较前一周变化 {total}。" + (
                f"主要下滑 SKU：{named}。" if drivers else "没有明显下滑的 SKU。"
            )
        else:
            answer = (
                f"In the week of {findings.week_start}, {region} region revenue changed "
                f"{total} vs the prior week. "
                + (
                    f"The main declining SKUs: {named}."
                    if drivers
                    else "No SKU declined materially."
                )
            )
        if publish is None:
            publishes = _of(view, "publish_report")
            published = _succeeded(publishes)
            publish_status = publishes[-1].status if publishes else "not_requested"
            outbox_id = (
                published.output.get("outbox_id")
                if published is not None and isinstance(published.output, dict)
                else None
            )
        else:
            publish_status, outbox_id = publish
        answer += ("" if zh else " ") + publish_sentence(report, publish_status, zh)
        data: dict[str, Any] = {
            "region": findings.region,
            "week_start": findings.week_start,
            "top_skus": [d.sku for d in drivers],
            "change_pct": findings.change_pct,
            **publish_data(report, publish_status, outbox_id, note),
        }
        summary = (
            f"{findings.region} week {findings.week_start}: "
            f"{', '.join(data['top_skus']) or 'no material decline'}"
        )
        return Decision(
            kind="finish", summary=summary, answer=answer, data=data, usage=DecisionUsage()
        )
