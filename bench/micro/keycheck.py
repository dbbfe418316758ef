"""Benchmark the client key check: the CPU a request pays for its key (issue 32: at most 20 µs).

    .venv/bin/python bench/micro/keycheck.py [--keys 1,1000,10000] [--requests 200000] [--json]

Times, in process CPU per request, what the proxy does for a request's key before anything else
of it: finding the key by the secret it sent among N named keys (one SHA-256 and a lookup, then
a constant-time compare), checking its route and model scope, and, for a key with limits,
estimating, admitting and settling its charge. Beside it, what a route without keys pays (no
key sent) and a route with five anonymous `keys` (compared against every one).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from crossbar.config import KeyLimits, Route, hash_secret
from crossbar.proxy.routing import authenticate, check_model_scope
from crossbar.tenants import ClientKey, KeyBook, KeyMeter

T0 = 1_780_000_000.0
OPEN = Route(name="open", hosts=("h",))
TEAM = Route(name="team", hosts=("h",), auth="keys")
LEGACY = Route(name="legacy", hosts=("h",), keys=tuple(f"anonymous-key-{i:04d}" for i in range(5)))


def per_request(fn: Callable[[], object], n: int) -> float:
    """µs of process CPU per call of `fn`, over `n` calls (after a warm-up)."""
    for _ in range(min(n, 10_000)):
        fn()
    started = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - started) / n * 1e6


def book_of(n: int) -> tuple[KeyBook, str]:
    keys = [
        ClientKey(f"dev-{i}", hash_secret(f"sk-secret-{i:08d}"), routes=("team", "proj-*"))
        for i in range(n)
    ]
    keys[-1] = ClientKey(
        keys[-1].name, keys[-1].sha256, routes=("team",), models=("qwen-*",),
        limits=KeyLimits(rpm=10**9, tpm=10**12, max_in_flight=10**6, tokens_per_day=10**15),
    )  # fmt: skip
    return KeyBook(keys), f"sk-secret-{n - 1:08d}"


def run(sizes: list[int], n: int) -> dict[str, float]:
    results: dict[str, float] = {}
    results["no key sent, open route"] = per_request(
        lambda: authenticate(OPEN, None, None, None, T0), n
    )
    bearer = "Bearer anonymous-key-0004"
    results["anonymous route keys (5)"] = per_request(
        lambda: authenticate(LEGACY, None, bearer, None, T0), n
    )
    for size in sizes:
        book, secret = book_of(size)
        header = f"Bearer {secret}"

        def check(book: KeyBook = book, header: str = header) -> None:
            key = authenticate(TEAM, book, header, None, T0)
            check_model_scope(key, TEAM, "qwen-coder")

        results[f"named key among {size}: find and scope"] = per_request(check, n)
        meter = KeyMeter()
        key = authenticate(TEAM, book, header, None, T0)
        assert key is not None and key.limits.any

        def charge(book: KeyBook = book, header: str = header, meter: KeyMeter = meter) -> None:
            key = authenticate(TEAM, book, header, None, T0)
            check_model_scope(key, TEAM, "qwen-coder")
            assert key is not None
            estimate = meter.estimate(key, 2000, 1500, 256)
            meter.admit(key, estimate, T0, 2000, 1500).settle(2000, 1500, 200, T0)

        results[f"named key among {size}: find, scope, charge and settle"] = per_request(charge, n)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1,1000,10000", help="named keys in the book")
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    results = run([int(x) for x in a.keys.split(",")], a.requests)
    if a.json:
        print(json.dumps(results, indent=2))
        return
    for what, us in results.items():
        print(f"{us:8.2f} µs  {what}")


if __name__ == "__main__":
    main()
