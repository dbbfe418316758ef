"""Fixtures shared by the test stories."""

import pytest
import pytest_twisted

from tests.support.lease_fakes import open_store
from tests.support.pg import need_postgres, pg_schema


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request):
    """A fresh, empty store: SQLite in memory, and PostgreSQL in a schema of its own."""
    if request.param == "sqlite":
        yield ":memory:"
        return
    need_postgres()
    with pg_schema() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request, tmp_path):
    """A fresh store several Store objects (instances) can open: an SQLite file, and
    PostgreSQL in a schema of its own."""
    if request.param == "sqlite":
        yield str(tmp_path / "shared.db")
        return
    need_postgres()
    with pg_schema() as url:
        yield url


@pytest_twisted.async_yield_fixture
async def store(store_url):
    """A real Store on a fresh database of each kind, closed after the test."""
    s = await open_store(store_url)
    yield s
    await s.close()


@pytest_twisted.async_yield_fixture
async def sqlite_store():
    """A real Store on a fresh SQLite database in memory (for what only SQLite does)."""
    s = await open_store(":memory:")
    yield s
    await s.close()
