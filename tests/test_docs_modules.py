"""docs/architecture.md names every module of crossbar/ (the table goes stale otherwise)."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_module_table_names_every_module():
    table = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(p.name for p in (ROOT / "crossbar").glob("*.py") if p.name != "__init__.py")
    assert [m for m in modules if f"`{m}`" not in table] == []
