"""Microbenchmarks of single functions: the compiled modules' hot paths (`compiled.py`) and the
client key check (`keycheck.py`)."""
