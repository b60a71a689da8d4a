"""Which database errors a request answers 503 (retry) for, and which stay a 500; and
which, under a tool, are the runtime's store unavailable (runtime.dberrors.serving)."""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg.errors
import psycopg_pool
import pytest

from runtime.dberrors import unavailable


@pytest.mark.parametrize(
    ("exc", "passing"),
    [
        (psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.OperationalError("consuming input failed: EOF detected"), True),
        (
            psycopg.OperationalError(
                "sending query and params failed: number of parameters must be between 0 and 65535"
            ),
            False,
        ),
        (psycopg.errors.lookup("08006")(), True),  # connection failure
        (psycopg.errors.lookup("58030")(), True),  # I/O error
        (psycopg.errors.lookup("40P01")(), True),  # deadlock detected
        (psycopg.errors.lookup("53300")(), True),  # too many connections
        (psycopg.errors.lookup("57P01")(), True),  # admin shutdown
        (psycopg.errors.lookup("55P03")(), True),  # lock not available
        (psycopg.errors.lookup("54000")(), False),  # a limit: the same again on retry
        (psycopg.errors.lookup("55000")(), False),  # object not in prerequisite state
        (psycopg.errors.lookup("25006")(), True),  # read-only transaction: a failover's
        (psycopg.errors.lookup("23505")(), False),  # unique violation
        (ConnectionResetError("reset by peer"), True),
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("database or disk is full"), True),
        (sqlite3.OperationalError("unable to open database file"), True),
        (sqlite3.OperationalError("no such table: runz"), False),  # a bug, not a busy file
        (sqlite3.OperationalError('near "SELEC": syntax error'), False),
    ],
    ids=str,
)
def test_only_what_passes_is_unavailable(exc: Exception, passing: bool) -> None:
    assert unavailable(exc) is passing
