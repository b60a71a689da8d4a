"""The ``agent-runtime`` command.

Server side: ``serve`` (HTTP, with a worker unless --no-worker) and ``worker`` (no
HTTP). Any number of each may share one PostgreSQL database.

Keys, straight in the database (``$AGENT_RUNTIME_DATABASE_URL``): the key is printed
once, only its hash is kept:

    agent-runtime keys create --tenant T --user U [--role approver|admin]… [--scope S]…
    agent-runtime keys list [--tenant T]
    agent-runtime keys revoke KEY_ID

Retention, straight in the database: delete runs that ended (succeeded or failed)
more than DAYS ago, with their events, ledger, checkpoints and the artifacts no
other run names (``--dry-run``: only count them):

    agent-runtime prune --older-than DAYS [--dry-run] [--json]

Client side, against a running server (``--url``, default ``$AGENT_RUNTIME_URL`` or
http://127.0.0.1:8000), as ``--token`` (default ``$AGENT_RUNTIME_TOKEN``, else the
embedded default's local keys in ``$AGENT_RUNTIME_DATA_DIR/local-keys.json``):

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
``approve``/``reject`` wait (up to --wait, default 10 s) for the run to end or park
for another approval, then report its state. ``--url`` and ``--json`` may also precede the command.

Exit codes (the run's state when the command ends):

    0  succeeded (and: ``run`` without --follow created the run; ``runs`` listed)
    1  failed (e.g. rejected, cancelled, or errored)
    2  usage or HTTP error (the problem+json ``code`` and detail go to stderr)
    3  waiting_human: parked for an approval
    4  still running (pending, planning or executing; not followed to its end)
  130  interrupted (Ctrl-C)
  141  the output's reader went away (``| head``): cut short, whatever the run's state
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from server.cli_client import (
    DEFAULT_URL,
    TOKEN_ENV,
    URL_ENV,
    client_command,
)

if TYPE_CHECKING:
    from runtime.agent import AgentSpec
    from server.settings import Settings

EXIT_CODES = """\
exit codes (the run's state when the command ends):
  0  succeeded (run without --follow: created; runs: listed)
  1  failed (rejected, cancelled, errored)
  2  usage or HTTP error (problem+json code and detail on stderr)
  3  waiting_human: parked for an approval
  4  still running (pending, planning, executing)
130  interrupted (Ctrl-C)
141  output's reader went away (| head): cut short"""


# -- serve and worker ----------------------------------------------------------------


def _logging(settings: Settings) -> None:
    from server import logs

    logs.configure(settings.log_level)


async def _run_worker(
    settings: Settings, metrics_at: tuple[str, int] | None, agents: dict[str, AgentSpec]
) -> None:
    from server.host import open_host
    from server.worker_http import ProbeServer, listen, probe_app

    sock = None if metrics_at is None else listen(*metrics_at)
    stop = asyncio.Event()
    signals = 0
    hurry: list[Callable[[], None]] = []  # the worker's, once it is up

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals == 2:  # a second signal: stop now (see Engine.hurry)
            logging.getLogger(__name__).warning(
                "a second signal: stopping now; runs in flight are handed back"
            )
            for hurried in hurry:
                hurried()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    async with open_host(settings, agents, run_worker=True) as host:
        if host.worker is not None:
            hurry.append(host.worker.hurry)
            if signals >= 2:
                host.worker.hurry()
        probes = None
        if sock is not None:
            app = probe_app(settings, host.store, host.engine)
            probes = ProbeServer(app, sock, settings.log_level, on_failure=stop.set)
        logging.getLogger(__name__).info("worker %s started", host.engine.owner)
        await stop.wait()
        if probes is not None:
            await probes.stop()


def _server_command(args: argparse.Namespace) -> int:
    from server.embedded import EmbeddedInUse, sole_host
    from server.preflight import make_data_dir, preflight
    from server.settings import Settings, one_line, os_error, refused

    settings = Settings()
    _logging(settings)
    with contextlib.ExitStack() as held:
        try:
            make_data_dir(settings)
            # Held for the process's life from here, before uvicorn starts the app (whose
            # host takes it over): a second start fails in one line, not in a traceback.
            try:
                held.enter_context(sole_host(settings.resolved_database_url, host=False))
            except OSError as exc:  # its directory cannot be made, it is a directory…
                raise refused(settings.database_setting, os_error(exc)) from exc
            agents = preflight(settings, serves_api=args.command == "serve")
        except (EmbeddedInUse, ValueError, OSError, ImportError, RuntimeError) as exc:
            print(f"agent-runtime {args.command}: {one_line(exc)}", file=sys.stderr)
            return 2
        from runtime.dberrors import DATABASE_ERRORS

        if args.command == "serve":
            from server.app import create_app
            from server.preflight import set_up_the_database
            from server.serving import bind, serve

            try:
                listener = bind(args.host, args.port)
            except OSError as exc:
                print(
                    f"agent-runtime serve: cannot listen on {args.host}:{args.port}: "
                    f"{exc.strerror or exc}",
                    file=sys.stderr,
                )
                return 2
            try:
                set_up_the_database(settings)
            except DATABASE_ERRORS as exc:
                listener.close()
                return _database_refused(args.command, exc)
            app = create_app(settings, agents, run_worker=not args.no_worker)
            with listener:
                if not serve(app, settings, listener):
                    return 2
        elif args.command == "worker":
            if args.concurrency is not None:
                settings.worker_concurrency = args.concurrency
            metrics_at = (
                None if args.metrics_port is None else (args.metrics_host, args.metrics_port)
            )
            try:
                _event_loop_run()(_run_worker(settings, metrics_at, agents))
            except DATABASE_ERRORS as exc:
                return _database_refused(args.command, exc)
    return 0


def _database_refused(command: str, exc: BaseException) -> int:
    """The database reached, and refusing: its schema set-up, say. An OSError is not the
    database's word: raised as it is."""
    from server.settings import one_line

    if isinstance(exc, OSError):
        raise exc
    print(f"agent-runtime {command}: the database refused: {one_line(exc)}", file=sys.stderr)
    return 2


def _event_loop_run() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's runner where it is installed (uvicorn[standard]), as `serve` runs on it."""
    try:
        import uvloop
    except ImportError:  # not on every platform: see uvloop's markers
        return asyncio.run
    return uvloop.run


# -- arguments -----------------------------------------------------------------------


def _between(most: float, unit: str) -> Callable[[str], float]:
    """An argument type: a number from 0 to ``most`` (never NaN: a wait on it never ends)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"must be a number of {unit}") from exc
        if not 0 <= value <= most:
            raise argparse.ArgumentTypeError(f"must be between 0 and {most:g} {unit}")
        return value

    return parse


_days = _between(365_000, "days")
_seconds = _between(86_400, "seconds")


def _whole(least: int, most: Callable[[], int], what: str) -> Callable[[str], int]:
    """An argument type: a whole number from ``least`` to ``most()`` (argparse's
    ``int`` took any, and uvloop binds port 70000 as 4464)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"must be a whole number ({what})") from exc
        if not least <= value <= most():
            raise argparse.ArgumentTypeError(f"must be between {least} and {most()} ({what})")
        return value

    return parse


def _most_concurrency() -> int:
    from server.settings import MOST_CONCURRENCY  # pydantic: only when the flag is given

    return MOST_CONCURRENCY


_port = _whole(0, lambda: 65_535, "0: any free port")
_concurrency = _whole(1, _most_concurrency, "runs driven at once")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from runtime.store.schema import MIGRATIONS

    try:
        installed = version("agent-runtime")
    except PackageNotFoundError:  # run from a checkout that was never installed
        installed = "(not installed)"
    # The schema's: what an operator checks before pointing it at a database (no
    # rolling upgrade; a newer schema is refused).
    return f"agent-runtime {installed}, schema {len(MIGRATIONS)}"


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="agent-runtime",
        description="Serve the agent runtime, or drive runs on a server as a client.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=_version(),
        help="the installed version, and the schema version its migrations reach",
    )
    # --url and --json may come before the command too; a command's own (SUPPRESS
    # default) only overrides them when given.
    parser.add_argument("--url", default=None, help="server URL (client commands)")
    parser.add_argument("--json", action="store_true", help="JSON output (client commands)")
    parser.add_argument("--token", default=None, help="bearer token (client commands)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the HTTP server (with an in-process worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000, metavar="PORT")
    serve.add_argument("--no-worker", action="store_true", help="HTTP only; drive no runs")
    worker = sub.add_parser("worker", help="drive runs from the shared database, no HTTP")
    worker.add_argument(
        "--concurrency", type=_concurrency, default=None, metavar="N", help="runs driven at once"
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve GET /metrics (AGENT_RUNTIME_METRICS_TOKEN) and GET /healthz on this port",
    )
    worker.add_argument("--metrics-host", default="127.0.0.1")

    keys = sub.add_parser("keys", help="create, list or revoke API keys (in the database)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--user", required=True)
    create.add_argument("--role", action="append", choices=["approver", "admin"])
    create.add_argument("--scope", action="append", metavar="S", help="'*' grants any scope")
    create.add_argument("--label", metavar="L")
    create.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print key_id and token"
    )
    keys_list = keys_sub.add_parser("list", help="list keys (never their secrets)")
    keys_list.add_argument("--tenant")
    keys_list.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="one JSON list"
    )
    revoke = keys_sub.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("key_id")

    prune = sub.add_parser(
        "prune", help="delete runs that ended more than --older-than days ago (in the database)"
    )
    prune.add_argument("--older-than", type=_days, required=True, metavar="DAYS")
    prune.add_argument("--dry-run", action="store_true", help="count them; delete nothing")
    prune.add_argument("--json", action="store_true", default=argparse.SUPPRESS)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"server URL (default: ${URL_ENV}, else {DEFAULT_URL})",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    common.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help=f"bearer token (default: ${TOKEN_ENV}, else the local keys of `make run`)",
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
        decide.add_argument(
            "--by", metavar="U", help="who decides (decided_by); must be the token's user"
        )
        decide.add_argument("--follow", "-f", action="store_true", help="then " + follow_help)
        decide.add_argument(
            "--wait",
            type=_seconds,
            default=10.0,
            metavar="SECONDS",
            help="without --follow, wait this long for the run to end or park again "
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
        action="append",
        help="only runs in this state (repeat for several)",
    )
    runs.add_argument("--agent", metavar="A")
    runs.add_argument("--limit", type=_positive, default=20, metavar="N")

    show = client("show", "summarise a run")
    show.add_argument("run")
    trace = client("trace", "a run's steps, tool calls, approvals and events, in order")
    trace.add_argument("run")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("serve", "worker"):
            return _server_command(args)
        if sys.stdout is None:  # started with it closed (`>&-`)
            # What the command prints would go nowhere: a new key's token with it.
            if sys.stderr is not None:
                print(f"agent-runtime {args.command}: stdout is closed", file=sys.stderr)
            return 2
        if args.command in ("keys", "prune"):
            from server import cli_admin

            return cli_admin.run(getattr(cli_admin, args.command), args)
        return client_command(args)
    except KeyboardInterrupt:  # before a command's own handler: importing, parsing
        print("agent-runtime: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        problem = _settings_problem(exc)
        if problem is None:
            raise
        print(f"agent-runtime: {problem}", file=sys.stderr)
        return 2


def _settings_problem(exc: Exception) -> str | None:
    """One line for settings that cannot be used (naming each variable), else None."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from server.settings import one_line

    if isinstance(exc, SettingsError):
        # pydantic-settings names the field, not the variable: 'error parsing value for
        # field "extra_agents" from source "EnvSettingsSource"' (a list or an object
        # that is not JSON); what JSON said is its cause.
        field = re.search(r'field "(\w+)"', str(exc))
        if field is None:
            return f"a setting cannot be read: {one_line(exc)}"
        cause = f": {one_line(exc.__cause__)}" if exc.__cause__ is not None else ""
        return (
            f"a setting cannot be read: AGENT_RUNTIME_{field[1].upper()}: not JSON "
            f'(a list is written as JSON, e.g. ["a", "b"]){cause}'
        )
    if not (isinstance(exc, ValidationError) and exc.title == "Settings"):
        return None
    named = (
        f"AGENT_RUNTIME_{'_'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"
        for error in exc.errors()
    )
    return "invalid settings: " + "; ".join(named)


if __name__ == "__main__":
    sys.exit(main())
