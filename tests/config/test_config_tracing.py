"""`[tracing]`: off unless the table is there; the `OTEL_EXPORTER_OTLP_*` variables fill what
it leaves out; every mistake is named by its dotted path; a missing OpenTelemetry SDK is said
at start; the collector's headers never show."""

from __future__ import annotations

import pytest

from crossbar.config import ConfigError, TracingConfig
from crossbar.config import tracing as tracing_module
from crossbar.config.values import parse_config

BASE = {
    "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": ["m"]}},
    "routes": {"r": {"hosts": ["titan"]}},
}


def parse(tracing=None, environ=None, **routes):
    data = {**BASE}
    if tracing is not None:
        data["tracing"] = tracing
    if routes:
        data["routes"] = {"r": {"hosts": ["titan"], **routes}}
    return parse_config(data, environ=environ)


def errors(tracing, environ=None, **routes) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse(tracing, environ, **routes)
    return e.value.errors


def test_tracing_is_off_without_the_table_whatever_the_environment_says():
    config = parse(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert config.tracing is None


def test_the_table_alone_gives_the_defaults():
    config = parse({"endpoint": "http://collector:4318/v1/traces"})
    assert config.tracing == TracingConfig(
        endpoint="http://collector:4318/v1/traces",
        protocol="http/protobuf",
        service_name="crossbar",
        sample_ratio=1.0,
        headers=(),
        timeout=10.0,
        max_queue=2048,
    )


def test_an_http_endpoint_without_a_path_gets_the_otlp_traces_path():
    assert parse({"endpoint": "http://collector:4318"}).tracing.endpoint == (
        "http://collector:4318/v1/traces"
    )
    grpc = parse({"endpoint": "http://collector:4317", "protocol": "grpc"}).tracing
    assert grpc.endpoint == "http://collector:4317"  # gRPC names no path


def test_the_environment_fills_what_the_table_leaves_out_and_the_table_wins():
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-team=infra,authorization=Bearer%20env-key",
        "OTEL_SERVICE_NAME": "crossbar-eu",
    }
    filled = parse({}, environ).tracing
    assert filled.endpoint == "http://base:4318/v1/traces"  # the general variable is a base
    assert filled.service_name == "crossbar-eu"
    assert dict(filled.headers) == {"x-team": "infra", "authorization": "Bearer env-key"}
    table = {"endpoint": "http://mine:4318/v1/traces", "headers": {"Authorization": "Bearer t"}}
    mine = parse(table, environ).tracing
    assert mine.endpoint == "http://mine:4318/v1/traces"
    assert dict(mine.headers) == {"authorization": "Bearer t", "x-team": "infra"}


def test_the_traces_variables_come_before_the_general_ones():
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
    }
    settings = parse({}, environ).tracing
    assert (settings.endpoint, settings.protocol) == ("http://traces:4317", "grpc")


def test_each_mistake_is_named_by_its_dotted_path():
    found = errors(
        {
            "endpoint": "collector:4318",
            "protocol": "http/json",
            "sample_ratio": 1.5,
            "headers": {"x-key": 5, "bad name": "v"},
            "timeout": 10,
            "colour": "blue",
        }
    )
    assert found == [
        'tracing.protocol: must be "http/protobuf" or "grpc", not "http/json"',
        'tracing.endpoint: not an http(s) URL: "collector:4318"',
        "tracing.sample_ratio: must be a number from 0 to 1, not 1.5",
        "tracing.headers.x-key: must be a string, not an integer",
        'tracing.headers."bad name": is not a header name',
        'tracing.timeout: must be a duration string such as "90s", not an integer 10',
        "tracing.colour: unknown key",
    ]


def test_a_table_with_no_endpoint_anywhere_says_where_one_goes():
    assert errors({}) == [
        'tracing.endpoint: missing (the collector\'s OTLP URL, e.g. "http://collector:4318/v1/traces"), '
        "and OTEL_EXPORTER_OTLP_ENDPOINT is not set"
    ]


def test_without_the_sdk_installed_the_config_says_which_extra_to_install(monkeypatch):
    real = tracing_module.importlib.util.find_spec

    def absent(name, *args):
        if name.startswith("opentelemetry.exporter.otlp.proto.grpc"):
            return None
        return real(name, *args)

    monkeypatch.setattr(tracing_module.importlib.util, "find_spec", absent)
    assert parse({"endpoint": "http://c:4318"}).tracing is not None  # HTTP needs no gRPC
    assert errors({"endpoint": "http://c:4317", "protocol": "grpc"}) == [
        "tracing: needs the OpenTelemetry SDK, which is not installed here "
        "(opentelemetry-exporter-otlp-proto-grpc): pip install 'crossbar-llama[otel]', "
        "or remove [tracing]"
    ]


def test_the_collectors_headers_never_show_in_the_config():
    settings = parse({"endpoint": "http://c:4318", "headers": {"Authorization": "Bearer s3"}})
    assert "s3" not in repr(settings.tracing) and "s3" not in repr(settings)
    assert "authorization=***" in repr(settings.tracing)


def test_record_content_is_off_unless_a_route_opts_in():
    assert parse().route("r").record_content is False
    assert parse(record_content=True).route("r").record_content is True
    assert errors(None, record_content="yes") == [
        'routes.r.record_content: must be true or false, not "yes"'
    ]


def test_check_shows_where_traces_go_and_hides_the_header_values():
    from crossbar.cli.check import describe

    config = parse({"endpoint": "http://user:pw@c:4318/v1/traces", "headers": {"x-key": "s3cr3t"}})
    text = describe(config)
    assert (
        "tracing to http://user:***@c:4318/v1/traces over http/protobuf as crossbar; "
        "sample_ratio 1; headers x-key (values hidden)"
    ) in text
    assert "s3cr3t" not in text and "pw@" not in text
    assert "tracing off" in describe(parse())
