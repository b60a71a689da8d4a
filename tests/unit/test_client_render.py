"""What the CLI prints of a run: its outcome, its input, a cancel it asked for."""

from __future__ import annotations

import argparse
import io
from typing import Any

from server.cli_client import EXIT_RUNNING, Cli
from server.client_render import ASCII, Printer, Renderer

RENDER = Renderer(ASCII, width=160, command="agent-runtime")


def test_an_outcome_without_a_code_reads_without_a_dash() -> None:
    succeeded = {"state": "succeeded", "outcome": {"side_effects": ["tc-1"], "compensations": []}}
    assert RENDER.outcome_text(succeeded) == "side effects that happened: tc-1"
    failed = {
        "state": "failed",
        "outcome": {
            "code": "RUN_CANCELLED",
            "message": "not needed",
            "side_effects": ["tc-1"],
            "compensations": ["tc-1"],
        },
    }
    assert RENDER.outcome_text(failed) == (
        "RUN_CANCELLED: not needed; side effects that happened: tc-1; compensated: tc-1"
    )
    assert RENDER.outcome_text({"state": "succeeded", "outcome": {}}) == "-"
    # A tool's error text over several lines: one, as it is printed after "outcome:".
    spread = {"state": "failed", "outcome": {"code": "TOOL_FAILED", "message": "a\nstate: ok"}}
    assert RENDER.outcome_text(spread) == "TOOL_FAILED: a state: ok"


def test_input_over_several_lines_is_summarised_on_one() -> None:
    """A line of the input must not pass for one of the summary's fields."""
    run = {"run_id": "run-1", "state": "failed", "input": "first line\nstate:    succeeded"}
    lines = RENDER.run_summary(run)
    assert [line for line in lines if line.startswith("state:")] == ["state:    failed (step None)"]
    assert "input:    first line state: succeeded" in lines
    long = RENDER.run_summary({**run, "input": "x" * 20_000})
    assert max(len(line) for line in long) < 500


class AcceptingClient:
    """The server's answer to a cancel it accepted for a run no worker has reached (202)."""

    def cancel(self, run_id: str, reason: str | None, compensate: bool) -> dict[str, Any]:
        return {"run_id": run_id, "state": "pending"}


def test_a_cancel_accepted_for_later_says_so() -> None:
    args = argparse.Namespace(
        json=False, url="http://127.0.0.1:9", token="t", command="cancel", run="run-1"
    )
    args.reason, args.compensate = None, False
    cli = Cli(args)
    out = io.StringIO()
    cli.printer = Printer(out=out, err=io.StringIO())
    cli.client = AcceptingClient()  # type: ignore[assignment]

    assert cli.cancel() == EXIT_RUNNING
    accepted, ending = out.getvalue().splitlines()
    assert accepted == "cancel of run-1 accepted; it ends when a worker acts on it"
    assert "run-1 is pending; follow it with" in ending
