"""Graphs exported for ``langgraph.json`` (LangGraph Studio / ``langgraph dev``).

Compiled without a checkpointer: the LangGraph server brings its own. Importing
this module generates the demo database under ``AGENT_RUNTIME_DATA_DIR``.

The same builder and nodes as the runtime's; only the services differ. The
server passes no :class:`runtime.context.Context` (it could not build one from
JSON), so the graph declares no context schema and its nodes fall back to
:func:`runtime.context.services`: a run per LangGraph thread in
``$AGENT_RUNTIME_DATA_DIR/studio.db``, where the ledger, events and approvals live.
"""

from __future__ import annotations

import os
from pathlib import Path

from graphs import report_writer as _report_writer
from graphs.retail_analyst import AGENT_ID, build_agent

# Set empty is unset, as for the server's settings.
_data_dir = Path(os.environ.get("AGENT_RUNTIME_DATA_DIR") or ".agent-runtime")
_demo_db = Path(os.environ.get("AGENT_RUNTIME_DEMO_DB_PATH") or _data_dir / "retail.db")

_agent = build_agent(_demo_db)
_builder = _agent.builder
_builder.context_schema = None
retail_analyst = _builder.compile(name=AGENT_ID)

# The sub-agent retail_analyst hands its reports to, on its own (input: a JSON brief).
_writer_builder = _report_writer.build_agent(_agent.tools).builder
_writer_builder.context_schema = None
report_writer = _writer_builder.compile(name=_report_writer.AGENT_ID)
