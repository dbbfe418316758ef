"""Microbenchmark the hot functions of the modules crossbar/build.py may compile, in whichever
build this process runs: run it twice and compare.

    .venv/bin/python bench/micro/compiled.py                    # the compiled build (make venv)
    CROSSBAR_PURE=1 .venv/bin/python bench/micro/compiled.py    # the same source, pure Python

Each line: the function, the build, and the best of 5 repeats in microseconds per call (a few
seconds in all; best-of, so another process on the machine matters little).
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.admin.metrics import Metrics
from crossbar.build import describe
from crossbar.config import RouteLimits
from crossbar.config.values import parse_config
from crossbar.hosts import Hosts
from crossbar.leases.journal import Journal
from crossbar.leases.memory import LeaseMemory
from crossbar.leases.table import Table
from crossbar.leases.types import Key, Lease, State
from crossbar.limiter.fairqueue import FairQueue
from crossbar.limiter.slots import Limiter, Release
from crossbar.limiter.types import Waiter
from crossbar.proxy.routing import choose_model, credentials, split_route
from crossbar.records import UsageRow
from crossbar.wire.headers import RawHeaders

MODEL = "qwen"
CONFIG = parse_config(
    {
        "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": [MODEL]}},
        "routes": {"convo": {"hosts": ["titan"], "default_model": MODEL}},
    }
)
ROUTE = CONFIG.route("convo")
assert ROUTE is not None
HEAD = [
    (b"Host", b"127.0.0.1:8080"),
    (b"Content-Type", b"application/json"),
    (b"Content-Length", b"1234"),
    (b"Authorization", b"Bearer sk-test"),
    (b"Accept", b"text/event-stream"),
    (b"User-Agent", b"OpenAI/Python 1.40.0"),
]


def headers() -> None:
    h = RawHeaders(HEAD)
    h.getRawHeaders(b"content-type")
    h.last("authorization")
    h.hasHeader(b"x-crossbar-route")
    h.removeHeader(b"authorization")
    list(h.pairs())


def routing() -> None:
    split_route(CONFIG, "/r/convo/v1/chat/completions", None)
    choose_model(ROUTE, [MODEL], {"model": MODEL, "messages": []}, "")
    credentials(RawHeaders(HEAD))


class _Healthy:
    def healthy(self, name: str) -> bool:
        return True

    def draining(self, name: str) -> bool:
        return False


MEMORY = LeaseMemory()
KEYS = [Key("convo", f"{i:016x}", MODEL) for i in range(1000)]
MEMORY.load([Lease(k, "titan", State.ACTIVE, 0.0, 0.0) for k in KEYS])
HEALTHY = _Healthy()


def lease_lookup() -> None:
    for key in KEYS[:10]:
        MEMORY.reused_at_once(key, ("titan",), 1.0, HEALTHY, 60.0)


class _FirstHost:
    def choose(self, candidates: list[str], model: str, **_: object) -> str:
        return candidates[0]


TABLE = Table(Journal(None, Clock()), HEALTHY, _FirstHost(), 3600.0)  # type: ignore[arg-type]
TABLE.memory.load([Lease(k, "titan", State.ACTIVE, 0.0, 0.0) for k in KEYS])
NEW_KEY = Key("convo", "f" * 16, MODEL)


def table_peek() -> None:
    for key in KEYS[:10]:
        TABLE.peek(key, ("titan", "atlas"))
    TABLE.peek(NEW_KEY, ("titan", "atlas"))


LIMITER = Limiter(Clock(), lambda host, model: 1, queue_max=100, queue_timeout=60.0)
LIMITS = [RouteLimits(name, weight=w) for name, w in (("convo", 1.0), ("batch", 2.0))]


def _fired(d: Deferred[Release]) -> Release:
    got: list[Release] = []
    d.addCallback(got.append)
    return got[0]


def limiter_cycle() -> None:
    first = _fired(LIMITER.acquire("titan", MODEL, LIMITS[0]))
    admitted: list[Release] = []
    for i in range(4):
        LIMITER.acquire("titan", MODEL, LIMITS[i % 2]).addCallback(admitted.append)
    first()
    while admitted:  # each release admits the next waiter
        admitted.pop()()
    assert LIMITER.in_flight("titan", MODEL) == 0


QUEUE: FairQueue[Waiter] = FairQueue(lambda name: LIMITS[name == "batch"])
WAITERS = [Waiter(("convo", "batch")[i % 2], i, 0.0) for i in range(20)]
for i, w in enumerate(WAITERS):
    w.tenant = f"key{i % 3}"


def fairqueue_cycle() -> None:
    for w in WAITERS:
        QUEUE.push(w)
    while QUEUE.take(lambda route: True) is not None:
        pass


HOSTS = Hosts(CONFIG, Clock(), get=lambda url, headers: Deferred())
METRICS = Metrics(CONFIG, None, HOSTS, None, None)  # type: ignore[arg-type]
ROW = UsageRow(1.0, "convo", "f", MODEL, "titan", "/v1/chat/completions", 200, False,
               prompt_tokens=100, cached_tokens=50, completion_tokens=10,
               queue_ms=1.0, ttfb_ms=20.0)  # fmt: skip


def metrics_observe() -> None:
    METRICS.observe(ROW)


CASES: list[tuple[str, Callable[[], None], int]] = [
    ("wire.headers: RawHeaders build, 3 reads, a remove, pairs", headers, 20000),
    ("proxy.routing: split_route + choose_model + credentials", routing, 20000),
    ("leases.memory: reused_at_once x10", lease_lookup, 5000),
    ("leases.table: peek x10 held + 1 new", table_peek, 5000),
    ("limiter.slots: 1 acquire, 4 queued (2 routes), 5 releases", limiter_cycle, 5000),
    ("limiter.fairqueue: 20 push, take until empty", fairqueue_cycle, 5000),
    ("admin.metrics: Metrics.observe", metrics_observe, 20000),
]


def main() -> None:
    build = describe()
    for name, fn, number in CASES:
        best = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
        print(f"{name:60} {build:36} {best:8.2f} us")


if __name__ == "__main__":
    main()
