"""The package's architecture rules, checked on its source (issue 18's acceptance).

* A module is at most about 600 lines; one of up to 900 says at its top why it stays long
  (the words "long because" in its first 40 lines); none is longer. The same holds for the
  Rust crates' source files.
* No import cycle between the package's modules (imports under ``if TYPE_CHECKING:`` do not
  count; lazy imports inside functions do).
* No private name crosses rooms: a module of ``agentrl.<room>`` imports no underscore name
  (or underscore module) of another room. ``agentrl._core``, the extension module every room
  talks to, is the one exception.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "agentrl"
SOFT_LINES = 600
HARD_LINES = 900
EXEMPT = {"agentrl._core"}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _is_package(name: str) -> bool:
    return name in MODULES and MODULES[name].name == "__init__.py"


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _imports(name: str, source: str | None = None) -> Iterator[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` for each import of an agentrl module."""
    if source is None:
        source = MODULES[name].read_text(encoding="utf-8")
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("agentrl"):
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("agentrl"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES or sub in EXEMPT:  # `from agentrl.x import module`
                    yield sub, None, node.lineno
                else:
                    yield base, alias.name, node.lineno


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and _is_package(module)):
        return parts[1]
    return module  # a top-level module is a room of its own


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_length(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").splitlines()
    assert len(lines) <= HARD_LINES, f"{name}: {len(lines)} lines, over the {HARD_LINES} ceiling"
    if len(lines) > SOFT_LINES:
        head = "\n".join(lines[:40])
        assert "long because" in head, f"{name}: {len(lines)} lines and no reason at its top"


def test_rust_file_length() -> None:
    bad = []
    for path in sorted((ROOT / "rust").rglob("*.rs")):
        if "target" in path.parts:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        tests_file = path.name == "tests.rs" or "tests" in path.parts
        if len(lines) > HARD_LINES and not tests_file:
            bad.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
        elif (
            len(lines) > SOFT_LINES
            and not tests_file
            and "long because" not in "\n".join(lines[:40])
        ):
            bad.append(f"{path.relative_to(ROOT)}: {len(lines)} lines, no reason at its top")
    assert not bad, bad


def test_no_import_cycle() -> None:
    graph = {
        name: sorted({m for m, _, _ in _imports(name) if m in MODULES and m != name})
        for name in MODULES
    }
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name)


def _private_imports(name: str, source: str | None = None) -> list[str]:
    bad = []
    for module, imported, line in _imports(name, source):
        if module in EXEMPT or _room(module) == _room(name):
            continue
        private_module = any(p.startswith("_") for p in module.split(".")[1:])
        if private_module or (imported is not None and imported.startswith("_")):
            what = module if imported is None else f"{module}.{imported}"
            bad.append(f"{name}:{line} imports {what}")
    return bad


def test_no_private_name_across_rooms() -> None:
    bad = [line for name in MODULES for line in _private_imports(name)]
    assert not bad, "\n".join(bad)


def test_the_rules_can_fail() -> None:
    # The check sees a private name of another room, a private module of another room, and
    # relative imports; the extension module and a room's own private names pass.
    source = (
        "from agentrl import _core\n"
        "from agentrl.sandbox.box import Sandbox\n"
        "from agentrl.evaluation import _box\n"
        "from agentrl.pool.engine import _JobPool\n"
        "from .pool import SandboxPool\n"
        "from ._private import x\n"
    )
    bad = _private_imports("agentrl.pool.demo", source)
    assert [b.split(" imports ")[1] for b in bad] == [
        "agentrl.evaluation._box",
    ], bad
    assert _room("agentrl.sandbox.box") == "sandbox" != _room("agentrl.pool.engine")
    assert _room("agentrl.errors") == "agentrl.errors"
