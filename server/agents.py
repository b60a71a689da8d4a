"""Which agents a server hosts: the demo agent plus any configured ``module:function``.

Anything that keeps an agent from loading raises a ``ValueError`` of one line naming
the setting (and the ``module:function``): the CLI refuses the start with it.
"""

from __future__ import annotations

import importlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping

from runtime.agent import AgentSpec
from server.settings import Settings, one_line, os_error, refused

log = logging.getLogger(__name__)

DEFAULT_FACTORY = "build_agents"
"""The function of an extra agents' module whose entry names none (``module``)."""


def load_agents(settings: Settings) -> dict[str, AgentSpec]:
    from graphs import report_writer
    from graphs.chat_planner import PlannerModelError
    from graphs.retail_analyst import build_agent
    from tools.retail import generate
    from tools.retail.data import NotTheDemoDatabase

    agents: dict[str, AgentSpec] = {}
    sources: dict[str, str] = {}

    def add(spec: AgentSpec, source: str) -> None:
        if spec.agent_id in agents:
            other = sources[spec.agent_id]
            also = " twice" if other == source else f", as {other} does"
            raise refused(
                "extra_agents",
                f"{source} returns agent {spec.agent_id!r}{also}: agent ids must be unique",
            )
        agents[spec.agent_id] = spec
        sources[spec.agent_id] = source

    demo_db = settings.resolved_demo_db
    try:
        generate(demo_db)  # (build_agent's own call then finds it complete)
    except NotTheDemoDatabase as exc:
        raise refused(settings.demo_db_setting, exc) from exc
    except OSError as exc:  # a directory that cannot be made, not writable…
        raise refused(settings.demo_db_setting, f"{demo_db}: {os_error(exc)}") from exc
    except sqlite3.Error as exc:
        raise refused(settings.demo_db_setting, f"{demo_db}: {one_line(exc)}") from exc
    try:
        demo = build_agent(
            demo_db,
            planner_model=settings.planner_model,
            usd_per_million_tokens=settings.planner_usd_per_million_tokens,
        )
    except PlannerModelError as exc:
        raise refused("planner_model", exc) from exc
    add(demo, "the demo")
    if settings.planner_model and not settings.planner_usd_per_million_tokens:
        log.warning(
            "the planner model's tokens have no price (AGENT_RUNTIME_PLANNER_USD_PER_"
            "MILLION_TOKENS): runs' max_cost_usd budgets count no cost for its calls"
        )
    # The agent the demo hands its reports to, runnable on its own too.
    add(report_writer.build_agent(demo.tools), "the demo")
    for path in settings.extra_agents:
        for spec in _extra_agents(path, settings):
            add(spec, repr(path))
    return agents


def _extra_agents(path: str, settings: Settings) -> list[AgentSpec]:
    """The agents ``module:function`` returns, called with the settings."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # whatever its code raises as it runs: SyntaxError, NameError…
        raise refused("extra_agents", f"cannot import {path!r}: {_named(exc)}") from exc
    factory: Callable[[Settings], Iterable[AgentSpec]] | None = getattr(
        module, attr or DEFAULT_FACTORY, None
    )
    if not callable(factory):
        raise refused(
            "extra_agents", f"{path!r}: {module_name} has no function {attr or DEFAULT_FACTORY}"
        )
    failed = f"{path!r} (called with the Settings, returning AgentSpecs) failed"
    try:
        returned = factory(settings)
    except Exception as exc:
        raise refused("extra_agents", f"{failed}: {_named(exc)}") from exc
    if not isinstance(returned, Iterable) or isinstance(returned, str | bytes | Mapping):
        raise refused(
            "extra_agents", f"{path!r} returned {_kind(returned)}, not a list of AgentSpecs"
        )
    try:
        specs = list(returned)  # a generator's code runs only now
    except Exception as exc:
        raise refused("extra_agents", f"{failed}: {_named(exc)}") from exc
    for spec in specs:
        if not isinstance(spec, AgentSpec):
            raise refused(
                "extra_agents",
                f"{path!r} returned {_kind(spec)} among its agents, not an AgentSpec",
            )
    return specs


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"


def _kind(value: object) -> str:
    return "None" if value is None else f"an object of type {type(value).__name__}"
