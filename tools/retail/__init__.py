"""The retail_analyst demo domain: sales data, its tools and a deterministic planner."""

from tools.retail.data import LAST_WEEK_START, generate
from tools.retail.planner import RetailPlanner
from tools.retail.tools import build_registry, count_outbox, outbox_rows

__all__ = [
    "LAST_WEEK_START",
    "RetailPlanner",
    "build_registry",
    "count_outbox",
    "generate",
    "outbox_rows",
]
