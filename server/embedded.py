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
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.backend import sqlite_path

_locks: dict[Path, tuple[int, int]] = {}
"""The lock files this process holds, and the descriptors holding each and its
database file."""
_hosts: set[Path] = set()
"""The embedded databases a host of this process serves."""


class EmbeddedInUse(RuntimeError):
    """Another live process, or another host of this one, serves this embedded database."""


def _forget_in_child() -> None:
    # A child forked without exec (multiprocessing, a process pool in a tool) would
    # share the lock and keep it after this process died. Closing its copy leaves the
    # parent's hold as it is: the lock goes with the last descriptor of its open file.
    for fds in _locks.values():
        for fd in fds:
            os.close(fd)
    _locks.clear()
    _hosts.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _in_use(database: Path, holder: str) -> EmbeddedInUse:
    return EmbeddedInUse(
        f"the embedded database {database} is served by another process"
        f"{f' (pid {holder})' if holder else ''}: stop it first, or set "
        "AGENT_RUNTIME_DATABASE_URL to a PostgreSQL database to run several"
    )


def _flock_holder(fd: int) -> str:
    """The pid holding a ``flock`` on ``fd``'s file, from /proc/locks ("" if none is
    seen: another pid namespace shows 0, or the lock went meanwhile)."""
    st = os.fstat(fd)
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                # "3: FLOCK  ADVISORY  WRITE 11476 fe:00:2155237 0 EOF"
                fields = line.split()
                if fields[1:2] == ["FLOCK"] and fields[5:6] == [file_id] and fields[4] != "0":
                    return fields[4]
    except OSError:
        pass
    return ""


@contextmanager
def _process_hold(database: Path) -> Iterator[None]:
    """Advisory locks the kernel drops when the process dies however it dies (a restart
    after SIGKILL takes them at once): on ``<file>.host`` beside the database, which
    keeps the holder's pid for the message, and on the database file itself, so that
    the file under another name (a hard link, a bind mount), or with its ``.host``
    deleted, is held all the same (on Linux only: there, on a local file system,
    ``flock`` does not meet SQLite's own ``fcntl`` locks; on the BSDs and macOS it
    may). The descriptor on the file is closed only once the hold ends, after the host
    has closed its connections: closing any descriptor of a file drops the process's
    ``fcntl`` locks on it, SQLite's included."""
    lock_path = database.with_name(database.name + ".host")
    if lock_path in _locks:  # held already: the CLI takes it before its host starts
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    file_fd = -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if sys.platform == "linux":  # elsewhere flock may meet SQLite's fcntl locks
            # An empty file is an empty database to SQLite; readable by its owner
            # alone, as the store makes it (it holds secret arguments).
            file_fd = os.open(database, os.O_RDONLY | os.O_CREAT, 0o600)
            fcntl.flock(file_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except BaseException as exc:
        if file_fd < 0:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        else:  # refused on the file alone: held under another name, with its own .host
            holder = _flock_holder(file_fd)
        for opened in (fd, file_fd):
            if opened >= 0:
                os.close(opened)
        if isinstance(exc, BlockingIOError):
            raise _in_use(database, holder) from None
        raise
    _locks[lock_path] = (fd, file_fd)
    try:
        yield
    finally:
        # (A forked child that leaves the block has closed its copies already.)
        if _locks.get(lock_path) == (fd, file_fd):
            del _locks[lock_path]
            if file_fd >= 0:
                os.close(file_fd)
            os.close(fd)  # releases the locks


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
