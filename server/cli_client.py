"""The client commands of ``agent-runtime``: run, follow, approve, reject, cancel, runs,
show, trace, against a running server. ``server.cli`` parses the arguments."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from server.client import TERMINAL, WAITING_HUMAN

if TYPE_CHECKING:
    from server.client import JSON, Client
    from server.client_render import Printer, Renderer

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "AGENT_RUNTIME_URL"
TOKEN_ENV = "AGENT_RUNTIME_TOKEN"

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_ERROR, EXIT_WAITING, EXIT_RUNNING = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141
"""The reader of the output went away (``| head``): the command could not say what it
had to, whatever the run's state; 128 + SIGPIPE, as a Unix tool killed by it exits."""


class EmptyToken(ValueError):
    """``--token ""``: a token given as nothing, refused rather than read as none."""


def resolve_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$AGENT_RUNTIME_TOKEN``, else the embedded default's local key:
    the approver's for approve/reject (the run's own user may not approve it), else the
    admin's."""
    given = getattr(args, "token", None)
    if given is not None:
        if not given:
            # ``--token "$TOKEN"`` with $TOKEN unset must not act as the local admin.
            raise EmptyToken("--token is empty")
        return str(given)
    token = os.environ.get(TOKEN_ENV)  # set but empty: as if unset, as every setting
    if token:
        return str(token)
    from server.auth.bootstrap import read_local_keys
    from server.settings import Settings

    local = read_local_keys(Settings().data_dir)
    name = "approver" if args.command in ("approve", "reject") else "admin"
    return local.get(name)


def as_json(value: Any, **kwargs: Any) -> str:
    """JSON for ``--json``: as is on a UTF-8 stream; on any other, non-ASCII characters
    as ``\\u`` escapes (the same JSON), never replaced with "?"."""
    from server.client_render import printable_json

    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return printable_json(json.dumps(value, ensure_ascii=encoding != "utf8", **kwargs))


def exit_code(state: str) -> int:
    if state == "succeeded":
        return EXIT_SUCCEEDED
    if state == "failed":
        return EXIT_FAILED
    if state == "waiting_human":
        return EXIT_WAITING
    return EXIT_RUNNING


class Cli:
    """One client command's context: the server, the output mode, the renderer."""

    def __init__(self, args: argparse.Namespace) -> None:
        from server.client import Client
        from server.client_render import Printer, Renderer, symbols_for

        self.args = args
        self.json: bool = args.json
        self.url: str = args.url or os.environ.get(URL_ENV) or DEFAULT_URL
        self.client: Client = Client(self.url, token=resolve_token(args))
        self.printer: Printer = Printer()
        self.following: str | None = None
        """The run whose events are being shown, if any."""
        command = "agent-runtime"
        if self.url.rstrip("/") != (os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/"):
            command += f" --url {self.url}"
        self.render: Renderer = Renderer(
            symbols_for(self.printer.out), width=self.printer.width, command=command
        )

    def dump(self, value: Any) -> None:
        self.printer.line(as_json(value, indent=2), escape=False)

    def follow(self, run_id: str, *, after: int = 0, anchor: str | None = None) -> JSON:
        """Show events until the run ends or parks; returns the run as it is then.

        Events up to seq ``after`` are read (for the state column) but not shown; with
        ``anchor`` (an approval id) neither are those before that approval's result,
        so ``approve --follow`` picks up where the decision lands.
        """
        self.following = run_id
        state = ""
        shown = anchor is None
        last_request: str | None = None

        def dropped(last: int, why: str) -> None:
            self.printer.note(
                f"agent-runtime: event stream dropped ({why}); reconnecting after event {last}"
            )

        # Always read from the start, so every line shows the state the run was in.
        for event in self.client.events(run_id, 0, on_reconnect=dropped):
            kind, data = event.get("type"), event.get("data") or {}
            if event.get("unreadable"):
                kind = None  # only its stored type is known: no state or approval from it
            if kind == "state":
                state = str(data.get("to"))
            if not shown:
                shown = kind == "approval_result" and data.get("approval_id") == anchor
                if not shown:
                    continue
            if kind == "approval_request":
                last_request = data.get("approval_id")
            # Not shown, but still where the run may be parked now: a run parked at
            # or before ``after`` sends nothing more, and following it would never end.
            hidden = int(event.get("seq") or 0) <= after
            if not hidden:
                self.printer.line(as_json(event) if self.json else self.render.event(event, state))
            if kind == "state" and self._stops_at(run_id, state, last_request):
                break
            if not self.json and not hidden:
                self.printer.status(f"{state}, waiting for the next event")
        self.printer.done()
        self.following = None  # seen to its end or its park
        return self.client.get_run(run_id)

    def _stops_at(self, run_id: str, state: str, last_request: str | None) -> bool:
        """Whether following ends at this state: terminal, or parked (now, not in the past)."""
        if state in TERMINAL:
            return True
        if state != WAITING_HUMAN:
            return False
        run = self.client.get_run(run_id)
        pending = (run.get("pending_approval") or {}).get("approval_id")
        # Replayed history parks too; stop only where the run is parked now.
        return run["state"] == WAITING_HUMAN and (
            last_request is None or pending in (None, last_request)
        )

    def ending(self, run: JSON) -> int:
        if not self.json:
            self.printer.lines(self.render.ending(run))
        return exit_code(str(run["state"]))

    # -- commands -------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        text = args.input
        if text == "-":
            try:  # strictly: undecodable bytes came through as surrogates no request carries
                text = sys.stdin.buffer.read().decode("utf-8-sig").rstrip("\n")
            except UnicodeDecodeError as exc:
                self.printer.note(f"agent-runtime: the input on stdin is not UTF-8 text: {exc}")
                return EXIT_ERROR
        context: JSON = {}
        if args.context_json:
            context = dict(args.context_json)
        if args.scope:
            given = context.get("scope")
            # A scope in --context-json that is not a list is the server's to refuse,
            # not ours to spread into its characters.
            if given is None or isinstance(given, list):
                context["scope"] = [*(given or []), *args.scope]
        options: JSON = {}
        if args.max_steps is not None:
            options["max_steps"] = args.max_steps
        body: JSON = {"input": text}
        if args.agent:
            body["agent_id"] = args.agent
        if context:
            body["context"] = context
        if options:
            body["options"] = options
        run, created = self.client.create_run(body, args.idempotency_key)
        run_id = str(run["run_id"])
        if not args.follow:
            if self.json:
                self.dump(run)
            else:
                verb = "created" if created else "found (same idempotency key)"
                self.printer.line(f"{verb} {run_id}")
                self.printer.lines(self.render.run_summary(run))
                if str(run["state"]) not in TERMINAL | {WAITING_HUMAN}:
                    self.printer.line(f"follow:   {self.render.command} follow {run_id}")
            return EXIT_SUCCEEDED
        if not self.json:
            verb = "created" if created else "found (same idempotency key)"
            self.printer.line(f"{verb} {run_id} (agent {run['agent_id']})")
        return self.ending(self.follow(run_id))

    def follow_cmd(self) -> int:
        return self.ending(self.follow(self.args.run, after=self.args.after))

    def decide(self) -> int:
        args = self.args
        decision = "approve" if args.command == "approve" else "reject"
        approval, now = self.client.decide(
            args.run, args.approval, decision, comment=args.comment, decided_by=args.by
        )
        if args.follow:
            if not self.json:
                self.printer.line(self.decision_text(approval, now))
            return self.ending(self.follow(args.run, anchor=args.approval))
        run = self.settle(args.run, args.approval, args.wait)
        if self.json:
            self.dump(approval)
            return exit_code(str(run["state"]))
        self.printer.line(self.decision_text(approval, now))
        return self.ending(run)

    def decision_text(self, approval: JSON, now: bool) -> str:
        from server.client_render import tool_ref

        comment = f": {approval['comment']}" if approval.get("comment") else ""
        return (
            f"{'' if now else 'already '}{approval.get('status')} {approval.get('approval_id')} "
            f"({tool_ref(approval)}) by {approval.get('decided_by')}{comment}"
        )

    def settle(self, run_id: str, approval_id: str, wait_s: float) -> JSON:
        """The run once it has carried the decision to its end or to another approval
        (or after ``wait_s``): an approval goes on to the run's outcome, and a report of
        "executing" a moment before it would send a script to poll for it."""
        deadline = time.monotonic() + wait_s
        while True:
            run = self.client.get_run(run_id)
            pending = (run.get("pending_approval") or {}).get("approval_id")
            parked_again = run["state"] == WAITING_HUMAN and pending != approval_id
            if run["state"] in TERMINAL or parked_again:
                return run
            if time.monotonic() >= deadline:
                return run
            time.sleep(0.1)

    def cancel(self) -> int:
        run = self.client.cancel(self.args.run, self.args.reason, self.args.compensate)
        if self.json:
            self.dump(run)
            return exit_code(str(run["state"]))
        if run["state"] not in TERMINAL:
            # Accepted (202): it ends once a worker carries it out; say so, not only
            # that the run is still where it was.
            accepted = f"cancel of {run['run_id']} accepted; it ends when a worker acts on it"
            self.printer.line(accepted)
        return self.ending(run)

    def runs(self) -> int:
        args = self.args
        items: list[JSON] = []
        cursor: str | None = None
        page: JSON = {}
        while len(items) < args.limit:
            page = self.client.list_runs(
                state=sorted(set(args.state)) if args.state else None,  # each state once
                agent_id=args.agent,
                limit=min(200, args.limit - len(items)),
                cursor=cursor,
            )
            items += page.get("items") or []
            cursor = page.get("next_cursor")
            if not cursor:
                break
        if self.json:
            self.dump({**page, "items": items, "next_cursor": cursor})
        elif items:
            self.printer.lines(self.render.runs_table(items))
        else:
            self.printer.line("no runs")
        return EXIT_SUCCEEDED

    def show(self) -> int:
        run = self.client.get_run(self.args.run)
        if self.json:
            self.dump(run)
        else:
            self.printer.lines(self.render.run_summary(run))
        return exit_code(str(run["state"]))

    def trace(self) -> int:
        trace = self.client.trace(self.args.run)
        if self.json:
            self.dump(trace)
        else:
            self.printer.lines(self.render.trace(trace))
        return exit_code(str(trace["run"]["state"]))


COMMANDS: dict[str, Callable[[Cli], int]] = {
    "run": Cli.run,
    "follow": Cli.follow_cmd,
    "approve": Cli.decide,
    "reject": Cli.decide,
    "cancel": Cli.cancel,
    "runs": Cli.runs,
    "show": Cli.show,
    "trace": Cli.trace,
}


def client_command(args: argparse.Namespace) -> int:
    import httpx

    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="replace")
    try:
        cli = Cli(args)
    except httpx.InvalidURL as exc:
        print(f"agent-runtime: --url is not a usable URL: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (UnicodeEncodeError, httpx.LocalProtocolError) as exc:  # one line of ASCII
        print(f"agent-runtime: the token cannot be sent: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except EmptyToken as exc:
        print(f"agent-runtime: {exc}", file=sys.stderr)
        return EXIT_ERROR
    from server.client_render import OutputFailed

    try:
        return _answered(cli, args)
    except BrokenPipeError:
        # The reader of the output, or of the errors (e.g. `| head`), went away, maybe as
        # an error was being said: nothing more to say, and nothing at exit either.
        _silenced(sys.stdout, sys.stderr)
        return EXIT_PIPE_CLOSED
    except OutputFailed as exc:
        # A full disk, say: not the run's failure (exit 1 would say it failed). What
        # could not be written must not fail again at exit, as a traceback.
        _silenced(sys.stdout)
        with contextlib.suppress(OSError):
            print(f"agent-runtime: the output could not be written: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _silenced(*streams: TextIO) -> None:
    """``streams`` pointed at /dev/null, their buffers with them."""
    for stream in streams:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _answered(cli: Cli, args: argparse.Namespace) -> int:
    """The command's exit code, its errors said (a closed pipe is the caller's)."""
    import httpx

    from server.client import ApiError

    try:
        with cli.client:
            return COMMANDS[args.command](cli)
    except ApiError as exc:
        if cli.json:
            cli.printer.note(as_json(exc.problem), escape=False)
        else:
            status = f" (HTTP {exc.status})" if exc.status else ""
            cli.printer.note(f"agent-runtime: error {exc.code}{status}: {exc.detail}")
        return EXIT_ERROR
    except httpx.UnsupportedProtocol as exc:
        cli.printer.note(f"agent-runtime: --url is not a usable URL: {exc}")
        return EXIT_ERROR
    except (UnicodeEncodeError, httpx.LocalProtocolError) as exc:
        # An argument, or the token, that no request can carry: text that is not valid
        # Unicode (undecodable bytes in argv), a header that is not one line of ASCII.
        cli.printer.note(f"agent-runtime: an argument or the token cannot be sent: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        followed = cli.following
        # What stopped is the following: the run goes on, without us.
        goes_on = f"; {followed} goes on: {cli.render.command} follow {followed}"
        cli.printer.note("agent-runtime: interrupted" + (goes_on if followed else ""))
        return EXIT_INTERRUPTED
    finally:
        cli.printer.done()
