"""A request body is read with orjson, and whatever orjson refuses is read by the standard
library as it always was: the same bodies are taken, and the same are refused, in json's words."""

import math

import pytest

from crossbar.wire import ClientError, json_object


def test_an_object_reads_as_the_standard_library_reads_it():
    raw = '{"model": "m", "messages": [{"role": "user", "content": "héllo \\u2603"}], "n": 1.5}'
    assert json_object(raw.encode()) == {
        "model": "m",
        "messages": [{"role": "user", "content": "héllo ☃"}],
        "n": 1.5,
    }


@pytest.mark.parametrize(
    "raw",
    [
        b'{"temperature": NaN}',  # json takes NaN, orjson does not
        b'{"seed": 123456789012345678901234567890}',  # past 64 bits
        b'{"content": "\\ud800"}',  # a lone surrogate
        '{"model": "m"}'.encode("utf-16"),  # json detects UTF-16
    ],
)
def test_what_orjson_refuses_and_json_takes_is_taken(raw):
    value = json_object(raw)
    assert isinstance(value, dict) and len(value) == 1
    if "temperature" in value:
        assert math.isnan(value["temperature"])


def test_what_neither_takes_is_a_400_in_json_s_words():
    with pytest.raises(ClientError) as e:
        json_object(b'{"model": ')
    assert e.value.status == 400 and "is not valid JSON: Expecting value" in e.value.message


def test_a_body_nested_too_deeply_is_a_400_not_a_crash():
    with pytest.raises(ClientError) as e:
        json_object(b"[" * 100_000 + b"]" * 100_000, allow_array=True)
    assert e.value.status == 400 and "nested too deeply" in e.value.message


def test_an_array_or_a_scalar_where_an_object_is_wanted_is_a_400():
    for raw in (b"[1, 2]", b'"text"', b"5"):
        with pytest.raises(ClientError) as e:
            json_object(raw)
        assert "must be a JSON object" in e.value.message
