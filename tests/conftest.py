"""Fixtures shared by the test stories."""

import pytest
import pytest_twisted

from tests.support.admin_harness import start_service
from tests.support.fleet import start_fleet
from tests.support.harness import start_crossbar
from tests.support.lease_fakes import open_store
from tests.support.pg import need_postgres, pg_schema


def _stopping(start):
    """A fixture's factory: what `start` starts, stopped after the test (last first)."""

    @pytest_twisted.async_yield_fixture
    async def fixture():
        started = []

        async def starting(*args, **kwargs):
            running = await start(*args, **kwargs)
            started.append(running)
            return running

        yield starting
        for running in reversed(started):
            await running.stop()

    fixture.__doc__ = f"`await {start.__name__}(...)`, stopped (with its fakes) after the test."
    return fixture


launch = _stopping(start_crossbar)  # crossbar's sites on port 0 in front of fakes
serve = _stopping(start_service)  # the whole service from a config file, admin API included
fleets = _stopping(start_fleet)  # several instances on one store


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
