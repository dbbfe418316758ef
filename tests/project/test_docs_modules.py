"""docs/architecture.md names every package of crossbar/ and, in its row, every module of it
(the table goes stale otherwise)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CROSSBAR = ROOT / "crossbar"


def rows() -> dict[str, str]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Packages", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z_]+)` \| (.*) \|$", section, re.M))


def test_the_package_table_names_every_package_and_each_of_its_modules():
    table = rows()
    packages = sorted(p.name for p in CROSSBAR.iterdir() if (p / "__init__.py").exists())
    assert [p for p in packages if p not in table] == []
    missing = [
        f"{package}/{module.name}"
        for package in packages
        if package not in ("testing", "demo")  # described as wholes
        for module in sorted((CROSSBAR / package).glob("*.py"))
        if module.name != "__init__.py" and f"`{module.name}`" not in table[package]
    ]
    assert missing == []


def test_the_modules_beside_the_packages_are_named_too():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    beside = sorted(p.name for p in CROSSBAR.glob("*.py") if p.name != "__init__.py")
    assert [m for m in beside if f"`{m}`" not in doc] == []
