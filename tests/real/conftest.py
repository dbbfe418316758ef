"""Fixtures for the tests against real llama-servers, and when those tests may skip.

They run when LLAMA_SERVER and LLAMA_MODEL name the binary and a GGUF file (`make real` builds
both; the Makefile exports them from its cache). Elsewhere they skip, except under CI=true,
where a missing binary fails every one of them: CI must never pass without having run them.
"""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import pytest_twisted

from tests.real.llamas import IN_CI, Fleet, Llama, missing, server_args
from tests.support.harness import MODEL, Crossbar, start_crossbar, wait

# The last resort against a hang: every wait in these tests is bounded well below this, and the
# thread method ends the whole run (with every thread's stack) where a signal could not reach
# a test blocked in the reactor. llama-servers die with the run (setpriv --pdeathsig).
HARD_TIMEOUT = 300

Launch = Callable[..., Awaitable[tuple[Crossbar, Fleet]]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder: the hard timeout, then skip or fail without a binary."""
    here = pathlib.Path(__file__).parent
    why = missing()
    for item in items:
        if here not in item.path.parents:
            continue
        item.add_marker(pytest.mark.timeout(HARD_TIMEOUT, method="thread"))
        if why is not None and not IN_CI:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Under CI=true a real test that skips, for whatever reason, is reported as failed."""
    report = yield
    here = pathlib.Path(__file__).parent
    if IN_CI and report.skipped and here in item.path.parents:
        report.outcome = "failed"
        report.longrepr = f"CI=true and this real test skipped: {report.longrepr}"
    return report


@pytest.fixture(autouse=True)
def _binaries() -> None:
    """Under CI=true a missing llama-server is a failure, never a skip."""
    if (why := missing()) is not None and IN_CI:
        pytest.fail(f"CI=true and the real tests cannot run: {why}", pytrace=False)


@pytest_twisted.async_yield_fixture
async def launch(tmp_path: pathlib.Path):
    """`await launch(ctx=4096, parallel=2, server={...}, route={...}, llama_args=(...))`: two
    real llama-servers,
    titan and atlas, and crossbar in front of them on one route, convo (`route` adds keys). Everything stops after the test;
    a server that died without the test killing it fails the teardown with its last lines."""
    started: list[tuple[Crossbar | None, Fleet]] = []

    async def start(
        ctx: int = 4096,
        parallel: int = 2,
        server: dict[str, Any] | None = None,
        route: dict[str, Any] | None = None,
        llama_args: tuple[str, ...] = (),
    ) -> tuple[Crossbar, Fleet]:
        args = [*server_args(ctx, parallel), *llama_args]
        fleet = Fleet({name: Llama.start(name, tmp_path, args) for name in ("titan", "atlas")})
        started.append((None, fleet))
        await fleet.ready()
        hosts = {
            name: {"url": llama.url, "models": [MODEL]} for name, llama in fleet.llamas.items()
        }
        convo = {"hosts": ["titan", "atlas"], "default_model": MODEL, **(route or {})}
        crossbar = await start_crossbar({}, {"convo": convo}, server=server, hosts=hosts)
        started[-1] = (crossbar, fleet)
        # Discovery as at start-up: each host's slots and per-slot ctx from its /props.
        await fleet.within(crossbar.parts.hosts.probe_all(), 30, "probing the hosts")
        return crossbar, fleet

    yield start
    deaths = []
    for crossbar, fleet in started:
        try:
            if crossbar is not None:
                await wait(crossbar.stop(), 30)
        finally:
            deaths += fleet.stop()
    assert not deaths, "\n".join(deaths)
