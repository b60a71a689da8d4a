"""What the ``agent-runtime`` command refuses, it refuses in one line and with exit 2
(README: usage errors), never with a traceback: settings no server can use, and
arguments no request can carry. No server is needed for any of them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from runtime.backend import open_backend
from tests.integration.server_proc import ROOT
from tools.retail import generate

CLI = (sys.executable, "-m", "server.cli")


def agent_runtime(
    tmp_path: Path, *args: str | bytes, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENT_RUNTIME_")},
            "PYTHONPATH": str(ROOT),
            "AGENT_RUNTIME_DATA_DIR": str(tmp_path / "data"),
            "AGENT_RUNTIME_URL": "http://127.0.0.1:9",  # nothing listens: never reached
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_refusal(done: subprocess.CompletedProcess[str], *says: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    for said in says:
        assert said in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_SECONDS", "inf"),  # never taken over: a dead worker's runs stay its own
        ("MAX_COST_USD", "inf"),  # no JSON can carry it: every run's answer a 500
        ("MAX_TOKENS", "99999999999999999999999"),  # past 64 bits: every checkpoint fails
        ("WORKER_CONCURRENCY", "0"),
        ("DATABASE_URL", "mysql://somewhere/db"),
        ("LOG_LEVEL", "bogus"),
    ],
)
@pytest.mark.parametrize("command", [("worker",), ("keys", "list"), ("runs",)])
def test_settings_no_server_can_use_are_refused_in_one_line(
    tmp_path: Path, command: tuple[str, ...], name: str, value: str
) -> None:
    done = agent_runtime(tmp_path, *command, **{f"AGENT_RUNTIME_{name}": value})
    assert_one_line_refusal(done, f"AGENT_RUNTIME_{name}")


@pytest.mark.parametrize("command", [("worker",), ("serve", "--port", "0"), ("runs",)])
def test_unreadable_settings_are_refused_in_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Named as the variable, not as pydantic-settings' field "extra_agents" from
    source "EnvSettingsSource"."""
    done = agent_runtime(tmp_path, *command, AGENT_RUNTIME_EXTRA_AGENTS="not json")
    assert_one_line_refusal(done, "AGENT_RUNTIME_EXTRA_AGENTS: not JSON", "Expecting value")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--url", "http://[::1", "runs"), "not a usable URL"),
        (("--url", "htp:/x", "runs"), "not a usable URL"),  # not "server unreachable"
        # Not a 404 for every command: each path went after the query.
        (("--url", "http://127.0.0.1:9/?tenant=a", "runs"), "no query string"),
        (("--url", "http://127.0.0.1:9/#top", "runs"), "no query string"),
        (("--token", "café", "runs"), "cannot be sent"),  # a header is ASCII
        (("--token", "abc\ndef", "runs"), "cannot be sent"),  # and one line
        (("run", b"\xff"), "cannot be sent"),  # bytes that are not UTF-8 in argv
        (("show", b"run-\xff"), "cannot be sent"),
    ],
)
def test_arguments_no_request_can_carry_are_refused_in_one_line(
    tmp_path: Path, args: tuple[str | bytes, ...], says: str
) -> None:
    assert_one_line_refusal(agent_runtime(tmp_path, *args), says)


def test_a_local_keys_file_that_is_not_ours_is_as_if_there_were_none(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "local-keys.json").write_text("[]")
    done = agent_runtime(tmp_path, "runs")
    assert_one_line_refusal(done, "SERVER_UNREACHABLE")


@pytest.mark.parametrize(
    ("command", "env", "says"),
    [
        *(
            (command, {"AGENT_RUNTIME_DEFAULT_AGENT": "nobody"}, "AGENT_RUNTIME_DEFAULT_AGENT")
            for command in ("worker", "serve")
        ),
        *(
            (command, {"AGENT_RUNTIME_EXTRA_AGENTS": '["no.such.module:build"]'}, "EXTRA_AGENTS")
            for command in ("worker", "serve")
        ),
        # (A worker serves no API: its token settings are not its to refuse.)
        ("serve", {"AGENT_RUNTIME_JWT_HS256_SECRET": "short"}, "JWT_HS256_SECRET"),
        (
            "serve",
            {
                "AGENT_RUNTIME_JWT_PUBLIC_KEY_FILE": "KEY",  # a file of garbage, below
                "AGENT_RUNTIME_JWT_ISSUER": "https://idp.example",
                "AGENT_RUNTIME_JWT_AUDIENCE": "agent-runtime",
            },
            "JWT_PUBLIC_KEY_FILE",
        ),
        *(
            (
                "serve",
                {
                    f"AGENT_RUNTIME_JWT_{which}_FILE": where,
                    "AGENT_RUNTIME_JWT_ISSUER": "https://idp.example",
                    "AGENT_RUNTIME_JWT_AUDIENCE": "agent-runtime",
                },
                f"AGENT_RUNTIME_JWT_{which}_FILE: cannot read {where}",
            )
            for which in ("PUBLIC_KEY", "JWKS")
            for where in ("/nonexistent.pem", "/")  # not there; a directory
        ),
    ],
)
def test_a_server_that_could_not_start_says_why_in_one_line(
    tmp_path: Path, command: str, env: dict[str, str], says: str
) -> None:
    """Not a traceback from inside the server's start (and exit 3, which the client
    commands use for a parked run); a key that cannot be parsed refused every token."""
    garbage = tmp_path / "key.pem"
    garbage.write_text("garbage")
    env = {k: str(garbage) if v == "KEY" else v for k, v in env.items()}
    # (serve would listen on a port of the system's choosing, had it started)
    args = (command, "--port", "0") if command == "serve" else (command,)
    done = agent_runtime(tmp_path, *args, **env)
    assert_one_line_refusal(done, says)


PLUGINS = {
    "takes_nothing": "def build():\n    return []\n",
    "syntax_error": "def build(settings)\n    return []\n",
    "name_error": "def build(settings: Settings):\n    return []\n",
    "fails_on_import": "raise KeyError('no config')\n",
    "raises": "def build(settings):\n    raise RuntimeError('boom')\n",
    "returns_none": "def build(settings):\n    return None\n",
    "returns_dicts": "def build(settings):\n    return [{'agent_id': 'a'}]\n",
    "returns_strings": "def build(settings):\n    return ['a', 'b']\n",
    "fails_as_a_generator": "def build(settings):\n    yield from ()\n    raise ValueError\n",
    "not_a_function": "build = 42\n",
    "no_build_agents": "def build(settings):\n    return []\n",
    "demo_again": (
        "from dataclasses import replace\n"
        "from tests.agents import build_agents\n"
        "def build(settings):\n"
        "    return [replace(build_agents(settings)[0], agent_id='retail_analyst')]\n"
    ),
    "odd_id": (
        "from dataclasses import replace\n"
        "from tests.agents import build_agents\n"
        "def build(settings):\n"
        "    return [replace(build_agents(settings)[0], agent_id='pct%agent')]\n"
    ),
    "tests_agents_again": (
        "from tests.agents import build_agents\n"
        "def build(settings):\n"
        "    return build_agents(settings)\n"
    ),
}


EXTRA_AGENTS_REFUSED = [
    (["takes_nothing:build"], "takes 0 positional arguments"),
    (["syntax_error:build"], "SyntaxError"),
    (["name_error:build"], "NameError"),
    (["fails_on_import:build"], "no config"),
    (["raises:build"], "boom"),
    (["returns_none:build"], "None"),
    (["returns_dicts:build"], "dict"),
    (["returns_strings:build"], "str"),
    (["fails_as_a_generator:build"], "ValueError"),
    (["not_a_function:build"], "no function build"),
    (["no_build_agents"], "no function build_agents"),  # a module alone: its build_agents
    (["demo_again:build"], "'retail_analyst'"),
    # Written into the worker's claims: on PostgreSQL a "%" stopped every one of them.
    (["odd_id:build"], "agent id 'pct%agent' is not letters, digits"),
    (["tests.agents:build_agents", "tests_agents_again:build"], "tests.agents:build_agents"),
]


@pytest.mark.parametrize(
    ("command", "paths", "says"),
    [
        *(("serve", ["raises:build"], "boom"), ("serve", ["demo_again:build"], "retail_analyst")),
        *(("worker", *case) for case in EXTRA_AGENTS_REFUSED),
    ],
)
def test_extra_agents_that_cannot_be_hosted_are_refused_naming_their_factory(
    tmp_path: Path, command: str, paths: list[str], says: str
) -> None:
    """Whatever the factory's module or call does, one line names the setting and the
    factory; and no agent replaces another (the demo's, or another module's)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for name, code in PLUGINS.items():
        (plugins / f"{name}.py").write_text(code)
    args = (command, "--port", "0") if command == "serve" else (command,)
    done = agent_runtime(
        tmp_path,
        *args,
        PYTHONPATH=os.pathsep.join((str(ROOT), str(plugins))),
        AGENT_RUNTIME_EXTRA_AGENTS=json.dumps(paths),
    )
    assert_one_line_refusal(done, "AGENT_RUNTIME_EXTRA_AGENTS", f"'{paths[-1]}'", says)


@pytest.mark.parametrize("model", ["nowhere:no-model", "nonsense"])
@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_planner_model_that_cannot_be_made_is_refused_naming_the_setting(
    tmp_path: Path, command: str, model: str
) -> None:
    """An unknown provider (langchain's message spans five lines), or no langchain."""
    args = (command, "--port", "0") if command == "serve" else (command,)
    done = agent_runtime(tmp_path, *args, AGENT_RUNTIME_PLANNER_MODEL=model)
    assert_one_line_refusal(done, "AGENT_RUNTIME_PLANNER_MODEL", repr(model))


def test_a_planner_model_whose_provider_fails_to_construct_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """The provider's package is there, but its model cannot be made (langchain-openai
    without OPENAI_API_KEY raises openai.OpenAIError): was a traceback and exit 1. The
    provider package here is a stand-in that fails as that one does; langchain is real."""
    provider = tmp_path / "provider" / "langchain_openai"
    provider.mkdir(parents=True)
    (provider / "__init__.py").write_text(
        "class OpenAIError(Exception):\n    pass\n\n"
        "class ChatOpenAI:\n"
        "    def __init__(self, **kwargs):\n"
        "        raise OpenAIError('Missing credentials.\\nSet OPENAI_API_KEY.')\n"
    )
    done = agent_runtime(
        tmp_path,
        "worker",
        PYTHONPATH=os.pathsep.join((str(ROOT), str(provider.parent))),
        AGENT_RUNTIME_PLANNER_MODEL="openai:gpt-4o-mini",
    )
    assert_one_line_refusal(
        done, "AGENT_RUNTIME_PLANNER_MODEL", "'openai:gpt-4o-mini'", "Missing credentials."
    )


@pytest.mark.parametrize(
    "where",
    [
        "postgresql://postgres@127.0.0.1:1/test",  # nothing listens there
        "postgresql://postgres@127.0.0.1:5432/no_such_database_here",
        "sqlite:///FILE/runtime.db",  # its directory is a file
        "postgresql://postgres:s3cret@[::1/test",  # libpq cannot parse it
    ],
)
def test_a_database_that_cannot_be_reached_is_said_in_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    url = where.replace("FILE", str(tmp_path / "file"))
    done = agent_runtime(tmp_path, "worker", AGENT_RUNTIME_DATABASE_URL=url)
    assert_one_line_refusal(done)
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize("command", [("keys", "list"), ("prune", "--older-than", "1")])
@pytest.mark.parametrize(
    ("env", "says"),
    [
        # As the server does: they waited out the pool's 10 s, then a traceback.
        ({"AGENT_RUNTIME_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/test"}, "cannot reach"),
        # The store's mkdir of its directory under a file: a traceback.
        (
            {"AGENT_RUNTIME_DATABASE_URL": "sqlite:///FILE/runtime.db"},
            "AGENT_RUNTIME_DATABASE_URL: FILE is not a directory",
        ),
        (
            {"AGENT_RUNTIME_DATA_DIR": "FILE/data"},
            "AGENT_RUNTIME_DATA_DIR: FILE is not a directory",
        ),
    ],
)
def test_the_admin_commands_say_a_database_out_of_reach_in_one_line(
    tmp_path: Path, command: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    file = tmp_path / "file"
    file.write_text("not a directory")
    env = {name: value.replace("FILE", str(file)) for name, value in env.items()}
    done = agent_runtime(tmp_path, *command, **env)
    assert_one_line_refusal(done, f"agent-runtime {command[0]}: " + says.replace("FILE", str(file)))
    assert file.read_text() == "not a directory"


@pytest.mark.parametrize("command", ["worker", "serve"])
@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"AGENT_RUNTIME_DATABASE_URL": "sqlite:///TEXT"}, "is not a SQLite database"),
        ({"AGENT_RUNTIME_DATABASE_URL": "sqlite:///TMP"}, "Is a directory"),
        ({"AGENT_RUNTIME_DATABASE_URL": "sqlite:///TEXT/runtime.db"}, "is not a directory"),
        ({"AGENT_RUNTIME_DATA_DIR": "GARBAGE"}, "runtime.db is not a SQLite database"),
        ({"AGENT_RUNTIME_DATA_DIR": "TEXT"}, "is not a directory"),
        ({"AGENT_RUNTIME_DATA_DIR": "TEXT/data"}, "Not a directory"),
        ({"AGENT_RUNTIME_DATA_DIR": "/proc/agent-runtime-nope"}, "cannot make the directory"),
    ],
)
def test_a_data_dir_or_database_no_server_can_use_is_refused_naming_the_setting(
    tmp_path: Path, command: str, env: dict[str, str], says: str
) -> None:
    """Not "[Errno 17] File exists", nor (a file that is not SQLite's) uvicorn's
    68-line traceback or the worker's exit 1, and the file is left as it was."""
    if "/proc/" in env.get("AGENT_RUNTIME_DATA_DIR", "") and sys.platform != "linux":
        pytest.skip("/proc is Linux's")
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "runtime.db").write_bytes(bytes(range(256)) * 32)
    (tmp_path / "tmp").mkdir()
    places = {"TEXT": str(text), "GARBAGE": str(tmp_path / "garbage"), "TMP": str(tmp_path / "tmp")}
    for placeholder, place in places.items():
        env = {name: value.replace(placeholder, place) for name, value in env.items()}
    args = (command, "--port", "0") if command == "serve" else (command,)
    done = agent_runtime(tmp_path, *args, **env)
    assert_one_line_refusal(done, *env, says)
    assert "Errno" not in done.stderr
    assert text.read_text() == "not a database\n" * 100


@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        ("DEMO_DB_PATH", lambda path: path.write_text("notes\n"), "not a SQLite database"),
        ("DEMO_DB_PATH", lambda path: _customers(path), "customers"),
        ("DEMO_DB_PATH", lambda path: path.mkdir(), "is not a file"),
        ("DATA_DIR", lambda path: _customers(path), "customers"),  # its retail.db
    ],
)
def test_a_demo_database_path_holding_something_else_is_refused_and_kept(
    tmp_path: Path, name: str, make: Callable[[Path], object], says: str
) -> None:
    """The demo's generator replaced whatever was there that was not a complete demo
    database: someone's SQLite database, a text file."""
    data = tmp_path / "elsewhere"
    data.mkdir()
    path = data / "retail.db"
    make(path)
    before = path.read_bytes() if path.is_file() else None
    setting = str(path) if name == "DEMO_DB_PATH" else str(data)
    done = agent_runtime(tmp_path, "worker", **{f"AGENT_RUNTIME_{name}": setting})
    assert_one_line_refusal(done, f"AGENT_RUNTIME_{name}", str(path), says)
    assert (path.read_bytes() if path.is_file() else None) == before


def test_a_complete_demo_database_is_used_as_it_is(tmp_path: Path) -> None:
    """…while one that is complete is the demo's (its outbox kept): the start goes on."""
    path = tmp_path / "retail.db"
    generate(path)
    before = path.read_bytes()
    done = agent_runtime(
        tmp_path,
        "worker",
        AGENT_RUNTIME_DEMO_DB_PATH=str(path),
        AGENT_RUNTIME_DEFAULT_AGENT="nobody",  # refused only once the agents are loaded
    )
    assert_one_line_refusal(done, "AGENT_RUNTIME_DEFAULT_AGENT")
    assert path.read_bytes() == before


def _customers(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('Ada')")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("serve", "--port", "70000"), "--port"),  # uvloop bound it as port 4464
        (("worker", "--metrics-port", "-1"), "--metrics-port"),
        (("worker", "--concurrency", "0"), "--concurrency"),  # a worker driving nothing
        (("worker", "--concurrency", "100001"), "--concurrency"),  # past the setting's bound
    ],
)
def test_numbers_no_server_can_use_are_usage_errors(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    done = agent_runtime(tmp_path, *args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert f"error: argument {says}: must be between" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened


def test_a_port_already_taken_ends_serve_in_one_line_before_it_starts(tmp_path: Path) -> None:
    """Not uvicorn's exit 3 (the client commands' "parked") after the app had started,
    its worker claiming runs, only to stop."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = agent_runtime(tmp_path, "serve", "--port", str(port))
    assert_one_line_refusal(done, f"cannot listen on 127.0.0.1:{port}", "in use")


@pytest.fixture
def no_create_privilege(pg_base_url: str) -> Iterator[str]:
    """A fresh database and a role that may connect but create nothing in it (PostgreSQL
    15 grants no CREATE on ``public`` to everyone): the schema set-up is refused."""
    name = f"nocreate_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_base_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        admin.execute(f"CREATE ROLE {name} LOGIN")
    try:
        yield urlunsplit(
            urlsplit(pg_base_url)._replace(netloc=f"{name}@127.0.0.1:5432", path=f"/{name}")
        )
    finally:
        with psycopg.connect(pg_base_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            admin.execute(f"DROP ROLE {name}")


@pytest.mark.parametrize(
    "command",
    [("keys", "list"), ("prune", "--older-than", "1"), ("worker",), ("serve", "--port", "0")],
)
def test_a_database_that_refuses_the_schema_set_up_is_said_in_one_line(
    tmp_path: Path, no_create_privilege: str, command: tuple[str, ...]
) -> None:
    done = agent_runtime(tmp_path, *command, AGENT_RUNTIME_DATABASE_URL=no_create_privilege)
    assert_one_line_refusal(done, "the database refused", "permission denied")


def test_a_key_made_is_on_the_trail_though_its_token_could_not_be_written(
    tmp_path: Path,
) -> None:
    """Its output a closed pipe: the key was committed, the print failed, and the trail's
    entry, written after it, never was (a live admin key that no audit showed)."""
    proc = subprocess.Popen(
        [*CLI, "keys", "create", "--tenant", "t", "--user", "mallory", "--role", "admin"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENT_RUNTIME_")},
            "PYTHONPATH": str(ROOT),
            "AGENT_RUNTIME_DATA_DIR": str(tmp_path / "data"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # long before the token is printed (the imports take a while)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2 and "Traceback" not in err, err
    assert "could not be written" in err and "database" not in err, err

    async def trail() -> list[tuple[str, str]]:
        backend = await open_backend(f"sqlite:///{tmp_path / 'data' / 'runtime.db'}")
        try:
            keys = await backend.store.list_api_keys("t")
            entries, _ = await backend.store.page_audit("t", limit=10, cursor=None)
        finally:
            await backend.close()
        assert [k.user_id for k in keys] == ["mallory"]
        return [(e.action, e.subject) for e in entries]

    [(action, _)] = asyncio.run(trail())
    assert action == "key.create"


def test_the_version_names_the_schema_it_migrates_to(tmp_path: Path) -> None:
    from importlib.metadata import version

    from runtime.store.schema import MIGRATIONS

    done = agent_runtime(tmp_path, "--version")

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"agent-runtime {version('agent-runtime')}, schema {len(MIGRATIONS)}\n"


def test_a_search_path_naming_no_schema_that_exists_is_said_so(
    tmp_path: Path, pg_base_url: str
) -> None:
    """It said "null values cannot be formatted as an SQL identifier" (a probe)."""
    sep = "&" if "?" in pg_base_url else "?"
    url = f"{pg_base_url}{sep}options=-csearch_path%3Dno_such_schema_here"
    done = agent_runtime(tmp_path, "worker", AGENT_RUNTIME_DATABASE_URL=url)
    assert_one_line_refusal(done, "no schema on its search_path exists")
