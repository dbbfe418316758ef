"""bench/micro/keycheck.py runs, and a named key's check stays far below a request's cost (the
target, 20 µs, is measured on a quiet machine: docs/performance.md)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_key_check_bench_measures_each_case():
    spec = importlib.util.spec_from_file_location(
        "keycheck", ROOT / "bench" / "micro" / "keycheck.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.run([1, 1000], 2000)
    assert len(results) == 6
    assert all(0 < us < 1000 for us in results.values()), results
