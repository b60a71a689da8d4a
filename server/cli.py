"""The ``agent-runtime`` command.

Server side: ``serve`` (HTTP, with a worker unless --no-worker) and ``worker`` (no
HTTP). Any number of each may share one PostgreSQL database.

Client side, against a running server (``--url``, default ``$AGENT_RUNTIME_URL`` or
http://127.0.0.1:8000):

    agent-runtime run "<input>" [--agent A] [--context-json '{…}'] [--scope S]…
                      [--idempotency-key K] [--max-steps N] [--follow] [--json]
    agent-runtime follow RUN [--after SEQ]
    agent-runtime approve RUN APPROVAL [--comment C] [--by U] [--follow | --wait SECONDS]
    agent-runtime reject RUN APPROVAL [--comment C] [--by U] [--follow | --wait SECONDS]
    agent-runtime cancel RUN [--reason R] [--compensate]
    agent-runtime runs [--state S] [--agent A] [--limit N]
    agent-runtime show RUN
    agent-runtime trace RUN

``--follow`` shows the run's events live (one line each) from its SSE stream,
reconnecting with Last-Event-ID if the connection drops, and stops when the run
ends or parks in waiting_human (printing how to approve). ``--json`` prints the
API's JSON instead; with ``--follow``, one JSON event per line. Without --follow,
``approve``/``reject`` wait (up to --wait, default 10 s) for the run to act on the
decision, then report its state. ``--url`` and ``--json`` may also precede the command.

Exit codes (the run's state when the command ends):

    0  succeeded (and: ``run`` without --follow created the run; ``runs`` listed)
    1  failed (e.g. rejected, cancelled, or errored)
    2  usage or HTTP error (the problem+json ``code`` and detail go to stderr)
    3  waiting_human: parked for an approval
    4  still running (pending, planning or executing; not followed to its end)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from server.client import TERMINAL, WAITING_HUMAN

if TYPE_CHECKING:
    from server.client import JSON, Client
    from server.client_render import Printer, Renderer
    from server.settings import Settings

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "AGENT_RUNTIME_URL"

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_ERROR, EXIT_WAITING, EXIT_RUNNING = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
EXIT_CODES = """\
exit codes (the run's state when the command ends):
  0  succeeded (run without --follow: created; runs: listed)
  1  failed (rejected, cancelled, errored)
  2  usage or HTTP error (problem+json code and detail on stderr)
  3  waiting_human: parked for an approval
  4  still running (pending, planning, executing)
130  interrupted (Ctrl-C)"""


# -- serve and worker ----------------------------------------------------------------


def _logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def _run_worker(settings: Settings) -> None:
    from server.host import open_host

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with open_host(settings, run_worker=True) as host:
        logging.getLogger(__name__).info("worker %s started", host.engine.owner)
        await stop.wait()


def _server_command(args: argparse.Namespace) -> int:
    import uvicorn

    from server.settings import Settings

    settings = Settings()
    _logging(settings)
    if args.command == "serve":
        from server.app import create_app

        app = create_app(settings, run_worker=not args.no_worker)
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        )
    elif args.command == "worker":
        if args.concurrency is not None:
            settings.worker_concurrency = args.concurrency
        asyncio.run(_run_worker(settings))
    return 0


# -- the client ----------------------------------------------------------------------


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
        self.client: Client = Client(self.url)
        self.printer: Printer = Printer()
        command = "agent-runtime"
        if self.url.rstrip("/") != (os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/"):
            command += f" --url {self.url}"
        self.render: Renderer = Renderer(
            symbols_for(self.printer.out), width=self.printer.width, command=command
        )

    def dump(self, value: Any) -> None:
        self.printer.line(json.dumps(value, ensure_ascii=False, indent=2))

    def follow(self, run_id: str, *, after: int = 0, anchor: str | None = None) -> JSON:
        """Show events until the run ends or parks; returns the run as it is then.

        Events up to seq ``after`` are read (for the state column) but not shown; with
        ``anchor`` (an approval id) neither are those before that approval's result,
        so ``approve --follow`` picks up where the decision lands.
        """
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
            if kind == "state":
                state = str(data.get("to"))
            if not shown:
                shown = kind == "approval_result" and data.get("approval_id") == anchor
                if not shown:
                    continue
            if int(event.get("seq") or 0) <= after:
                continue
            if kind == "approval_request":
                last_request = data.get("approval_id")
            if self.json:
                self.printer.line(json.dumps(event, ensure_ascii=False))
            else:
                self.printer.line(self.render.event(event, state))
            if kind == "state" and self._stops_at(run_id, state, last_request):
                break
            if not self.json:
                self.printer.status(f"{state}, waiting for the next event")
        self.printer.done()
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
        text = sys.stdin.read().rstrip("\n") if args.input == "-" else args.input
        context: JSON = {}
        if args.context_json:
            context = dict(args.context_json)
        if args.scope:
            context["scope"] = [*(context.get("scope") or []), *args.scope]
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
        comment = f": {approval['comment']}" if approval.get("comment") else ""
        return (
            f"{'' if now else 'already '}{approval.get('status')} {approval.get('approval_id')} "
            f"({approval.get('tool')}) by {approval.get('decided_by')}{comment}"
        )

    def settle(self, run_id: str, approval_id: str, wait_s: float) -> JSON:
        """The run once it has acted on the decision (or after ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            run = self.client.get_run(run_id)
            pending = (run.get("pending_approval") or {}).get("approval_id")
            if run["state"] != WAITING_HUMAN or pending != approval_id:
                return run
            if time.monotonic() >= deadline:
                return run
            time.sleep(0.1)

    def cancel(self) -> int:
        run = self.client.cancel(self.args.run, self.args.reason, self.args.compensate)
        if self.json:
            self.dump(run)
            return exit_code(str(run["state"]))
        return self.ending(run)

    def runs(self) -> int:
        args = self.args
        items: list[JSON] = []
        cursor: str | None = None
        page: JSON = {}
        while len(items) < args.limit:
            page = self.client.list_runs(
                state=args.state,
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


def _client_command(args: argparse.Namespace) -> int:
    from server.client import ApiError

    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="replace")
    cli = Cli(args)
    try:
        with cli.client:
            return COMMANDS[args.command](cli)
    except ApiError as exc:
        if cli.json:
            cli.printer.note(json.dumps(exc.problem, ensure_ascii=False))
        else:
            status = f" (HTTP {exc.status})" if exc.status else ""
            cli.printer.note(f"agent-runtime: error {exc.code}{status}: {exc.detail}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        cli.printer.note("agent-runtime: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_SUCCEEDED
    finally:
        cli.printer.done()


# -- arguments -----------------------------------------------------------------------


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="agent-runtime",
        description="Serve the agent runtime, or drive runs on a server as a client.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    # --url and --json may come before the command too; a command's own (SUPPRESS
    # default) only overrides them when given.
    parser.add_argument("--url", default=None, help="server URL (client commands)")
    parser.add_argument("--json", action="store_true", help="JSON output (client commands)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the HTTP server (with an in-process worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--no-worker", action="store_true", help="HTTP only; drive no runs")
    worker = sub.add_parser("worker", help="drive runs from the shared database, no HTTP")
    worker.add_argument("--concurrency", type=int, default=None)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"server URL (default: ${URL_ENV}, else {DEFAULT_URL})",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )

    def client(name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=summary,
            description=description or summary,
            parents=[common],
            epilog=EXIT_CODES,
            formatter_class=fmt,
        )

    follow_help = (
        "show events live until the run ends or parks in waiting_human "
        "(with --json: one JSON event per line)"
    )
    run = client(
        "run",
        "create a run (POST /runs), optionally following it",
        "Create a run. Without --follow, print it and exit 0 once created.",
    )
    run.add_argument("input", help="the task for the agent ('-' reads it from stdin)")
    run.add_argument("--agent", help="agent id (default: the server's default agent)")
    run.add_argument(
        "--context-json",
        type=_json_object,
        metavar="JSON",
        help='run context, e.g. \'{"user_id": "u-1", "tenant_id": "t"}\'',
    )
    run.add_argument(
        "--scope", action="append", metavar="S", help="add a context scope (repeatable)"
    )
    run.add_argument("--idempotency-key", metavar="K", help="retrying with K returns the same run")
    run.add_argument("--max-steps", type=_positive, metavar="N")
    run.add_argument("--follow", "-f", action="store_true", help=follow_help)

    follow = client("follow", "show a run's events until it ends or parks")
    follow.add_argument("run")
    follow.add_argument("--after", type=int, default=0, metavar="SEQ", help="skip events <= SEQ")

    for name, verb in (("approve", "approve"), ("reject", "reject")):
        decide = client(name, f"{verb} a pending approval of a run")
        decide.add_argument("run")
        decide.add_argument("approval")
        decide.add_argument("--comment", metavar="C")
        decide.add_argument("--by", metavar="U", help="who decides (decided_by)")
        decide.add_argument("--follow", "-f", action="store_true", help="then " + follow_help)
        decide.add_argument(
            "--wait",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="without --follow, wait this long for the run to act on the decision "
            "before reporting its state (default 10)",
        )

    cancel = client("cancel", "cancel a run; it ends failed with RUN_CANCELLED")
    cancel.add_argument("run")
    cancel.add_argument("--reason", metavar="R")
    cancel.add_argument(
        "--compensate", action="store_true", help="also compensate side effects that happened"
    )

    runs = client("runs", "list runs, newest first", "List runs (exit 0).")
    runs.add_argument(
        "--state",
        choices=["pending", "planning", "executing", "waiting_human", "succeeded", "failed"],
    )
    runs.add_argument("--agent", metavar="A")
    runs.add_argument("--limit", type=_positive, default=20, metavar="N")

    show = client("show", "summarise a run")
    show.add_argument("run")
    trace = client("trace", "a run's steps, tool calls, approvals and events, in order")
    trace.add_argument("run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("serve", "worker"):
        return _server_command(args)
    return _client_command(args)


if __name__ == "__main__":
    sys.exit(main())
