"""Plain-text rendering of runs, events and traces for the CLI (no TTY library needed)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from server.client import JSON, TERMINAL, WAITING_HUMAN

UNICODE = {
    "state": "●",
    "action": "▶",
    "ok": "✔",
    "bad": "✘",
    "ask": "?",
    "artifact": "■",
    "other": "·",
    "park": "⏸",
    "arrow": "→",
    "more": "…",
    "dash": "—",
}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
ASCII = {
    "state": "*",
    "action": ">",
    "ok": "+",
    "bad": "x",
    "ask": "?",
    "artifact": "#",
    "other": ".",
    "park": "||",
    "arrow": "->",
    "more": "...",
    "dash": "-",
}


CALL_TAG_CHARS = 6
"""Hex digits of a tool_call_id shown on its events: distinct between a run's calls."""

_BEYOND_C0 = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(rf"[\x00-\x08\x0a-\x1f{_BEYOND_C0}]")
"""What a terminal acts on instead of showing: C0 and C1 controls (escape sequences,
a carriage return or line break that would forge a line; not a tab) and the bidi
controls that reorder what is shown."""
_IN_JSON = re.compile(f"[{_BEYOND_C0}]")
"""The same, less what ``json.dumps`` escapes already (C0)."""


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def printable(text: str) -> str:
    """``text`` with its control characters written as ``\\uXXXX``: what the CLI prints
    comes from other users' runs (inputs, comments, tool output) and from the server,
    and must not drive the reader's terminal."""
    return _CONTROL.sub(_escaped, text)


def printable_json(text: str) -> str:
    """JSON text (``json.dumps``) with the control characters it leaves as they are
    (C1, DEL, bidi: it escapes only C0 unless told ``ensure_ascii``) as ``\\u``
    escapes: the same JSON, safe on a terminal."""
    return _IN_JSON.sub(_escaped, text)


def symbols_for(stream: TextIO) -> dict[str, str]:
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    return UNICODE if encoding in ("utf8", "utf8sig") else ASCII


def tool_ref(item: JSON) -> str:
    """``tool@version`` of a call or an approval (just the tool where none is given)."""
    version = item.get("version")
    return f"{item.get('tool')}@{version}" if version else str(item.get("tool"))


def compact(value: Any) -> str:
    """One line: strings as they are, everything else as compact JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return " ".join(text.split())


@dataclass
class Renderer:
    """Turns API JSON into short lines; ``width`` bounds each event line."""

    sym: dict[str, str]
    width: int = 160
    command: str = "agent-runtime"
    """How to invoke the CLI in printed hints (with ``--url`` if it is not the default)."""

    def clip(self, text: str, width: int | None = None) -> str:
        limit = max(20, width or self.width)
        more = self.sym["more"]  # "..." in ASCII: the clipped line is no longer for it
        return text if len(text) <= limit else text[: limit - len(more)] + more

    # -- events -----------------------------------------------------------------

    def event(self, event: JSON, state: str) -> str:
        seq = event.get("seq")
        head = f"[{seq:>3}] {state:<13} " if isinstance(seq, int) else f"[  ?] {state:<13} "
        return self.clip(head + self.event_text(event))

    def event_text(self, event: JSON) -> str:
        s = self.sym
        kind = str(event.get("type"))
        if event.get("unreadable"):  # its type as stored, and why: it has no data
            return f"{s['bad']} {self.unreadable(event, kind).lstrip()}"
        d: JSON = event.get("data") or {}
        if kind == "state":
            if d.get("from") is None:
                return f"{s['state']} created ({d.get('to')})"
            return f"{s['state']} {d.get('from')} {s['arrow']} {d.get('to')} ({d.get('trigger')})"
        handoff = d.get("handoff")
        if kind in ("action", "result") and isinstance(handoff, dict):
            route = (
                f"handoff {handoff.get('phase')} {handoff.get('from_agent')} "
                f"{s['arrow']} {handoff.get('to_agent')} (depth {handoff.get('depth')})"
            )
            if kind == "result" and d.get("status") != "succeeded":  # failed, cancelled
                return f"{s['bad']} {route} {d.get('status')}{self.error_suffix(d)}"
            what = handoff.get("task") if kind == "action" else d.get("output")
            return f"{s['arrow']} {route}: {compact(what or '')}"
        call = f"{d.get('tool')}{self.call_tag(d)}"
        if kind == "action":
            return f"{s['action']} {call}{self.rerun_note(d)} {compact(d.get('args', ''))}"
        if kind == "result":
            retried = self.retried_note(d.get("retried"))
            if d.get("status") == "succeeded":
                return f"{s['ok']} {call}{retried} {s['arrow']} {compact(d.get('output'))}"
            return f"{s['bad']} {call} {d.get('status')}{retried}{self.error_suffix(d)}"
        if kind == "artifact":
            return (
                f"{s['artifact']} artifact {d.get('name')} ({d.get('media_type')}, "
                f"{d.get('size')} B) {d.get('artifact_id')}"
            )
        if kind == "approval_request":
            return (
                f"{s['ask']} approval {d.get('approval_id')} needed: {d.get('tool')} "
                f"(risk {d.get('risk')}) {s['dash']} {d.get('reason')}"
            )
        if kind == "approval_result":
            decision = str(d.get("decision"))
            mark = s["ok"] if decision == "approved" else s["bad"]
            comment = f": {compact(d['comment'])}" if d.get("comment") else ""
            who = d.get("decided_by")
            return f"{mark} approval {d.get('approval_id')} {decision} by {who}{comment}"
        if kind == "error":
            recovery = f" [{d['recovery']}]" if d.get("recovery") else ""
            return f"{s['bad']} {d.get('code')}: {compact(d.get('message', ''))}{recovery}"
        return f"{s['other']} {kind} {compact(d)}"

    def call_tag(self, data: JSON) -> str:
        """`` tc-3f2a91``: the start of the call's tool_call_id (as ``trace`` lists it),
        so that an action pairs with its result when a step runs one tool twice."""
        call_id = data.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            return ""
        prefix, dash, digest = call_id.partition("-")
        return f" {prefix}{dash}{digest[:CALL_TAG_CHARS]}" if dash else f" {call_id[:12]}"

    def rerun_note(self, data: JSON) -> str:
        """`` (rerun, attempt 2)``: an action run again (its drive stopped, or a human
        said so)."""
        if not data.get("rerun"):
            return ""
        attempt = data.get("attempt")
        return f" (rerun, attempt {compact(attempt)})" if attempt is not None else " (rerun)"

    def retried_note(self, retried: Any) -> str:
        """`` (after 2 earlier attempts: TOOL_UNAVAILABLE)``: the attempts before a
        result's own, which had no outcome of their own; their distinct codes."""
        if not isinstance(retried, list) or not retried:
            return ""
        codes: list[str] = []
        for item in retried:
            code = compact(item.get("code") or "") if isinstance(item, dict) else ""
            if code and code not in codes:
                codes.append(code)
        plural = "s" if len(retried) != 1 else ""
        why = ", ".join(codes[:3]) + (f", {self.sym['more']}" if len(codes) > 3 else "")
        return f" (after {len(retried)} earlier attempt{plural}{': ' if why else ''}{why})"

    def error_suffix(self, data: JSON) -> str:
        return f": {self.error_text(data['error'])}" if data.get("error") else ""

    def error_text(self, error: Any) -> str:
        if isinstance(error, dict):
            return f"{error.get('code')}: {compact(error.get('message', ''))}"
        return compact(error)

    # -- runs -------------------------------------------------------------------

    def awaiting_lines(self, awaiting: JSON | None) -> list[str]:
        if not awaiting:
            return []
        role, tenant = awaiting.get("role"), awaiting.get("tenant_id")
        who = f"  for:     a user with the {role} role in {tenant}"
        if awaiting.get("not_user"):
            who += f", not {awaiting['not_user']}"
        return [who]

    def approve_hint(self, run_id: str, approval_id: str) -> list[str]:
        return [
            f"  approve: {self.command} approve {run_id} {approval_id} --follow",
            f"  reject:  {self.command} reject {run_id} {approval_id} --comment '…'",
        ]

    def ending(self, run: JSON) -> list[str]:
        """What a follow prints when it stops: the outcome, or what the run waits for."""
        s, state, run_id = self.sym, str(run.get("state")), run.get("run_id")
        usage: JSON = run.get("usage") or {}
        if state == "succeeded":
            lines = [
                f"{s['ok']} {run_id} succeeded (steps {usage.get('steps')}, "
                f"tool calls {usage.get('tool_calls')}, active {usage.get('active_s', 0):.2f}s)"
            ]
            return lines + self.result_lines(run)
        if state == "failed":
            return [f"{s['bad']} {run_id} failed: {self.outcome_text(run)}"]
        if state == WAITING_HUMAN:
            pending: JSON | None = run.get("pending_approval")
            if not pending:
                return [f"{s['park']} {run_id} is waiting for a human"]
            return [
                f"{s['park']} {run_id} is waiting for a human: approval "
                f"{pending.get('approval_id')} for {pending.get('tool')} {s['dash']} "
                f"{pending.get('reason')}",
                *self.awaiting_lines(pending.get("awaiting")),
                *self.approve_hint(str(run_id), str(pending.get("approval_id"))),
            ]
        return [f"{s['other']} {run_id} is {state}; follow it with: {self.command} follow {run_id}"]

    def outcome_text(self, run: JSON) -> str:
        outcome: JSON = run.get("outcome") or {}
        # One line: a tool's error text may hold several, one of them like a field.
        why = compact(": ".join(str(outcome[k]) for k in ("code", "message") if outcome.get(k)))
        parts = [why] if why else []
        if outcome.get("side_effects"):
            parts.append(f"side effects that happened: {', '.join(outcome['side_effects'])}")
        if outcome.get("compensations"):
            parts.append(f"compensated: {', '.join(outcome['compensations'])}")
        return "; ".join(parts) or "-"

    def result_lines(self, run: JSON) -> list[str]:
        result: JSON = run.get("result") or {}
        lines = []
        if result.get("answer"):
            # A model's answer runs over lines: each its own, indented, so that none can
            # pass for a line of ours ("state: …") at the left edge.
            first, *rest = str(result["answer"]).splitlines() or [""]
            lines.append(f"answer: {first}")
            lines += [f"        {line}" for line in rest]
        for artifact in result.get("artifacts") or []:
            lines.append(f"artifact: {artifact}")
        return lines

    def run_summary(self, run: JSON) -> list[str]:
        ctx: JSON = run.get("context") or {}
        usage: JSON = run.get("usage") or {}
        limits: JSON = run.get("limits") or {}
        extra = {k: v for k, v in ctx.items() if k not in ("user_id", "tenant_id", "scope")}
        context = (
            f"user {ctx.get('user_id')}, tenant {ctx.get('tenant_id')}, "
            f"scope {','.join(ctx.get('scope') or []) or '-'}"
            + (f", {compact(extra)}" if extra else "")
        )
        times = f"created {run.get('created_at')}, updated {run.get('updated_at')}"
        if run.get("ended_at"):
            times += f", ended {run['ended_at']}"
        key = (run.get("options") or {}).get("idempotency_key")
        lines = [
            f"run:      {run.get('run_id')}",
            f"agent:    {run.get('agent_id')}",
            f"state:    {run.get('state')} (step {run.get('step_index')})",
            f"input:    {self.clip(compact(run.get('input', '')), 400)}",
            f"context:  {context}",
            *([f"idempotency key: {key}"] if key else []),
            f"usage:    steps {usage.get('steps')}/{limits.get('max_steps')}, "
            f"llm calls {usage.get('llm_calls')}/{limits.get('max_llm_calls')}, "
            f"tool calls {usage.get('tool_calls')}/{limits.get('max_tool_calls')}, "
            f"tokens {usage.get('tokens')}, cost ${usage.get('cost_usd', 0):.4f}, "
            f"active {usage.get('active_s', 0):.2f}s",
            f"times:    {times}",
        ]
        state = run.get("state")
        if state in TERMINAL and run.get("outcome"):
            lines.append(f"outcome:  {run['state']} {self.outcome_text(run)}".rstrip())
        if state == "succeeded":
            lines += self.result_lines(run)
        elif state == WAITING_HUMAN:
            lines += self.ending(run)
        return lines

    def runs_table(self, runs: Sequence[JSON]) -> list[str]:
        rows = [("RUN", "STATE", "AGENT", "STEPS", "CREATED", "INPUT")]
        for run in runs:
            created = str(run.get("created_at", ""))[:19].replace("T", " ")
            steps = str((run.get("usage") or {}).get("steps", ""))
            rows.append(
                (
                    str(run.get("run_id")),
                    str(run.get("state")),
                    str(run.get("agent_id")),
                    steps,
                    created,
                    self.clip(compact(run.get("input", "")), 50),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        return [
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5]
            for row in rows
        ]

    def unreadable(self, row: JSON, key: str) -> str:
        """A row the server could not read: its key, its status as stored, and why."""
        status = f" {row['status']}" if "status" in row else ""
        return self.clip(f"  {key}{status} UNREADABLE: {'; '.join(row.get('problems') or [])}")

    def trace(self, trace: JSON) -> list[str]:
        s = self.sym
        run: JSON = trace.get("run") or {}
        lines = self.run_summary(run)
        lines += ["", "steps:"]
        for step in trace.get("steps") or []:
            if step.get("unreadable"):
                lines.append(self.unreadable(step, f"#{step.get('step_index')}"))
                continue
            decision: JSON = step.get("decision") or {}
            calls = ", ".join(tool_ref(c) for c in decision.get("tool_calls") or [])
            what = f"{s['arrow']} {calls}" if calls else f"{s['arrow']} answer"
            if decision.get("handoff"):
                what = f"{s['arrow']} {decision['handoff'].get('agent_id')}"
            who = f"[{decision['agent_id']}] " if decision.get("agent_id") else ""
            lines.append(
                self.clip(
                    f"  #{step.get('step_index')} {who}{decision.get('kind')}: "
                    f"{decision.get('summary')} {what}"
                )
            )
        lines += ["", "tool calls:"]
        for call in trace.get("tool_calls") or []:
            if call.get("unreadable"):
                lines.append(self.unreadable(call, str(call.get("tool_call_id"))))
                continue
            flags = " side-effect" if call.get("side_effect") else ""
            flags += " compensated" if call.get("compensated") else ""
            lines.append(
                f"  {call.get('tool_call_id')} step {call.get('step_index')}."
                f"{call.get('call_index')} {call.get('tool')}@{call.get('version')} "
                f"{call.get('status')} (attempts {call.get('attempts')}){flags}"
            )
            lines.append(self.clip(f"      args {compact(call.get('args'))}"))
            if call.get("error"):
                lines.append(self.clip(f"      error {self.error_text(call['error'])}"))
            elif call.get("output") is not None:
                lines.append(self.clip(f"      output {compact(call['output'])}"))
        lines += ["", "approvals:"]
        for ap in trace.get("approvals") or []:
            if ap.get("unreadable"):
                lines.append(self.unreadable(ap, str(ap.get("approval_id"))))
                continue
            decided = (
                f" by {ap.get('decided_by')} at {ap.get('decided_at')}"
                if ap.get("decided_by")
                else ""
            )
            comment = f": {compact(ap['comment'])}" if ap.get("comment") else ""
            lines.append(
                self.clip(
                    f"  {ap.get('approval_id')} {tool_ref(ap)} "
                    f"(risk {ap.get('risk')}) "
                    f"{ap.get('status')}{decided}{comment}"
                )
            )
        lines += ["", "events:"]
        state = ""
        for event in trace.get("events") or []:
            if event.get("type") == "state" and not event.get("unreadable"):
                state = str((event.get("data") or {}).get("to"))
            lines.append("  " + self.event(event, state))
        return lines


class OutputFailed(Exception):
    """The output could not be written (a full disk, a file closed under us): the
    command's failure, not the run's (a closed pipe is :class:`BrokenPipeError`)."""


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFailed(str(exc)) from exc


class Printer:
    """Lines to stdout; on a TTY, a spinner status line kept at the bottom."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.tty = self.out.isatty()
        self.frames = SPINNER if symbols_for(self.out) is UNICODE else "|/-\\"
        self._lock = threading.Lock()
        self._shown = False
        self._text: str | None = None
        self._since = 0.0
        self._frame = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def width(self) -> int:
        return shutil.get_terminal_size((160, 24)).columns if self.tty else 160

    def _clear(self) -> None:
        if self._shown:
            self.out.write("\r\x1b[K")
            self._shown = False

    def _draw(self) -> None:
        if self._text is None:
            return
        frame = self.frames[self._frame % len(self.frames)]
        text = f"{frame} {printable(self._text)} ({time.monotonic() - self._since:.0f}s)"
        self.out.write("\r" + text[: self.width - 1] + "\x1b[K")
        self.out.flush()
        self._shown = True

    def _spin(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                self._frame += 1
                self._draw()

    def line(self, text: str = "", *, escape: bool = True) -> None:
        """One line (control characters escaped: see :func:`printable`); ``escape``
        False for JSON text that :func:`printable_json` has made safe, whose indent
        spans lines."""
        with self._lock:
            self._clear()
            self._text = None
            _write(self.out, (printable(text) if escape else text) + "\n")

    def lines(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.line(text)

    def status(self, text: str) -> None:
        """What we are waiting for (TTY only); a spinner and the seconds since shown."""
        if not self.tty:
            return
        with self._lock:
            self._text, self._since = text, time.monotonic()
            self._draw()
        if self._thread is None:
            self._thread = threading.Thread(target=self._spin, name="spinner", daemon=True)
            self._thread.start()

    def note(self, text: str, *, escape: bool = True) -> None:
        """A message for the human, on stderr (never mixed into --json output)."""
        with self._lock:
            self._clear()
            _write(self.out, "")
            _write(self.err, (printable(text) if escape else text) + "\n")

    def done(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._text = None
            self._clear()
            _write(self.out, "")
