"""The packages' import graph: no module imports itself back through others, and
``protocols/`` never imports ``gateway/``.

Every import counts, the ones inside functions and under ``TYPE_CHECKING`` too: a
function-level import is how a circle hides (the record generators had one), and
importing ``a.b.c`` imports the packages ``a`` and ``a.b`` first.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "protocols")


def modules_under(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name an import statement of ``path`` names (``from a import b``
    names ``a`` and ``a.b``: ``b`` may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` that importing it imports directly,
    the packages above each imported module included (but not its own parents)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for name in _imported_names(module, path):
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):
                target = ".".join(parts[:depth])
                if target in modules and target != module and not module.startswith(
                        target + "."):
                    edges.add(target)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle_in_the_packages() -> None:
    graph = import_graph(modules_under(ROOT, PACKAGES))
    assert len(graph) > 150  # the walk found the packages
    assert circles(graph) == []


def test_protocols_never_imports_gateway() -> None:
    graph = import_graph(modules_under(ROOT, PACKAGES))
    crossing = sorted((module, target) for module, targets in graph.items()
                      if module.startswith("protocols") for target in targets
                      if target.startswith("gateway"))
    assert crossing == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.leaf import VALUE\n")
    (package / "sub" / "leaf.py").write_text("VALUE = 1\n")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def later():\n    from pkg.a import thing\n")
    (package / "c.py").write_text("from pkg.sub import leaf\n")
    graph = import_graph(modules_under(tmp_path, ["pkg"]))
    assert circles(graph) == [["pkg.a", "pkg.b"]]
    # importing pkg.sub.leaf imports pkg.sub first; the packages a module sits in are
    # not its imports (they are being imported when it runs)
    assert graph["pkg.c"] == {"pkg.sub", "pkg.sub.leaf"}
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}


def test_serve_loads_no_load_generator_and_the_bench_no_cli() -> None:
    # figtank serve builds its parser and runs the server without importing gateway.bench
    # (the bench's scenarios, peers and soak are ~8k lines nothing serving needs).
    probe = ("import sys\n"
             "from gateway.cli.main import build_parser\n"
             "build_parser(['serve', '--data-dir', 'unused'])\n"
             "import gateway.server.run\n"
             "print(sorted(m for m in sys.modules if m.startswith('gateway.bench')))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
    # The bench sits below the command line: it imports none of gateway.cli.
    for module, path in modules_under(ROOT, ["gateway"]).items():
        if module.startswith("gateway.bench"):
            cli = {n for n in _imported_names(module, path)
                   if n == "gateway.cli" or n.startswith("gateway.cli.")}
            assert not cli, f"{module} imports {sorted(cli)}"
