"""Fixtures shared by the test stories."""

import pytest_twisted
from lease_fakes import open_store


@pytest_twisted.async_yield_fixture
async def store():
    """A real Store on a fresh in-memory database, closed after the test."""
    s = await open_store()
    yield s
    await s.close()
