from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.server_proc import ServerProcess


@pytest.fixture
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(data_dir, database_url)
    try:
        yield proc
    finally:
        proc.stop()


def state_is(*states: str):  # type: ignore[no-untyped-def]
    def until(event: dict[str, object]) -> bool:
        data = event.get("data")
        return event.get("type") == "state" and isinstance(data, dict) and data["to"] in states

    return until
