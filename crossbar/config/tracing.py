"""`[tracing]`: where crossbar's OpenTelemetry spans go (docs/reference.md, "Config").

Tracing is off unless the config has a `[tracing]` table. What the table leaves out, the
standard `OTEL_EXPORTER_OTLP_*` variables (and `OTEL_SERVICE_NAME`) fill: the traces-specific
variable first, then the general one, as the OpenTelemetry SDK reads them. The SDK is an
optional extra (`pip install 'crossbar-llama[otel]'`): a config that asks for tracing where it
is not installed is an error at start and in `crossbar check`, not a traceback at the first
request.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from attrs import field, frozen

from crossbar.config.fields import Errors, Section, key_path, quote, type_name

PROTOCOLS = ("http/protobuf", "grpc")
_TRACES_PATH = "/v1/traces"  # what an OTLP/HTTP collector serves traces on
# The modules each protocol needs, and the distribution that brings them.
_EXPORTER = "opentelemetry.exporter.otlp.proto"
_NEEDS = {
    "http/protobuf": (f"{_EXPORTER}.http", "opentelemetry-exporter-otlp-proto-http"),
    "grpc": (f"{_EXPORTER}.grpc", "opentelemetry-exporter-otlp-proto-grpc"),
}
_SDK = ("opentelemetry.sdk", "opentelemetry-sdk")


def _headers_repr(headers: tuple[tuple[str, str], ...]) -> str:
    return "(" + ", ".join(f"{name}=***" for name, _ in headers) + ")"  # values are secrets


@frozen
class TracingConfig:
    """`[tracing]` resolved: the table, then the environment, then the defaults."""

    endpoint: str
    protocol: str = "http/protobuf"
    service_name: str = "crossbar"
    sample_ratio: float = 1.0
    # Sent to the collector with every export (an API key, often): never shown.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=_headers_repr)
    timeout: float = 10.0  # one export's longest wait for the collector
    max_queue: int = 2048  # ended spans waiting for export; past it they are dropped (counted)


def _env(environ: Mapping[str, str], name: str) -> str:
    """`OTEL_EXPORTER_OTLP_TRACES_<name>`, else `OTEL_EXPORTER_OTLP_<name>`, else ""."""
    return (
        environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or ""
    ).strip()


def _env_endpoint(environ: Mapping[str, str], protocol: str) -> str:
    """The endpoint the variables name: the traces one as it is, the general one as a base
    that OTLP/HTTP appends `/v1/traces` to (the specification's rule)."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base and protocol == "http/protobuf":
        return base.rstrip("/") + _TRACES_PATH
    return base


def parse_headers(text: str) -> list[tuple[str, str]]:
    """`OTEL_EXPORTER_OTLP_HEADERS`: `key1=value1,key2=value2`, values percent-encoded; a
    member without `=` is skipped (as the SDK does)."""
    pairs = []
    for member in text.split(","):
        name, eq, value = member.partition("=")
        if eq and name.strip():
            pairs.append((unquote(name.strip()).lower(), unquote(value.strip())))
    return pairs


def _endpoint_error(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {quote(url)}"
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return f"not an http(s) URL (bad port): {quote(url)}"
    return None


def _missing_modules(protocol: str) -> list[str]:
    """The distributions tracing over `protocol` needs that are not installed."""
    missing = []
    for module, distribution in (_SDK, _NEEDS[protocol]):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            found = False
        if not found:
            missing.append(distribution)
    return missing


def read_tracing(errors: Errors, data: Any, environ: Mapping[str, str]) -> TracingConfig | None:
    """Read `[tracing]` (None when the config has none: tracing off), with `environ`'s
    `OTEL_*` variables filling what it leaves out; every problem goes to `errors`."""
    t = Section(errors, "tracing", data)
    protocol = t.string("protocol", "") or _env(environ, "PROTOCOL") or "http/protobuf"
    if protocol not in PROTOCOLS:
        errors.add(t.sub("protocol"), f'must be "http/protobuf" or "grpc", not {quote(protocol)}')
        protocol = "http/protobuf"
    endpoint = t.string("endpoint", "") or _env_endpoint(environ, protocol)
    if not endpoint:
        errors.add(
            t.sub("endpoint"),
            'missing (the collector\'s OTLP URL, e.g. "http://collector:4318/v1/traces"), '
            "and OTEL_EXPORTER_OTLP_ENDPOINT is not set",
        )
    else:
        why = _endpoint_error(endpoint)
        if why is not None:
            errors.add(t.sub("endpoint"), why)
        elif protocol == "http/protobuf" and urlsplit(endpoint).path in ("", "/"):
            endpoint = endpoint.rstrip("/") + _TRACES_PATH
    service = t.string("service_name", "") or environ.get("OTEL_SERVICE_NAME", "") or "crossbar"
    ratio = _ratio(t)
    headers = dict(_headers(t))
    for name, value in parse_headers(_env(environ, "HEADERS")):
        headers.setdefault(name, value)  # the table's win
    timeout = t.duration("timeout", 10.0)
    max_queue = t.integer("max_queue", 2048)
    t.finish()
    missing = _missing_modules(protocol)
    if missing:
        errors.add(
            "tracing",
            "needs the OpenTelemetry SDK, which is not installed here "
            f"({', '.join(missing)}): pip install 'crossbar-llama[otel]', or remove [tracing]",
        )
    return TracingConfig(
        endpoint, protocol, service, ratio, tuple(headers.items()), timeout, max_queue
    )


def _ratio(t: Section) -> float:
    value = t.raw("sample_ratio", 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        shown = quote(value) if isinstance(value, int | float) else type_name(value)
        t.errors.add(t.sub("sample_ratio"), f"must be a number from 0 to 1, not {shown}")
        return 1.0
    return float(value)


def _headers(t: Section) -> list[tuple[str, str]]:
    """`headers`: a table of strings; header names as HTTP/2 (gRPC) needs them, lower case."""
    raw = t.raw("headers", {})
    path = t.sub("headers")
    if not isinstance(raw, dict):
        t.errors.add(path, f"must be a table of strings, not {type_name(raw)}")
        return []
    pairs = []
    for name, value in raw.items():
        if not isinstance(value, str):
            # The value may be a secret: say what it is, not what it says.
            t.errors.add(key_path(path, name), f"must be a string, not {type_name(value)}")
        elif not name or any(c in name for c in " :\r\n"):
            t.errors.add(key_path(path, name), "is not a header name")
        else:
            pairs.append((name.lower(), value))
    return pairs
