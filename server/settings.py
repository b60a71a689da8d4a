"""Server settings, from environment variables prefixed ``AGENT_RUNTIME_``."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.budget import Maxima
from runtime.model import MOST_CALLS, MOST_COST_USD, MOST_STEPS, MOST_TIMEOUT_S, MOST_TOKENS

MOST_CONCURRENCY = 100_000
"""The most runs one process may drive at once (the setting, and `worker --concurrency`)."""
PREFIX = "AGENT_RUNTIME_"


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (some span several), or its class's name."""
    return " ".join(str(exc).split()) or type(exc).__name__


def os_error(exc: OSError) -> str:
    """``strerror: file`` without the errno (``[Errno 2] …`` tells a reader nothing)."""
    if isinstance(exc, FileExistsError) and exc.filename is not None:
        return f"{exc.filename} is not a directory"  # what a mkdir with exist_ok says
    if exc.strerror is None:
        return one_line(exc)
    named = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    return f"{exc.strerror}: {named}" if named else exc.strerror


def refused(setting: str, why: str | BaseException) -> ValueError:
    """A start refused over ``setting`` (a field name, or the variable's own): one line
    that names the variable."""
    name = setting if setting.startswith(PREFIX) else PREFIX + setting.upper()
    return ValueError(f"{name}: {why if isinstance(why, str) else one_line(why)}")


class Settings(BaseSettings):
    # No inf or NaN anywhere: an infinite lease is never taken over, an infinite ceiling
    # cannot be written into a run (JSON has no Infinity); every number has a bound.
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="ignore", allow_inf_nan=False, env_ignore_empty=True
    )

    data_dir: Path = Path(".agent-runtime")
    """Embedded default: where the SQLite file, artifacts and the demo database live."""
    database_url: str | None = None
    """sqlite:///path/file.db or postgresql://…; default sqlite:///<data_dir>/runtime.db."""
    demo_db_path: Path | None = None
    """The retail demo's own database (its 'real system'); default <data_dir>/retail.db."""
    default_agent: str = "retail_analyst"
    planner_model: str | None = None
    """The demo agent's planner: a chat model for ``init_chat_model`` (e.g.
    ``openai:gpt-4o-mini``; needs the ``llm`` extra); unset: the deterministic planner."""
    planner_usd_per_million_tokens: float = Field(default=0.0, ge=0, le=1_000_000)
    """What the planner model's tokens cost, in US dollars a million (input and output
    alike): what runs' ``max_cost_usd`` budgets count. 0: its calls count no cost."""
    extra_agents: list[str] = Field(default_factory=list)
    """Import paths ``module:function`` (``module`` alone: its ``build_agents``), each
    called with these Settings and returning more AgentSpecs, e.g. from a plugin."""
    max_body_bytes: int = Field(default=256 * 1024, ge=1, le=1 << 30)
    """Request bodies past this get 413, whether sent with Content-Length or chunked."""
    max_json_depth: int = Field(default=32, ge=1, le=200)
    """Request JSON nested deeper than this gets 422 before anything parses it."""
    max_active_runs_per_tenant: int = Field(default=100, ge=1, le=10_000_000)
    """Runs pending, planning or executing at once per tenant; past it POST /runs is 429.
    Runs parked waiting for a human do not count: they hold no worker."""
    max_streams_per_principal: int = Field(default=10, ge=1, le=1_000_000)
    """Open SSE streams (and `Prefer: wait` requests) per caller and server process;
    past it 429."""
    max_wait_s: int = Field(default=60, ge=0, le=3600)
    """The longest `POST /runs` or `GET /runs/{id}` holds a `Prefer: wait=N` request."""
    bootstrap_local_keys: bool | None = None
    """With no API key in the store, create a local admin and approver key on start.
    Unset: only on the embedded default (no database_url), never on a shared database."""
    jwt_hs256_secret: SecretStr | None = None
    """Accept HS256 JWTs signed with this secret (local use)."""
    jwt_public_key_file: Path | None = None
    """Accept RS256 JWTs verified with this PEM public key."""
    jwt_jwks_file: Path | None = None
    """Accept RS256 JWTs verified with the keys of this JWKS file (by ``kid``)."""
    jwt_issuer: str | None = None
    """If set, a JWT's ``iss`` must equal it."""
    jwt_audience: str | None = None
    """If set, a JWT's ``aud`` must contain it."""
    # A run's budget ceilings (a request may ask for less): none can be zero, or no run
    # would get anywhere.
    max_steps: int = Field(default=50, ge=1, le=MOST_STEPS)
    max_llm_calls: int = Field(default=100, ge=1, le=MOST_CALLS)
    max_tool_calls: int = Field(default=200, ge=1, le=MOST_CALLS)
    max_tokens: int = Field(default=2_000_000, ge=1, le=MOST_TOKENS)
    max_cost_usd: float = Field(default=50.0, gt=0, le=MOST_COST_USD)
    max_timeout_s: float = Field(default=3600.0, gt=0, le=MOST_TIMEOUT_S)
    sse_keepalive_s: float = Field(default=15.0, ge=0.1, le=3600)
    """An idle event stream sends a comment this often; at the same pace an open stream
    checks its caller's credential again and ends once it no longer holds."""
    lease_seconds: float = Field(default=30.0, ge=1.0, le=86_400)
    """How long a worker's claim on a run lasts without a heartbeat (renewed every third)."""
    max_drive_failures: int = Field(default=5, ge=1, le=1000)
    """Drives of a run in a row that may end on a database error (a checkpoint that
    cannot be written) before the run fails with CHECKPOINT_ERROR."""
    max_takeovers: int = Field(default=3, ge=1, le=1000)
    """Takeovers of a run in a row (its worker died or stalled past the lease, and no
    step was checkpointed since the last) at which it is driven by a worker alone;
    killing that one too, it fails with RUN_CRASH_LOOP."""
    drive_retry_seconds: float = Field(default=1.0, ge=0.01, le=3600)
    """The wait before driving such a run again; doubled after each further failure, up
    to a minute."""
    worker_concurrency: int = Field(default=8, ge=1, le=MOST_CONCURRENCY)
    """Runs one process drives at once."""
    db_pool_size: int = Field(default=10, ge=2, le=1000)
    """PostgreSQL connections one process keeps at most (run store, checkpointer and
    memory share them; each statement holds one only while it runs). At least 2: schema
    set-up holds an advisory lock on one while it migrates on another. The LISTEN
    connection for cross-process events comes on top."""
    shutdown_grace_s: float = Field(default=10.0, ge=0, le=86_400)
    """On SIGTERM: how long current drives may finish before they are handed back."""
    retention_days: float | None = Field(default=None, gt=0, le=365_000)
    """Keep runs that ended (succeeded or failed) this many days, then delete them with
    their events, ledger, checkpoints and the artifacts no other run names; each
    worker prunes every ``retention_interval_s``. Unset: kept forever (``agent-runtime
    prune`` deletes on demand)."""
    retention_interval_s: float = Field(default=3600.0, ge=1.0, le=365 * 86_400)
    """How often a worker prunes (at least a second: a pace of microseconds kept a
    process busy doing nothing, 95 % of a core)."""
    metrics_token: SecretStr | None = None
    """Serve GET /metrics (Prometheus) to a scraper presenting this bearer token; unset,
    /metrics is 404. Not an API key: it reads counts across tenants, nothing else."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, url: str | None) -> str | None:
        # Checked here, not when the store opens: inside uvicorn's start that would be
        # a traceback, not a one-line refusal.
        if url is not None and not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError("must be sqlite:///<path> or postgresql://…")
        return url

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'runtime.db'}"

    @cached_property
    def resolved_demo_db(self) -> Path:
        return self.demo_db_path or self.data_dir / "retail.db"

    @property
    def database_setting(self) -> str:
        """The variable that put the database where it is."""
        return "database_url" if self.database_url else "data_dir"

    @property
    def demo_db_setting(self) -> str:
        """The variable that put the demo's database where it is."""
        return "demo_db_path" if self.demo_db_path else "data_dir"

    @property
    def bootstraps_local_keys(self) -> bool:
        if self.bootstrap_local_keys is None:
            return self.database_url is None
        return self.bootstrap_local_keys

    def maxima(self) -> Maxima:
        return Maxima(
            max_steps=self.max_steps,
            max_llm_calls=self.max_llm_calls,
            max_tool_calls=self.max_tool_calls,
            max_tokens=self.max_tokens,
            max_cost_usd=self.max_cost_usd,
            timeout_s=self.max_timeout_s,
        )
