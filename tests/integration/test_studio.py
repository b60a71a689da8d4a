"""``langgraph dev`` (LangGraph Studio's local server) serves the graphs of langgraph.json.

The retail_analyst graph runs to its approval interrupt, shows the approval, and
resumes with ``Command(resume=...)``: approve → an answer naming SKUs; reject →
APPROVAL_REJECTED. Side effects are still ledgered, in ``$AGENT_RUNTIME_DATA_DIR/studio.db``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from runtime.store.sqlite import SqliteRunStore
from tests.integration.server_proc import LanggraphDev

QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"
INPUT: dict[str, Any] = {"input": QUESTION, "context": {"scope": ["sales_region:east"]}}
GRAPH = "retail_analyst"


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanggraphDev]:
    server = LanggraphDev(tmp_path_factory.mktemp("studio"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def client(dev_server: LanggraphDev) -> AsyncIterator[LangGraphClient]:
    lg = get_client(url=dev_server.url)
    try:
        yield lg
    finally:
        await lg.http.client.aclose()


ANSI = re.compile(r"\x1b\[[0-9;]*m")
BAD = re.compile(r"\b(warning|error|critical|exception|traceback)\b", re.IGNORECASE)


def problems(log: str) -> list[str]:
    """Log lines at WARNING or above, and tracebacks."""
    lines = [ANSI.sub("", line) for line in log.splitlines()]
    return [line for line in lines if BAD.search(line)]


async def run_to_interrupt(client: LangGraphClient) -> tuple[str, dict[str, Any]]:
    thread = await client.threads.create()
    thread_id = thread["thread_id"]
    await client.runs.wait(thread_id, GRAPH, input=INPUT, raise_error=True)
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["approval"], state
    interrupts = [i for task in state["tasks"] for i in task["interrupts"]]
    assert len(interrupts) == 1, interrupts
    return thread_id, interrupts[0]["value"]


async def test_graphs_load_without_errors_or_warnings(
    dev_server: LanggraphDev, client: LangGraphClient
) -> None:
    assistants = await client.assistants.search(graph_id=GRAPH)
    assert [a["graph_id"] for a in assistants] == [GRAPH]
    graph = await client.assistants.get_graph(assistants[0]["assistant_id"])
    assert {"planner", "guard", "approval", "executor", "finish", "handoff", "handback"} <= {
        n["id"] for n in graph["nodes"]
    }
    writer = await client.assistants.search(graph_id="report_writer")
    assert [a["graph_id"] for a in writer] == ["report_writer"]
    schemas = await client.assistants.get_schemas(assistants[0]["assistant_id"])
    assert schemas["context_schema"] is None  # the engine's services are not JSON
    assert problems(dev_server.log_text()) == []
    input_schema, output_schema = schemas["input_schema"], schemas["output_schema"]
    assert input_schema is not None and output_schema is not None, schemas
    assert {"input", "context"} <= set(input_schema["properties"])
    assert output_schema["properties"]["result"]


async def test_approve_resumes_to_an_answer(
    dev_server: LanggraphDev, client: LangGraphClient
) -> None:
    thread_id, request = await run_to_interrupt(client)
    assert request["tool"] == "publish_report"
    assert request["risk"] == "high"
    assert request["reason"]
    assert request["args"]["recipients"]
    assert request["approval_id"].startswith("ap-")
    assert request["run_id"] == thread_id

    result = await client.runs.wait(
        thread_id,
        GRAPH,
        command={"resume": {"decision": "approve", "comment": "ok"}},
        raise_error=True,
    )
    assert isinstance(result, dict)
    assert result["outcome"]["status"] == "succeeded", result["outcome"]
    assert re.search(r"SKU-\d+", result["result"]["answer"]), result["result"]
    assert result["result"]["artifacts"]
    state = await client.threads.get_state(thread_id)
    assert state["next"] == []

    # The side effects went through the ledger, and the approval was decided there.
    store = await SqliteRunStore.open(dev_server.data_dir / "studio.db")
    try:
        approval = await store.get_approval(request["approval_id"])
        assert approval is not None and approval.status == "approved"
        assert approval.comment == "ok"
        calls = await store.list_tool_calls(thread_id)
        assert [c.tool for c in calls] == ["query_sales", "write_report", "publish_report"]
        assert all(c.status == "succeeded" for c in calls)
        # The report tools ran in report_writer, which the analyst handed off to.
        steps = await store.list_steps(thread_id)
        assert [s.decision.agent_id for s in steps if s.decision.tool_calls] == [
            "retail_analyst",
            "report_writer",
            "report_writer",
        ]
    finally:
        await store.close()
    assert problems(dev_server.log_text()) == []


async def test_reject_ends_with_approval_rejected(
    dev_server: LanggraphDev, client: LangGraphClient
) -> None:
    thread_id, request = await run_to_interrupt(client)
    await client.runs.wait(
        thread_id,
        GRAPH,
        command={"resume": {"decision": "reject", "comment": "not this week"}},
        raise_error=True,
    )
    state = await client.threads.get_state(thread_id)
    assert state["next"] == []
    values = state["values"]
    assert isinstance(values, dict), values
    outcome = values["outcome"]
    assert outcome["status"] == "failed"
    assert outcome["code"] == "APPROVAL_REJECTED"
    assert "not this week" in outcome["message"]
    assert not values.get("result")

    store = await SqliteRunStore.open(dev_server.data_dir / "studio.db")
    try:
        approval = await store.get_approval(request["approval_id"])
        assert approval is not None and approval.status == "rejected"
        calls = await store.list_tool_calls(thread_id)
        assert "publish_report" not in [c.tool for c in calls]
    finally:
        await store.close()
    assert problems(dev_server.log_text()) == []
