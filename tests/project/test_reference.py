"""docs/reference.md keeps up with the code: every config key the readers accept (with the
default they give it), every admin route, every metric and every fake llama-server flag."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from crossbar.admin.api import Admin
from crossbar.config import parse_duration
from crossbar.config.fields import Section
from crossbar.config.units import parse_size
from crossbar.config.values import parse_config
from crossbar.testing.fakellama_cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text()
HEADINGS = [
    *("Config", "Client URLs", "The request path", "Answers that survive their host"),
    *("Errors", "Headers", "Leases"),
    *("Fingerprints", "Context guard", "Slots", "Batches", "Store", "Hosts", "Admin API"),
    "Metrics",
    *("The fake llama-server", "Python shapes"),
]
READERS = ("string", "boolean", "integer", "positive_number", "duration", "duration_or_off", "size")
READERS += ("string_list", "string_table", "url", "raw")
# A config with one of everything: every reader of every table runs on it.
EVERYTHING = {
    "server": {},
    "hosts": {"h": {"url": "http://127.0.0.1:1", "models": {"m": {}}}},
    "routes": {"r": {"hosts": ["h"]}},
    "templates": {"t": {"match": "t-*", "hosts": ["h"]}},
    "tracing": {"endpoint": "http://127.0.0.1:4318/v1/traces"},
}
# The subsection of "## Config" that documents each table's keys.
TABLES = {
    "server": "### `[server]`",
    "host": "### `[hosts.<name>]`",
    "model": "### `[hosts.<name>]`",
    "route": "### `[routes.<name>]` and `[templates.<name>]`",
    "template": "### `[routes.<name>]` and `[templates.<name>]`",
    "tracing": "### `[tracing]`",
}
_MISSING = object()


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    above = re.compile(rf"^#{{1,{len(level)}}} ", re.M)
    ends = [m.start() for m in above.finditer(text[start:])]
    return text[start : start + ends[0]] if ends else text[start:]


def _table_of(path: str) -> str | None:
    parts = path.split(".")
    if path in ("server", "tracing"):
        return path
    if parts[0] == "hosts" and len(parts) == 2:
        return "host"
    if parts[0] == "hosts" and len(parts) == 4 and parts[2] == "models":
        return "model"
    if parts[0] in ("routes", "templates") and len(parts) == 2:
        return parts[0][:-1]
    return None  # the top level and the outer [hosts]/[routes]/[templates] tables


@pytest.fixture(scope="module")
def accepted() -> dict[str, dict[str, tuple[str, Any]]]:
    """table -> key -> (reader, the default it gives), as the config readers take them."""
    found: dict[str, dict[str, tuple[str, Any]]] = {}
    originals = {name: getattr(Section, name) for name in READERS}

    def recording(name: str):
        original = originals[name]
        signature = inspect.signature(original)

        def read(self: Section, key: str, *args: Any, **kwargs: Any) -> Any:
            table = _table_of(self.path)
            if table is not None:
                bound = signature.bind(self, key, *args, **kwargs)
                default = bound.arguments.get("default", _MISSING)
                if default is _MISSING and "default" in signature.parameters:
                    default = signature.parameters["default"].default
                found.setdefault(table, {})[key] = (name, default)
            return original(self, key, *args, **kwargs)

        return read

    with pytest.MonkeyPatch.context() as patch:
        for name in READERS:
            patch.setattr(Section, name, recording(name))
        parse_config(EVERYTHING)
    return found


def rows(table: str) -> dict[str, str]:
    """key -> its default cell, in the subsection documenting `table`."""
    text = section(section(REFERENCE, "## Config"), TABLES[table])
    return dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]*) \|", text, re.M))


def documented_default(cell: str, reader: str) -> Any:
    """The value a default cell states, or _MISSING when it states none in words the reader
    could take (`required`, `unset`, `from /props`...)."""
    cell = cell.strip()
    if cell.startswith("`") and cell.endswith("`") and cell.count("`") == 2:
        literal = cell[1:-1]
    else:
        return _MISSING
    text = literal[1:-1] if literal.startswith('"') and literal.endswith('"') else None
    if reader in ("duration", "duration_or_off") and text is not None:
        return parse_duration(text)
    if reader == "size":
        return parse_size(text if text is not None else int(literal))
    if reader == "string" and text is not None:
        return text
    if reader == "boolean" and literal in ("true", "false"):
        return literal == "true"
    if reader in ("integer", "positive_number") and re.fullmatch(r"-?\d+(\.\d+)?", literal):
        return float(literal) if "." in literal else int(literal)
    if reader in ("string_list", "string_table") and literal in ("[]", "{}"):
        return ()
    return _MISSING


def test_the_sections_are_the_ones_code_comments_cite_in_this_order():
    found = re.findall(r"^## (.+)$", REFERENCE, re.M)
    assert found == HEADINGS


def test_every_config_key_the_readers_accept_is_documented(accepted):
    assert set(accepted) == set(TABLES), "a table the readers read is not in TABLES"
    missing = [
        f"{table}.{key}"
        for table, keys in accepted.items()
        for key in keys
        if key not in rows(table)
    ]
    assert missing == []


def test_no_config_key_is_documented_that_the_readers_do_not_accept(accepted):
    extra = []
    for table in ("server", "route", "tracing"):
        known = set(accepted[table]) | (set(accepted["template"]) if table == "route" else set())
        extra += [f"{table}.{key}" for key in rows(table) if key not in known]
    host_keys = set(accepted["host"]) | set(accepted["model"])
    extra += [f"host.{key}" for key in rows("host") if key not in host_keys]
    assert extra == []


def test_each_documented_default_is_the_readers_default(accepted):
    wrong = []
    for table, keys in accepted.items():
        cells = rows(table)
        for key, (reader, default) in keys.items():
            if key not in cells or default is _MISSING or default is None:
                continue  # missing is the test above's; None is "unset" in the reader's words
            stated = documented_default(cells[key], reader)
            if table == "server":
                assert stated is not _MISSING, f"server.{key}: state its default as a literal"
            if stated is not _MISSING and stated != default:
                wrong.append(f"{table}.{key}: documented {cells[key].strip()}, code {default!r}")
    assert wrong == []


def admin_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the admin app serves; HEAD is Klein's, for every GET."""
    found = []
    for rule in Admin.app.url_map.iter_rules():
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            found.append((method, rule.rule))
    return found


def test_the_admin_routes_are_the_ones_the_app_serves():
    assert ("GET", "/api/leases") in admin_routes()
    assert ("DELETE", "/api/hosts/<name>/drain") in admin_routes()


def test_every_admin_route_has_a_row():
    table = section(REFERENCE, "## Admin API")
    cells = re.findall(r"^\| `([A-Z]+ [^`?]+)(?:\?[^`]*)?` \|", table, re.M)
    missing = [f"{m} {p}" for m, p in admin_routes() if f"{m} {p}" not in cells]
    assert missing == []
    served = {f"{m} {p}" for m, p in admin_routes()}
    assert [c for c in cells if c not in served] == []


def metric_names() -> set[str]:
    """Every metric name crossbar registers (the first argument of its metric classes)."""
    made = re.compile(r'(?:Counter|Gauge|Histogram)(?:MetricFamily)?\(\s*"(crossbar_[a-z_]+)"')
    names = set()
    for path in (ROOT / "crossbar").rglob("*.py"):
        names.update(made.findall(path.read_text()))
    return names


def test_every_metric_is_in_the_metrics_table():
    table = section(REFERENCE, "## Metrics")
    assert len(metric_names()) > 30
    missing = [
        name
        for name in sorted(metric_names())
        if not re.search(rf"^\| `{re.escape(name)}(_total)?` \|", table, re.M)
    ]
    assert missing == []


def test_every_fake_llama_server_flag_is_in_its_table():
    table = section(REFERENCE, "## The fake llama-server")
    flags = [
        option
        for action in build_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert len(flags) > 15
    assert [f for f in flags if f"| `{f}` |" not in table] == []
