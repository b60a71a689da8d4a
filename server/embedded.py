"""One serving process per embedded database.

A process that serves or works an embedded (SQLite) database takes over every lease in
it at its start (``RunStore.expire_all_leases``): the only earlier process can have
been one that died. A second one beside a live first would take the first's runs from
under it, and SQLite's checkpoints carry no lease fence, so the first could still save
a checkpoint after the second's. Several processes need PostgreSQL.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.backend import sqlite_path

_locks: dict[Path, int] = {}
"""The lock files this process holds, and the descriptor holding each."""
_hosts: set[Path] = set()
"""The embedded databases a host of this process serves."""


class EmbeddedInUse(RuntimeError):
    """Another live process, or another host of this one, serves this embedded database."""


def _forget_in_child() -> None:
    # A child forked without exec (multiprocessing, a process pool in a tool) would
    # share the lock and keep it after this process died. Closing its copy leaves the
    # parent's hold as it is: the lock goes with the last descriptor of its open file.
    for fd in _locks.values():
        os.close(fd)
    _locks.clear()
    _hosts.clear()


os.register_at_fork(after_in_child=_forget_in_child)


@contextmanager
def _process_hold(database: Path) -> Iterator[None]:
    """An advisory lock on ``<file>.host`` beside the database, which the kernel drops
    when the process dies however it dies: a restart after SIGKILL takes it at once.
    The file keeps the holder's pid, for the message; deleting it while a process
    holds it would let a second one in."""
    lock_path = database.with_name(database.name + ".host")
    if lock_path in _locks:  # held already: the CLI takes it before its host starts
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise EmbeddedInUse(
            f"the embedded database {database} is served by another process"
            f"{f' (pid {holder})' if holder else ''}: stop it first, or set "
            "AGENT_RUNTIME_DATABASE_URL to a PostgreSQL database to run several"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    _locks[lock_path] = fd
    try:
        yield
    finally:
        # (A forked child that leaves the block has closed its copy already.)
        if _locks.get(lock_path) == fd:
            del _locks[lock_path]
            os.close(fd)  # releases the lock


@contextmanager
def sole_host(database_url: str, *, host: bool = True) -> Iterator[None]:
    """Hold the embedded database at ``database_url`` for this process and, with
    ``host``, for one host of it; or raise :class:`EmbeddedInUse`. Nothing for a
    PostgreSQL URL. The path is resolved first: a symlink to the file, or another
    spelling of it, is the same database to SQLite."""
    if not database_url.startswith("sqlite:///"):
        yield
        return
    database = sqlite_path(database_url).resolve()
    with _process_hold(database):
        if not host:
            yield
            return
        if database in _hosts:
            raise EmbeddedInUse(f"the embedded database {database} is served by this process")
        _hosts.add(database)
        try:
            yield
        finally:
            _hosts.discard(database)
