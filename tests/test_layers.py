"""The package's layers hold: the measurement plane imports nothing of serving or storage, and no two
sub-packages import each other (the rooms are grouped so that data flows one way between them).

Read from the source's own `import` statements (module level and inside functions), so a lazy import
cannot dodge either rule; imports for type checking only carry no data and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import tokwatch

PACKAGE = Path(tokwatch.__file__).parent

# What stamps and measures a request (docs/architecture.md, "The measurement plane and the serving plane").
MEASUREMENT = ("transport", "figures", "streams", "probes")
# What serves, stores or composes: the measurement plane never waits on them, so it never imports them.
SERVING = ("serve", "service", "storage", "metrics", "statuspage", "windows", "counters", "commands", "bench",
           "sim", "cli")


def room(module: str) -> str:
    """The first part below `tokwatch` of a dotted module name (`tokwatch.transport.http` -> `transport`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(path: Path) -> set[str]:
    """Every tokwatch module a file imports, wherever the import stands, except for type checking only."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tokwatch":
                found.update(f"tokwatch.{a.name}" for a in node.names)
            elif node.module.startswith("tokwatch."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tokwatch."))
    return found


def modules() -> dict[str, set[str]]:
    return {
        "tokwatch." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts): imports_of(p)
        for p in PACKAGE.rglob("*.py")
    }


def test_the_measurement_plane_imports_nothing_of_serving_or_storage() -> None:
    crossings = sorted(
        f"{mod} imports {imp}"
        for mod, imps in modules().items()
        if room(mod) in MEASUREMENT
        for imp in imps
        if room(imp) in SERVING
    )
    assert crossings == []


def test_no_two_rooms_import_each_other() -> None:
    edges: dict[str, set[str]] = {}
    for mod, imps in modules().items():
        for imp in imps:
            a, b = room(mod), room(imp)
            if a and b and a != b and a not in {"__init__", "__main__"}:
                edges.setdefault(a, set()).add(b)
    # A cycle between rooms, found by walking from every room (the graph has a few dozen edges).
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            here = todo.pop()
            if here == goal:
                return True
            if here not in seen:
                seen.add(here)
                todo.extend(edges.get(here, ()))
        return False

    circles = sorted(f"{a} <-> {b}" for a, bs in edges.items() for b in bs if reaches(b, a))
    assert circles == []


def test_the_rules_name_real_rooms() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    rooms |= {p.stem for p in PACKAGE.glob("*.py")}
    assert set(MEASUREMENT) <= rooms and set(SERVING) <= rooms
