"""Logging for the server and worker processes."""

from __future__ import annotations

import logging

SQL_PARAMETER_LOGGERS = ("aiosqlite",)
"""Libraries whose DEBUG lines print SQL parameters: tool args, secret ones included."""


def quiet_sql_parameters() -> None:
    for name in SQL_PARAMETER_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)


def configure(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    quiet_sql_parameters()
