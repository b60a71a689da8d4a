"""What a start checks before it starts, where the check would otherwise fail inside
it as a traceback: said in one line that names the setting (``refused``).

The database part (:func:`reach_the_database`) is every command's that opens the store:
``serve`` and ``worker``, and the admin commands (``keys``, ``prune``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.agent import AgentSpec
    from server.settings import Settings


def preflight(settings: Settings, *, serves_api: bool) -> dict[str, AgentSpec]:
    """What would otherwise fail inside the server's start, as a traceback: the token
    keys (of a process that serves the API: a worker's probes take no token), the
    database, and the agents (their modules, the demo's planner model, the default)."""
    from server.agents import load_agents
    from server.auth.jwt_tokens import JwtVerifier

    if serves_api:
        JwtVerifier(settings)
    reach_the_database(settings)
    agents = load_agents(settings)
    if settings.default_agent not in agents:
        raise ValueError(
            f"AGENT_RUNTIME_DEFAULT_AGENT: no agent {settings.default_agent!r} "
            f"(there are {', '.join(sorted(agents))})"
        )
    return agents


def set_up_the_database(settings: Settings) -> None:
    """The store's schema set up now, before uvicorn starts the app: a database that
    refuses it (a role that may create nothing) raises here, for ``serve`` to say in
    one line; inside the app's start it was uvicorn's traceback of the lifespan. The
    app's own start finds the schema current."""
    import asyncio

    from runtime.backend import open_backend

    async def set_up() -> None:
        backend = await open_backend(settings.resolved_database_url)
        await backend.close()

    asyncio.run(set_up())


def make_data_dir(settings: Settings) -> None:
    """The data directory, made now: the host would make it inside its start."""
    from server.settings import os_error, refused

    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # a file, or under one
        raise refused("data_dir", os_error(exc)) from exc
    except OSError as exc:
        raise refused("data_dir", f"cannot make the directory: {os_error(exc)}") from exc


def reach_the_database(settings: Settings) -> None:
    """A PostgreSQL server that is not there, or refuses us, or an embedded file that
    is not a SQLite database: said in one line (the pool would wait out its timeout,
    the store fail as it opens, inside the start and with a traceback)."""
    url = settings.resolved_database_url
    if url.startswith("sqlite:///"):
        _read_the_embedded_database(settings)
        return
    import psycopg

    from server.settings import one_line, refused

    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())  # psycopg's message spans lines
        raise ConnectionError(f"cannot reach AGENT_RUNTIME_DATABASE_URL: {reason}") from exc
    except psycopg.Error:  # libpq could not parse it; its message quotes it, password too
        raise ValueError("AGENT_RUNTIME_DATABASE_URL is not a valid PostgreSQL URL") from None
    with conn:
        try:
            # The store's own table: in the schema it creates its tables in (the first
            # of the search_path), not one of another application further along it.
            row = conn.execute(
                "SELECT current_schema() IS NOT NULL, to_regclass(format('%I.schema_version', "
                "COALESCE(current_schema(), ''))) IS NOT NULL"
            ).fetchone()
            if row and not row[0]:  # format('%I') of a NULL fails with a riddle instead
                raise refused(
                    settings.database_setting,
                    "no schema on its search_path exists (create it, or name one that does)",
                )
            version = None
            if row and row[1]:
                found = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
                version = found[0] if found else None
        except psycopg.Error as exc:
            raise refused(
                settings.database_setting, f"cannot read its schema version: {one_line(exc)}"
            ) from exc
    _known_schema(settings, version)


def _read_the_embedded_database(settings: Settings) -> None:
    """The embedded file is SQLite's (a file not there yet is the store's to make, in
    a directory: not under a file)."""
    import sqlite3

    from runtime.backend import sqlite_path
    from server.settings import refused

    path = sqlite_path(settings.resolved_database_url)
    # The store makes the directories it lacks, in a traceback where one is a file.
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise refused(settings.database_setting, f"{above} is not a directory")
    if not path.is_file() or path.stat().st_size == 0:  # (SQLite's, new or empty)
        return
    try:
        # Read-write, as the store opens it: a read-only reader of a WAL database would
        # leave its -wal and -shm files behind.
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=10)
        try:
            found = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name = 'schema_version'"
            ).fetchone()
            if found[0]:
                version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
                _known_schema(settings, version[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            why = f"{path} is not a SQLite database ({exc})"
        else:
            why = f"{path} cannot be read: {exc}"
        raise refused(settings.database_setting, why) from exc


def _known_schema(settings: Settings, version: object) -> None:
    """A database a newer version migrated: refused here in one line (the store would
    refuse it inside the start, with a traceback). A version that is no integer is
    another tool's table of that name: not ours to judge."""
    from runtime.store.schema import SchemaTooNew, check_schema_version
    from server.settings import refused

    if not isinstance(version, int):
        return
    try:
        check_schema_version(version)
    except SchemaTooNew as exc:
        raise refused(settings.database_setting, exc) from exc
