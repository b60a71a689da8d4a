"""The sales-decline report: query_sales findings rendered as Markdown.

Rendering is a pure function of its input (no clock, no locale), so the same
findings always give the same bytes and therefore the same artifact id.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from tools.retail.data import REGIONS

CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def has_cjk(text: str) -> bool:
    return CJK.search(text) is not None


class Decliner(BaseModel):
    model_config = ConfigDict(extra="ignore")
    sku: str
    name: str = ""
    last: float
    prior: float
    delta: float
    change_pct: float | None = None


class Findings(BaseModel):
    """The part of query_sales output a report needs; extra keys are tolerated."""

    model_config = ConfigDict(extra="ignore")
    region: str
    week_start: str
    prior_week_start: str = ""
    total_last: float = 0.0
    total_prior: float = 0.0
    change_pct: float | None = None
    top_decliners: list[Decliner]


_LABELS = {
    "en": {
        "region": "Region",
        "week": "Week",
        "vs": "vs prior week",
        "total": "Total revenue",
        "decliners": "Top decliners",
        "none": "No SKU declined in this week.",
        "cols": ("#", "SKU", "Name", "Last week", "Prior week", "Change", "Change %"),
    },
    "zh": {
        "region": "区域",
        "week": "周",
        "vs": "对比前一周",
        "total": "总销售额",
        "decliners": "下滑最多的 SKU",
        "none": "本周没有 SKU 销售下滑。",
        "cols": ("#", "SKU", "名称", "上周", "前一周", "变化", "变化率"),
    },
}


def region_label(region_id: str, zh: bool) -> str:
    for region in REGIONS:
        if region.region_id == region_id:
            return region.name_zh if zh else region.name
    return region_id


def money(value: float) -> str:
    return f"{value:,.2f}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def _cell(text: str) -> str:
    # Input reaches the table verbatim; a pipe or newline would break its layout.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def render(title: str, question: str, findings: Findings) -> str:
    zh = has_cjk(title) or has_cjk(question)
    labels = _LABELS["zh" if zh else "en"]
    region = region_label(findings.region, zh)
    sep = "：" if zh else ": "
    lines = [f"# {_cell(title)}", ""]
    lines += [f"> {line}" if line else ">" for line in question.strip().splitlines()] + [""]
    lines += [
        f"- {labels['region']}{sep}{region} ({findings.region})",
        f"- {labels['week']}{sep}{findings.week_start} "
        f"({labels['vs']} {findings.prior_week_start})",
        f"- {labels['total']}{sep}{money(findings.total_last)} / "
        f"{money(findings.total_prior)} ({pct(findings.change_pct)})",
        "",
        f"## {labels['decliners']}",
        "",
    ]
    cols = labels["cols"]
    if not findings.top_decliners:
        lines.append(str(labels["none"]))
    else:
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|---|---|---|---:|---:|---:|---:|")
        for rank, d in enumerate(findings.top_decliners, start=1):
            lines.append(
                f"| {rank} | {_cell(d.sku)} | {_cell(d.name)} | {money(d.last)} | "
                f"{money(d.prior)} | {money(d.delta)} | {pct(d.change_pct)} |"
            )
    return "\n".join(lines) + "\n"
