"""Graphs exported for ``langgraph.json`` (LangGraph Studio / ``langgraph dev``).

Compiled without a checkpointer: the LangGraph server brings its own. Importing
this module generates the demo database under ``AGENT_RUNTIME_DATA_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

from graphs.retail_analyst import AGENT_ID, build_agent

_data_dir = Path(os.environ.get("AGENT_RUNTIME_DATA_DIR", ".agent-runtime"))
_demo_db = Path(os.environ.get("AGENT_RUNTIME_DEMO_DB_PATH", _data_dir / "retail.db"))

retail_analyst = build_agent(_demo_db).builder.compile(name=AGENT_ID)
