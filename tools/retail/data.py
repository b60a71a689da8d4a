"""The retail demo database: eight weeks of daily sales with one real decline in it.

The east region loses most of three SKUs' sales in the last full week while
everything else stays flat within noise, so the agent has a true answer to find.
Generation is seeded and idempotent, and the file appears atomically.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

SEED = 20261116
SCHEMA_VERSION = "1"
LAST_WEEK_START = date(2026, 11, 16)
"""Monday of the last full week in the data."""
WEEKS = 8
FIRST_DAY = LAST_WEEK_START - timedelta(weeks=WEEKS - 1)
LAST_DAY = LAST_WEEK_START + timedelta(days=6)
BUSY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Region:
    region_id: str
    name: str
    name_zh: str


REGIONS: tuple[Region, ...] = (
    Region("east", "East", "华东"),
    Region("north", "North", "华北"),
    Region("south", "South", "华南"),
    Region("west", "West", "华西"),
)
REGION_IDS: tuple[str, ...] = tuple(r.region_id for r in REGIONS)
STORES_PER_REGION = 3

# (sku, name, category, unit price). Fixed rather than drawn so that the
# declining SKUs are mid-to-high sellers whose drop cannot be drowned by noise.
CATALOG: tuple[tuple[str, str, str, float], ...] = (
    ("SKU-1001", "Whole Milk 1L", "dairy", 12.5),
    ("SKU-1002", "Greek Yogurt 500g", "dairy", 18.0),
    ("SKU-1003", "Oat Milk 1L", "dairy", 22.0),
    ("SKU-1004", "Cheddar Slices 200g", "dairy", 26.0),
    ("SKU-1005", "Sourdough Loaf", "bakery", 16.0),
    ("SKU-1006", "Croissant 4-pack", "bakery", 19.5),
    ("SKU-1007", "Jasmine Rice 5kg", "pantry", 45.0),
    ("SKU-1008", "Extra Virgin Olive Oil 1L", "pantry", 68.0),
    ("SKU-1009", "Soy Sauce 500ml", "pantry", 9.9),
    ("SKU-1010", "Instant Noodles 5-pack", "pantry", 14.5),
    ("SKU-1011", "Orange Juice 1L", "beverages", 15.0),
    ("SKU-1012", "Sparkling Water 12-pack", "beverages", 39.0),
    ("SKU-1013", "Green Tea 24-pack", "beverages", 29.0),
    ("SKU-1014", "Cold Brew Coffee 6-pack", "beverages", 55.0),
    ("SKU-1015", "Potato Chips 150g", "snacks", 8.5),
    ("SKU-1016", "Dark Chocolate 100g", "snacks", 12.0),
    ("SKU-1017", "Mixed Nuts 300g", "snacks", 35.0),
    ("SKU-1018", "Laundry Detergent 2L", "household", 49.0),
    ("SKU-1019", "Paper Towels 6-roll", "household", 24.0),
    ("SKU-1020", "Dish Soap 750ml", "household", 13.0),
)

DECLINE_REGION = "east"
# Share of normal sales left in the decline week: drops of 55%, 45% and 38%.
DECLINE_FACTORS: dict[str, float] = {"SKU-1008": 0.45, "SKU-1014": 0.55, "SKU-1003": 0.62}
WEEKEND_FACTOR = 1.3
DAILY_NOISE = 0.08

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE regions (
    region_id TEXT PRIMARY KEY, name TEXT NOT NULL, name_zh TEXT NOT NULL
);
CREATE TABLE stores (
    store_id TEXT PRIMARY KEY,
    region_id TEXT NOT NULL REFERENCES regions(region_id),
    name TEXT NOT NULL
);
CREATE TABLE skus (
    sku TEXT PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, unit_price REAL NOT NULL
);
CREATE TABLE daily_sales (
    date TEXT NOT NULL,
    store_id TEXT NOT NULL REFERENCES stores(store_id),
    sku TEXT NOT NULL REFERENCES skus(sku),
    units INTEGER NOT NULL,
    revenue REAL NOT NULL,
    PRIMARY KEY (date, store_id, sku)
);
CREATE INDEX daily_sales_store_date ON daily_sales (store_id, date);
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT UNIQUE NOT NULL,
    channel TEXT NOT NULL,
    recipients TEXT NOT NULL,
    subject TEXT NOT NULL,
    body_ref TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'retracted')),
    created_at TEXT NOT NULL
);
"""


def open_db(path: Path) -> sqlite3.Connection:
    """A fresh connection per call: sqlite3 connections must not cross threads.

    Opened read-write but never create, so a missing database is an error
    rather than a new empty file that would later pass for the real one.
    """
    conn = sqlite3.connect(
        f"{Path(path).resolve().as_uri()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S
    )
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


@contextlib.contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection that commits on success, rolls back on error and always closes."""
    conn = open_db(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def is_complete(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        # Read-write, not read-only: a read-only reader of a WAL database cannot
        # remove the -wal and -shm files it creates, and would leave them behind.
        conn = open_db(path)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'complete'").fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False
    return row is not None and row[0] == SCHEMA_VERSION


DEMO_TABLES = frozenset(
    {"meta", "regions", "stores", "skus", "daily_sales", "outbox", "sqlite_sequence"}
)
"""The tables of a demo database (``sqlite_sequence``: SQLite's, for the outbox's ids)."""


class NotTheDemoDatabase(ValueError):
    """A file is where the demo database goes, and it is not one: kept, never replaced."""


def check_replaceable(path: Path) -> None:
    """Raise :class:`NotTheDemoDatabase` unless what is at ``path`` may be replaced by a
    new demo database: nothing, an empty file, or a demo database left incomplete (its
    tables, ``meta`` first of them, without ``complete``; or of another schema version).
    Anything else may be someone's data: a text file, another SQLite database."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_file():
        raise NotTheDemoDatabase(f"{path} is not a file")
    if path.stat().st_size == 0:
        return  # SQLite's empty database: nothing in it to lose
    try:
        conn = open_db(path)
        try:
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            raise NotTheDemoDatabase(
                f"{path} is not the demo's database (not a SQLite database): "
                "it is kept, not replaced"
            ) from exc
        raise NotTheDemoDatabase(f"{path} cannot be read: {exc}") from exc
    # SQLite's own tables (sqlite_stat1 after an ANALYZE, …) hold nobody's data.
    others = sorted(t for t in tables - DEMO_TABLES if not t.startswith("sqlite_"))
    if others or (tables and "meta" not in tables):
        which = f"tables not the demo's: {', '.join(others)}" if others else "no meta table"
        raise NotTheDemoDatabase(
            f"{path} is not the demo's database ({which}): it is kept, not replaced"
        )


def _store_ids(region_id: str) -> list[str]:
    return [f"{region_id}-{n:02d}" for n in range(1, STORES_PER_REGION + 1)]


def _sales_rows() -> Iterator[tuple[str, str, str, int, float]]:
    rng = random.Random(SEED)
    # Every random draw happens in a fixed order, so the same seed gives the same data.
    base = {
        (store, sku): rng.uniform(20.0, 45.0)
        for region in REGIONS
        for store in _store_ids(region.region_id)
        for sku, *_ in CATALOG
    }
    day = FIRST_DAY
    while day <= LAST_DAY:
        weekday = WEEKEND_FACTOR if day.weekday() >= 5 else 1.0
        in_decline_week = day >= LAST_WEEK_START
        for region in REGIONS:
            for store in _store_ids(region.region_id):
                for sku, _name, _category, price in CATALOG:
                    factor = weekday * rng.uniform(1 - DAILY_NOISE, 1 + DAILY_NOISE)
                    if in_decline_week and region.region_id == DECLINE_REGION:
                        factor *= DECLINE_FACTORS.get(sku, 1.0)
                    units = max(0, round(base[(store, sku)] * factor))
                    yield day.isoformat(), store, sku, units, round(units * price, 2)
        day += timedelta(days=1)


def _populate(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    conn.executemany(
        "INSERT INTO regions (region_id, name, name_zh) VALUES (?, ?, ?)",
        [(r.region_id, r.name, r.name_zh) for r in REGIONS],
    )
    conn.executemany(
        "INSERT INTO stores (store_id, region_id, name) VALUES (?, ?, ?)",
        [
            (store, r.region_id, f"{r.name} Store {store[-2:]}")
            for r in REGIONS
            for store in _store_ids(r.region_id)
        ],
    )
    conn.executemany(
        "INSERT INTO skus (sku, name, category, unit_price) VALUES (?, ?, ?, ?)", CATALOG
    )
    conn.executemany(
        "INSERT INTO daily_sales (date, store_id, sku, units, revenue) VALUES (?, ?, ?, ?, ?)",
        _sales_rows(),
    )
    conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [
            ("seed", str(SEED)),
            ("last_week_start", LAST_WEEK_START.isoformat()),
            ("complete", SCHEMA_VERSION),
        ],
    )


def generate(path: Path) -> None:
    """Create the demo database at ``path`` unless a complete one is there already.

    Replaces only what :func:`check_replaceable` allows: a file that is not a demo
    database raises :class:`NotTheDemoDatabase` and stays as it is."""
    path = Path(path)
    if is_complete(path):
        return
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp)
        try:
            with conn:
                _populate(conn)
            # WAL lets tool handlers read while a publish writes; the mode is
            # stored in the file, and closing checkpoints the log back into it.
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        # Another process may have finished first; keep its file (and its outbox).
        if is_complete(path):
            return
        check_replaceable(path)  # (whatever came there meanwhile)
        # Journal files left by an earlier, incomplete database must not be
        # replayed into the new one.
        for suffix in ("-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
