"""The TOML config as frozen values: server settings, hosts and their models, routes and
templates, each route's limits, where traces go, durations and sizes, and how a store URL is
shown. Every error names its dotted path (docs/reference.md, "Config"). Imports nothing of
crossbar but records.
"""

from crossbar.config.classes import (
    BATCH,
    CLASSES,
    CLIENT_HINTS,
    HEADER,
    INTERACTIVE,
    RANK,
    SERVICE_TIERS,
    STANDARD,
    class_error,
    lowered,
)
from crossbar.config.fields import http_url, valid_name
from crossbar.config.keys import (
    DEFAULT_CACHED_WEIGHT,
    KeyConfig,
    KeyLimits,
    KeySpec,
    hash_secret,
    read_key_spec,
)
from crossbar.config.limits import DEFAULT_LIMITS, PREWARM_PRIORITY, RouteLimits
from crossbar.config.redaction import hide_password, is_postgres, redact
from crossbar.config.route import Route
from crossbar.config.tracing import TracingConfig
from crossbar.config.units import format_duration, format_size, parse_duration
from crossbar.config.values import (
    Config,
    ConfigError,
    HostConfig,
    ModelConfig,
    load_config,
    parse_config,
    server_of,
    with_backlog,
)

__all__ = [
    "BATCH",
    "CLASSES",
    "CLIENT_HINTS",
    "DEFAULT_CACHED_WEIGHT",
    "DEFAULT_LIMITS",
    "HEADER",
    "INTERACTIVE",
    "PREWARM_PRIORITY",
    "RANK",
    "SERVICE_TIERS",
    "STANDARD",
    "Config",
    "ConfigError",
    "HostConfig",
    "KeyConfig",
    "KeyLimits",
    "KeySpec",
    "ModelConfig",
    "Route",
    "RouteLimits",
    "TracingConfig",
    "class_error",
    "format_duration",
    "format_size",
    "hash_secret",
    "hide_password",
    "http_url",
    "is_postgres",
    "load_config",
    "lowered",
    "parse_config",
    "parse_duration",
    "read_key_spec",
    "redact",
    "server_of",
    "valid_name",
    "with_backlog",
]
