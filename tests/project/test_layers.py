"""The packages keep the layers docs/architecture.md draws: each imports only the packages its
row allows, others only through their façade (`__init__`), and no module imports itself back
through a cycle, `TYPE_CHECKING` imports included. The table in the doc is what is enforced."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CROSSBAR = ROOT / "crossbar"


def module_of(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for p in sorted(CROSSBAR.rglob("*.py"))}


def package_of(module: str) -> str:
    """crossbar.leases.table -> leases; crossbar.records -> records."""
    return module.split(".")[1] if module != "crossbar" else ""


def imports(module: str) -> set[str]:
    """The crossbar modules `module` imports (a name that is a submodule counts as that one)."""
    path = MODULES[module]
    base = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                up = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                source = ".".join(up + ([source] if source else []))
            targets = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != module and target.startswith("crossbar"):
                found.add(target)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def allowed() -> dict[str, set[str]]:
    """The doc's table "Import directions": package -> the packages it may import."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Import directions", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|(.*?)\|", section, re.M)
    return {name: set(re.findall(r"`([a-z_]+)`", may)) for name, may in rows}


PACKAGES = {p.name for p in CROSSBAR.iterdir() if (p / "__init__.py").exists()}
# a module of plain records, and the build's description (the standard library only), that
# every layer may use
LEAVES = {"records", "build"}


def test_every_package_has_a_row_in_the_table():
    assert PACKAGES - set(allowed()) == set()


def test_each_package_imports_only_what_its_row_allows():
    table = allowed()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if package_of(module)
        and package_of(target) not in ("", package_of(module), *LEAVES)
        and package_of(target) not in table.get(package_of(module), set())
    )
    assert wrong == []


def test_other_packages_are_reached_through_their_facade_only():
    # crossbar.records and crossbar.logs are modules, not packages: nothing to go through.
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target.count(".") >= 2 and package_of(target) != package_of(module)
    )
    assert wrong == []


def test_no_module_imports_itself_back_through_a_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_checks_see_what_they_check():
    # A layering test that read no imports would pass whatever the code did.
    assert len(MODULES) > 100
    assert "crossbar.leases" in GRAPH["crossbar.proxy.placement"]
    assert "crossbar.wire.meter" in GRAPH["crossbar.wire.dialects"]  # a submodule by name
    assert "crossbar.leases.types" in GRAPH["crossbar.leases.index"]  # TYPE_CHECKING too
