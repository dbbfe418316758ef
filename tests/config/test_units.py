"""Durations and sizes are written as strings with units, and read exactly."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crossbar.config.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("0s", 0.0),
        (" 5s ", 5.0),
    ],
)
def test_every_duration_form_reads_as_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 s", "s", "5x", "-5s", "5sec", "1h 30m", "5S", "ms5"])
def test_a_duration_without_a_known_unit_is_refused_with_examples(text):
    with pytest.raises(ValueError, match=re.escape('e.g. "250ms", "90s"')):
        parse_duration(text)


def test_a_non_string_duration_is_refused():
    with pytest.raises(ValueError):
        parse_duration(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64MiB", 64 * 1024**2),
        ("512KiB", 512 * 1024),
        ("1GiB", 1024**3),
        ("1TiB", 1024**4),
        ("2MB", 2_000_000),
        ("3KB", 3000),
        ("1GB", 10**9),
        ("1TB", 10**12),
        ("100B", 100),
        ("100", 100),
        ("1.5KiB", 1536),
        (4096, 4096),
    ],
)
def test_every_size_form_reads_as_bytes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "64mib", "64 XB", "-1", -1, True, 1.5])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_formatted_durations_read_back_exactly(ms):
    assert parse_duration(format_duration(ms / 1000)) == pytest.approx(ms / 1000)


@given(st.integers(min_value=1, max_value=2**44))
def test_formatted_sizes_read_back_exactly(n):
    assert parse_size(format_size(n)) == n
