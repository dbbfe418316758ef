"""crossbar's benchmarks, a folder per subject (docs/performance.md has each one's command and
its current figures). Each is a script run from the checkout with the venv's Python, as
`.venv/bin/python bench/<folder>/<name>.py`; the venv puts the checkout on sys.path, so the
benches import each other by full path (`from bench.common import measure`).
"""
