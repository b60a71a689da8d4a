"""GET /metrics: Prometheus' text format, for a scraper holding the metrics token."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from runtime.metrics import Metrics
from server.api.routes import probes
from tests.api.conftest import Api, make_settings, open_api
from tests.api.helpers import parked_demo_run, problem
from tests.auth import bearer

TOKEN = "scrape-me-0123456789abcdef"
SCRAPER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def scraped(database_url: str, data_dir: Path) -> AsyncIterator[Api]:
    async with open_api(make_settings(database_url, data_dir, metrics_token=TOKEN)) as opened:
        yield opened


def sample(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^agent_runtime_{name}{re.escape(labels)} (\S+)$", text, re.M)
    assert found, (name, labels, text)
    return float(found.group(1))


async def test_counts_what_the_process_did_and_what_waits(scraped: Api) -> None:
    before = (await scraped.client.get("/metrics", headers=SCRAPER)).text
    assert sample(before, "runs", '{state="waiting_human"}') == 0
    run_id, _, _ = await parked_demo_run(scraped)
    await scraped.engine.wait_settled(run_id)  # its drive is over

    resp = await scraped.client.get("/metrics", headers=SCRAPER)

    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert "# TYPE agent_runtime_drives_started_total counter" in text
    assert sample(text, "drives_started_total") >= 1
    assert sample(text, "drives_ended_total", '{how="stopped"}') >= 1
    assert sample(text, "runs", '{state="waiting_human"}') == 1
    assert sample(text, "runs", '{state="pending"}') == 0
    assert sample(text, "drives_in_flight") == 0


async def test_needs_the_metrics_token(scraped: Api) -> None:
    # No token, or not the metrics token: nothing read.
    problem(await scraped.client.get("/metrics"), 401, "UNAUTHENTICATED")
    wrong = {"Authorization": "Bearer not-the-token"}
    problem(await scraped.client.get("/metrics", headers=wrong), 401, "UNAUTHENTICATED")


async def test_two_authorization_headers_are_refused_in_either_order(scraped: Api) -> None:
    """As on every other endpoint: a proxy that reads the last header sees another caller
    (the first used to be read alone, the right token first let the request in)."""
    right, wrong = SCRAPER["Authorization"], "Bearer not-the-token"
    for first, second in ((right, wrong), (wrong, right)):
        headers = [("Authorization", first), ("Authorization", second)]
        resp = await scraped.client.get("/metrics", headers=headers)
        problem(resp, 401, "UNAUTHENTICATED")
        assert "one Authorization header" in resp.json()["detail"]


async def test_a_schema_error_is_logged_as_one_not_as_an_outage(
    scraped: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A migration that did not run is a bug to see (an error with its traceback), not an
    outage to wait out (a warning); the counters are served all the same."""

    async def count_live_runs() -> dict[str, int]:
        raise psycopg.errors.UndefinedTable('relation "runs" does not exist')

    monkeypatch.setattr(scraped.engine_services.store, "count_live_runs", count_live_runs)
    with caplog.at_level(logging.WARNING, logger="server.api.routes.probes"):
        resp = await scraped.client.get("/metrics", headers=SCRAPER)

    assert resp.status_code == 200 and sample(resp.text, "database_up") == 0
    [record] = [r for r in caplog.records if r.name == "server.api.routes.probes"]
    assert record.levelno == logging.ERROR and record.exc_info is not None


@pytest.mark.parametrize("outage", ["refused", "hangs"])
async def test_an_outage_costs_the_scrape_only_the_runs_counts(
    scraped: Api, monkeypatch: pytest.MonkeyPatch, outage: str
) -> None:
    """The process's own counters are what an alert on failing drives reads, and a
    database away is when it needs them: they were a 503 (after 30 s, when it hung)."""
    monkeypatch.setattr(probes, "COUNT_WITHIN_S", 0.2)

    async def count_live_runs() -> dict[str, int]:
        if outage == "refused":
            raise psycopg.OperationalError("connection refused")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    up = (await scraped.client.get("/metrics", headers=SCRAPER)).text
    assert sample(up, "database_up") == 1 and "agent_runtime_runs{" in up
    monkeypatch.setattr(scraped.engine_services.store, "count_live_runs", count_live_runs)
    resp = await scraped.client.get("/metrics", headers=SCRAPER, timeout=10)

    assert resp.status_code == 200
    assert sample(resp.text, "database_up") == 0
    assert sample(resp.text, "drives_ended_total", '{how="stopped"}') >= 0
    assert sample(resp.text, "drives_in_flight") == 0
    assert "agent_runtime_runs{" not in resp.text


async def test_off_unless_a_token_is_set(api: Api) -> None:
    problem(await api.client.get("/metrics", headers=SCRAPER), 404, "NOT_FOUND")


async def test_an_admin_principal_is_not_a_scraper(scraped: Api) -> None:
    admin = bearer(user="u-adm", roles=["admin", "approver"])
    problem(await scraped.client.get("/metrics", headers=admin), 401, "UNAUTHENTICATED")


def test_large_counts_print_exactly() -> None:
    metrics = Metrics()
    metrics.counts[("drives_started_total", ())] = 12_345_678
    text = metrics.render({"runs": [({"state": 'we"ird\n'}, 2.5)]})
    assert "agent_runtime_drives_started_total 12345678\n" in text
    assert 'agent_runtime_runs{state="we\\"ird\\n"} 2.5\n' in text


async def test_an_empty_token_setting_is_off(database_url: str, data_dir: Path) -> None:
    async with open_api(make_settings(database_url, data_dir, metrics_token="")) as opened:
        resp = await opened.client.get("/metrics", headers={"Authorization": ""})
        problem(resp, 404, "NOT_FOUND")


def test_every_way_a_drive_ends_is_a_series_from_zero() -> None:
    text = Metrics().render({})
    ends = ("stopped", "cancelled", "handed_back", "lease_lost", "db_error", "crash_loop", "failed")
    for how in ends:
        assert f'agent_runtime_drives_ended_total{{how="{how}"}} 0\n' in text
    assert "agent_runtime_drives_ended_total 0" not in text  # no unlabelled series
