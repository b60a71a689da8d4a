"""The ``agent-runtime`` command: ``serve`` (HTTP, with a worker unless --no-worker) and
``worker`` (no HTTP). Any number of each may share one PostgreSQL database."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import uvicorn

from server.settings import Settings


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="agent-runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server (with an in-process worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--no-worker", action="store_true", help="HTTP only; drive no runs")
    worker = sub.add_parser("worker", help="drive runs from the shared database, no HTTP")
    worker.add_argument("--concurrency", type=int, default=None)
    args = parser.parse_args(argv)
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
            timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        )
    elif args.command == "worker":
        if args.concurrency is not None:
            settings.worker_concurrency = args.concurrency
        asyncio.run(_run_worker(settings))


if __name__ == "__main__":
    main()
