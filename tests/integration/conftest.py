from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.integration.server_proc import ChildProcess, ServerProcess

P = TypeVar("P", bound=ChildProcess)


def _serving(url: str, data_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(data_dir, url)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    """A server (not yet started) on each database."""
    yield from _serving(database_url, data_dir)


@pytest.fixture
def pg_server(pg_schema_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    """A server (not yet started) on PostgreSQL only."""
    yield from _serving(pg_schema_url, data_dir)


class Processes:
    """Every process a test starts; all are stopped (SIGCONT, SIGTERM, SIGKILL) at the end."""

    def __init__(self) -> None:
        self.all: list[ChildProcess] = []

    def add(self, proc: P) -> P:
        self.all.append(proc)
        return proc

    def stop_all(self) -> None:
        errors: list[BaseException] = []
        for proc in reversed(self.all):
            try:
                proc.stop()
            except BaseException as exc:  # stop the others regardless
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop_all()


def state_is(*states: str):  # type: ignore[no-untyped-def]
    def until(event: dict[str, object]) -> bool:
        data = event.get("data")
        return event.get("type") == "state" and isinstance(data, dict) and data["to"] in states

    return until
