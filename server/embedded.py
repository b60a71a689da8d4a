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

from runtime.backend import sqlite_path


class EmbeddedInUse(RuntimeError):
    """Another live process serves this embedded database."""


@contextmanager
def sole_host(database_url: str) -> Iterator[None]:
    """Hold the embedded database at ``database_url`` for this process, or raise
    :class:`EmbeddedInUse`; nothing for a PostgreSQL URL.

    An advisory lock on a file beside the database (``<file>.host``), which the kernel
    releases when the process dies however it dies, so a restart after SIGKILL takes it
    at once. The lock file keeps the holder's pid, for the message.
    """
    if not database_url.startswith("sqlite:///"):
        yield
        return
    path = sqlite_path(database_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".host")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise EmbeddedInUse(
                f"the embedded database {path} is served by another process"
                f"{f' (pid {holder})' if holder else ''}: stop it first, or set "
                "AGENT_RUNTIME_DATABASE_URL to a PostgreSQL database to run several"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
