"""The hold on an embedded database (server.embedded): one process, one host of it.

Other processes are real ones (a Python child asking for the same hold), so the lock
is the kernel's, as between two `agent-runtime` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.embedded import EmbeddedInUse, sole_host

ROOT = Path(__file__).resolve().parents[2]
ASK = (
    "import sys\n"
    "from server.embedded import EmbeddedInUse, sole_host\n"
    "try:\n"
    "    with sole_host(sys.argv[1]):\n"
    "        print('held')\n"
    "except EmbeddedInUse as exc:\n"
    "    print('refused:', exc)\n"
)


def ask_elsewhere(url: str) -> str:
    """What another process is told when it asks for the hold of ``url``."""
    done = subprocess.run(
        [sys.executable, "-c", ASK, url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_another_process_is_refused_by_any_path_to_the_file(tmp_path: Path) -> None:
    db = tmp_path / "runtime.db"
    alias = tmp_path / "alias.db"
    alias.symlink_to(db)
    with sole_host(f"sqlite:///{db}"):
        for url in (f"sqlite:///{alias}", f"sqlite:///{tmp_path}/sub/../runtime.db"):
            said = ask_elsewhere(url)
            assert said.startswith("refused:") and f"(pid {os.getpid()})" in said, said
    assert ask_elsewhere(f"sqlite:///{alias}") == "held"  # released with the context


def test_another_process_is_refused_by_another_name_of_the_file(tmp_path: Path) -> None:
    """A hard link is the same file under another name (resolving it finds nothing to
    compare), with a WAL of its own: two processes on it would each write over what the
    other's WAL holds. Nor does deleting the ``.host`` beside the file let one in. The
    holder is named either way (the kernel's record of the file's lock has the pid)."""
    db = tmp_path / "runtime.db"
    (tmp_path / "other").mkdir()
    linked = tmp_path / "other" / "linked.db"
    with sole_host(f"sqlite:///{db}"):
        os.link(db, linked)
        for url in (f"sqlite:///{linked}", f"sqlite:///{db}"):
            said = ask_elsewhere(url)
            assert said.startswith("refused:") and f"(pid {os.getpid()})" in said, said
            (tmp_path / "runtime.db.host").unlink(missing_ok=True)  # then by the file alone
    assert ask_elsewhere(f"sqlite:///{linked}") == "held"


def test_a_database_the_hold_creates_is_its_owners_alone(tmp_path: Path) -> None:
    """The hold may be the first to create the file: it holds secret arguments."""
    db = tmp_path / "runtime.db"
    with sole_host(f"sqlite:///{db}"):
        pass
    if db.exists():  # (made on Linux, where the file itself is locked)
        assert db.stat().st_mode & 0o777 == 0o600


def test_a_second_host_in_this_process_is_refused_but_its_cli_hold_is_not(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'runtime.db'}"
    with sole_host(url, host=False):  # the CLI, before uvicorn starts the app
        with sole_host(url):  # the app's host
            with pytest.raises(EmbeddedInUse, match="served by this process"), sole_host(url):
                pass
        assert ask_elsewhere(url).startswith("refused:")  # the CLI still holds it
    assert ask_elsewhere(url) == "held"


def test_a_child_forked_without_exec_does_not_keep_the_hold(tmp_path: Path) -> None:
    """A tool's process pool or multiprocessing forks: the child's copy of the lock's
    descriptor would keep the database held after this process had let it go (or died)."""
    url = f"sqlite:///{tmp_path / 'runtime.db'}"
    with sole_host(url):
        child = os.fork()
        if child == 0:  # pragma: no cover - the child only sleeps until it is killed
            time.sleep(60)
            os._exit(0)
    try:
        assert ask_elsewhere(url) == "held"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_postgresql_needs_no_hold() -> None:
    url = "postgresql://postgres@127.0.0.1:5432/test"
    with sole_host(url), sole_host(url):
        pass
