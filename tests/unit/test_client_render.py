"""What the CLI prints of a run: its outcome, its input, a cancel it asked for."""

from __future__ import annotations

import argparse
import io
from typing import Any

from runtime.ids import tool_call_id
from server.cli_client import EXIT_RUNNING, Cli
from server.client_render import ASCII, UNICODE, Printer, Renderer

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


def event_line(type_: str, data: dict[str, Any]) -> str:
    return RENDER.event_text({"type": type_, "data": data})


HANDOFF_RETURN = {
    "phase": "return",
    "from_agent": "psub",
    "to_agent": "probe",
    "step_index": 1,
    "depth": 1,
    "artifacts": [],
}


def test_a_handoff_that_did_not_return_an_answer_says_how_it_ended() -> None:
    """A failed or cancelled handback read like a normal return, its status and error
    left out."""
    failed = {
        "tool_call_id": "ho-0123456789abcdef",
        "tool": "handoff_to_psub",
        "status": "failed",
        "output": None,
        "error": {"code": "TOOL_FAILED", "message": "boom\nat line 2"},
        "handoff": HANDOFF_RETURN,
    }
    assert event_line("result", failed) == (
        "x handoff return psub -> probe (depth 1) failed: TOOL_FAILED: boom at line 2"
    )
    cancelled = {**failed, "status": "cancelled", "error": None}
    assert event_line("result", cancelled) == "x handoff return psub -> probe (depth 1) cancelled"
    returned = {**failed, "status": "succeeded", "output": "the report", "error": None}
    assert event_line("result", returned) == (
        "-> handoff return psub -> probe (depth 1): the report"
    )
    unicode = Renderer(UNICODE).event_text({"type": "result", "data": failed})
    assert unicode.startswith("✘ handoff return psub → probe (depth 1) failed: TOOL_FAILED")


def test_an_action_run_again_says_so() -> None:
    first = {"tool_call_id": "tc-3f2a91c0ffee0000", "tool": "slowi", "args": '{"s": 1}'}
    assert event_line("action", first) == '> slowi tc-3f2a91 {"s": 1}'
    after_a_stop = {**first, "rerun": True, "attempt": 2}
    assert event_line("action", after_a_stop) == '> slowi tc-3f2a91 (rerun, attempt 2) {"s": 1}'
    told_to = {**first, "rerun": True}  # a human's "run it again": no attempt given
    assert event_line("action", told_to) == '> slowi tc-3f2a91 (rerun) {"s": 1}'


def test_a_result_after_failed_attempts_says_why_they_failed() -> None:
    retried = [
        {"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "down"},
        {"attempt": 2, "code": "TOOL_UNAVAILABLE", "message": "still down"},
    ]
    ok = {
        "tool_call_id": "tc-aaaaaa0000000000",
        "tool": "flip",
        "status": "succeeded",
        "output": '{"side": "heads"}',
        "error": None,
        "retried": retried,
    }
    assert event_line("result", ok) == (
        '+ flip tc-aaaaaa (after 2 earlier attempts: TOOL_UNAVAILABLE) -> {"side": "heads"}'
    )
    stopped = {"attempt": 3, "code": "TOOL_OUTCOME_UNKNOWN", "message": "its drive stopped"}
    failed = {
        **ok,
        "status": "failed",
        "output": None,
        "error": {"code": "TOOL_UNAVAILABLE", "message": "down"},
        "retried": [*retried, stopped],
    }
    assert event_line("result", failed) == (
        "x flip tc-aaaaaa failed (after 3 earlier attempts: TOOL_UNAVAILABLE, "
        "TOOL_OUTCOME_UNKNOWN): TOOL_UNAVAILABLE: down"
    )
    one = event_line("result", {**ok, "retried": retried[:1]})
    assert "(after 1 earlier attempt: TOOL_UNAVAILABLE) ->" in one
    # Bounded, and before the output: a long output clipped to the width keeps it.
    many = [{"attempt": i, "code": f"CODE_{i}", "message": "x" * 500} for i in range(50)]
    long = RENDER.event(
        {"seq": 9, "type": "result", "data": {**ok, "retried": many, "output": "y" * 900}},
        "executing",
    )
    assert len(long) <= 160
    assert "(after 50 earlier attempts: CODE_0, CODE_1, CODE_2, ...) -> yyy" in long


def test_two_calls_of_one_tool_in_a_step_pair_with_their_results() -> None:
    """[ok, boom, ok]: two identical `> ok` lines could not be told apart."""
    calls = [tool_call_id("run-1", 2, i) for i in range(3)]
    actions = [
        event_line("action", {"tool_call_id": c, "tool": t, "args": "{}"})
        for c, t in zip(calls, ("ok", "boom", "ok"), strict=True)
    ]
    assert len(set(actions)) == 3
    results = [
        event_line(
            "result", {"tool_call_id": c, "tool": "ok", "status": "succeeded", "output": "1"}
        )
        for c in (calls[2], calls[0])  # in the order they finished
    ]
    for action, result in zip((actions[2], actions[0]), results, strict=True):
        tag = action.split()[2]
        assert tag.startswith("tc-") and len(tag) == 9 and calls[0] != calls[2]
        assert result.split()[:3] == ["+", "ok", tag]
    # The tag is the start of the id `trace` lists; it differs between a run's calls.
    every = {tool_call_id("run-1", step, i)[:9] for step in range(200) for i in range(4)}
    assert len(every) == 800


class InterruptedStream:
    """A stream of events that the user stops with Ctrl-C after the first."""

    def events(self, run_id: str, after: int, on_reconnect: Any = None) -> Any:
        yield {"seq": 1, "type": "state", "data": {"from": None, "to": "pending"}}
        raise KeyboardInterrupt

    def __enter__(self) -> InterruptedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_follow_interrupted_says_the_run_goes_on() -> None:
    from server.cli_client import EXIT_INTERRUPTED, _answered

    args = argparse.Namespace(
        json=False, url="http://127.0.0.1:9", token="t", command="follow", run="run-1", after=0
    )
    cli = Cli(args)
    err = io.StringIO()
    cli.printer = Printer(out=io.StringIO(), err=err)
    cli.client = InterruptedStream()  # type: ignore[assignment]

    assert _answered(cli, args) == EXIT_INTERRUPTED
    assert err.getvalue().strip() == (
        "agent-runtime: interrupted; run-1 goes on: "
        "agent-runtime --url http://127.0.0.1:9 follow run-1"
    )


def test_an_answer_over_several_lines_is_printed_on_several_indented() -> None:
    """Not as escapes on one line; and no line of it at the left edge, where it could
    pass for one of the summary's fields."""
    out = io.StringIO()
    printer = Printer(out=out, err=io.StringIO())
    run = {"result": {"answer": "Sales fell.\n\nstate:    succeeded\n\t- north\x1b[2J"}}

    printer.lines(RENDER.result_lines(run))

    assert out.getvalue().splitlines() == [
        "answer: Sales fell.",
        "        ",
        "        state:    succeeded",
        "        \t- north\\u001b[2J",
    ]
