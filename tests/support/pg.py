"""PostgreSQL for the tests: the machine's server (127.0.0.1:5432, database test, user postgres,
trust auth; CROSSBAR_TEST_PG overrides the URL), a fresh schema per test. Where no server
answers the tests skip with that reason, except under CI=true, where they fail."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest

PG_URL = os.environ.get("CROSSBAR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI") == "true"


def unavailable() -> str | None:
    """Why PostgreSQL cannot be used here, or None."""
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        return f"no PostgreSQL at {PG_URL} ({e.__class__.__name__}: {str(e).strip()[:120]})"
    return None


def need_postgres() -> None:
    """Skip the calling test without PostgreSQL (fail under CI=true)."""
    why = unavailable()
    if why is not None:
        if IN_CI:
            pytest.fail(f"CI=true and PostgreSQL is needed: {why}", pytrace=False)
        pytest.skip(why)


@contextmanager
def pg_schema() -> Iterator[str]:
    """A store URL whose tables live in a schema of their own, dropped afterwards."""
    import psycopg

    name = f"cb_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    joiner = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{joiner}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")
