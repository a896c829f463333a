"""The optional dependency stays in one module, and the tracing room sits below everything that uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import tokwatch

PACKAGE = Path(tokwatch.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_only_the_otlp_module_imports_opentelemetry() -> None:
    users = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in _imports(p))
    )
    assert users == ["tracing/otlp.py"]


def test_the_tracing_room_imports_only_figures_and_itself() -> None:
    rooms = {
        m.split(".")[1]
        for p in (PACKAGE / "tracing").glob("*.py")
        for m in _imports(p)
        if m.startswith("tokwatch.")
    }
    assert rooms == {"figures", "tracing"}
