"""The packages' import graph: no module imports itself back through others, the folders
form a stack (:data:`STACK`: each imports only from its own layer or lower ones, and no
two folders import each other), ``protocols/`` never imports ``gateway/``; and the
modules' sizes: none written by hand is over :data:`MAX_MODULE_LINES` lines.

Every import counts, the ones inside functions and under ``TYPE_CHECKING`` too: a
function-level import is how a circle hides (the record generators had one), and
importing ``a.b.c`` imports the packages ``a`` and ``a.b`` first.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "protocols")
#: The most lines a hand-written module may have: a longer one holds more than one job.
MAX_MODULE_LINES = 900

#: The folders (and loose modules) of the packages, layer by layer from the bottom up: a
#: module imports only from its own layer or lower ones (docs/architecture.md draws it).
#: A folder's subfolders are part of it (``gateway.backend.kafka`` of ``gateway.backend``).
STACK: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"protocols"},                                      # sans-IO: bytes in, events out
    {"gateway.io", "gateway.extras", "gateway.logevery"},  # the socket edge, small helpers
    {"gateway.store", "gateway.auth", "gateway.client"},
    {"gateway.core"},           # settings, metrics, logs, the Backend contract
    {"gateway.backend"},        # embedded, bridge, upstream Kafka; the listeners' read helpers
    {"gateway.serving", "gateway.tail"},  # what the listeners share; the fan-out engine
    {"gateway.figg", "gateway.tank", "gateway.kafka", "gateway.http"},  # the listeners
    {"gateway.server"},         # the process: wiring (run), workers, the metrics endpoint
    {"gateway.spark"},
    {"gateway.bench"},
    {"gateway.cli"},
))
#: The imports allowed to run up :data:`STACK` (importing module, imported module) -> why.
#: At most one, and none today.
UPWARD_IMPORTS: dict[tuple[str, str], str] = {}


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


@functools.cache
def package_graph() -> dict[str, set[str]]:
    """The import graph of :data:`PACKAGES` (every module parsed once for the tests)."""
    return import_graph(modules_under(ROOT, PACKAGES))


def folder_of(module: str, stack: Iterable[Iterable[str]]) -> str | None:
    """The folder of ``stack`` that ``module`` is in (the longest that holds it), or None."""
    holding = [folder for layer in stack for folder in layer
               if module == folder or module.startswith(folder + ".")]
    return max(holding, key=len, default=None)


def unplaced_modules(modules: Iterable[str], stack: Iterable[Iterable[str]]) -> list[str]:
    """The modules in no folder of ``stack`` (the packages' own ``__init__`` aside)."""
    return sorted(m for m in modules if "." in m and folder_of(m, stack) is None)


def upward_imports(graph: dict[str, set[str]], stack: tuple[Iterable[str], ...]
                   ) -> list[tuple[str, str]]:
    """Every (module, imported module) of ``graph`` whose import goes from a folder of
    ``stack`` to one in a higher layer."""
    layer = {folder: i for i, folders in enumerate(stack) for folder in folders}
    found = []
    for module, targets in graph.items():
        source = folder_of(module, stack)
        for target in targets:
            into = folder_of(target, stack)
            if source is not None and into is not None and layer[into] > layer[source]:
                found.append((module, target))
    return sorted(found)


def folder_graph(graph: dict[str, set[str]], stack: Iterable[Iterable[str]]
                 ) -> dict[str, set[str]]:
    """Folder -> the other folders of ``stack`` its modules import."""
    folders: dict[str, set[str]] = {f: set() for layer in stack for f in layer}
    for module, targets in graph.items():
        source = folder_of(module, [folders])
        for target in targets:
            into = folder_of(target, [folders])
            if source is not None and into is not None and into != source:
                folders[source].add(into)
    return folders


def test_the_folders_form_a_stack() -> None:
    modules = modules_under(ROOT, PACKAGES)
    graph = package_graph()
    assert len(graph) > 150  # the walk found the packages
    assert unplaced_modules(modules, STACK) == []  # a new folder takes its place in STACK
    assert len(UPWARD_IMPORTS) <= 1
    assert upward_imports(graph, STACK) == sorted(UPWARD_IMPORTS)
    assert circles(folder_graph(graph, STACK)) == []  # not even within a layer


def test_the_architecture_page_draws_the_stack() -> None:
    # docs/architecture.md's drawing: one line a layer, top first, its folders before the
    # first run of two spaces.
    from tests.docs import between, code_blocks, page

    drawing = next(code_blocks(between(page("architecture.md"), "## The stack of folders",
                                       "\n## ")))
    drawn = [frozenset(name if name == "protocols" else f"gateway.{name}"
                       for name in line.split("  ", 1)[0].split())
             for line in reversed(drawing.splitlines())]
    assert tuple(drawn) == STACK


def test_the_stack_check_finds_an_upward_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for folder in ("low", "mid", "top", "side", "odd"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text("VALUE = 1\n")
    (package / "mid" / "use.py").write_text("from pkg.low.base import VALUE\n")
    (package / "top" / "app.py").write_text("from pkg.mid import use\nfrom pkg import side\n")
    (package / "side" / "peer.py").write_text("import pkg.top.app\n")  # same layer
    (package / "odd" / "stray.py").write_text("")
    stack = (frozenset({"pkg.low"}), frozenset({"pkg.mid"}),
             frozenset({"pkg.top", "pkg.side"}))
    modules = modules_under(tmp_path, ["pkg"])
    graph = import_graph(modules)
    assert upward_imports(graph, stack) == []
    assert unplaced_modules(modules, stack) == ["pkg.odd", "pkg.odd.stray"]
    # same layer, but top and side import each other
    assert circles(folder_graph(graph, stack)) == [["pkg.side", "pkg.top"]]
    # an upward import inside a function or only for the type checker counts too
    (package / "low" / "late.py").write_text("def later():\n    from pkg.mid.use import x\n")
    (package / "low" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import app\n")
    graph = import_graph(modules_under(tmp_path, ["pkg"]))
    assert upward_imports(graph, stack) == [
        ("pkg.low.late", "pkg.mid"), ("pkg.low.late", "pkg.mid.use"),
        ("pkg.low.typed", "pkg.top"), ("pkg.low.typed", "pkg.top.app")]


def test_no_import_circle_in_the_packages() -> None:
    graph = package_graph()
    assert len(graph) > 150  # the walk found the packages
    assert circles(graph) == []


def test_protocols_never_imports_gateway() -> None:
    graph = package_graph()
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


def is_generated(path: Path) -> bool:
    """Whether ``path`` says in its first lines that a generator wrote it."""
    with path.open(encoding="utf-8") as file:
        head = [file.readline() for _ in range(10)]
    return any("GENERATED" in line for line in head)


def oversized_modules(modules: dict[str, Path], limit: int = MAX_MODULE_LINES
                      ) -> dict[str, int]:
    """Module -> its line count, for every hand-written module of ``modules`` over
    ``limit`` lines."""
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines())
             for module, path in modules.items() if not is_generated(path)}
    return {module: lines for module, lines in sizes.items() if lines > limit}


def test_no_hand_written_module_is_over_900_lines() -> None:
    modules = modules_under(ROOT, PACKAGES)
    assert len(modules) > 150  # the walk found the packages
    assert is_generated(modules["protocols.kafka.records"])  # spared: the generator's
    assert oversized_modules(modules) == {}


def test_the_size_check_finds_a_long_module_and_spares_generated_ones(tmp_path: Path
                                                                       ) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (package / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "made.py").write_text('"""Records.\n\nGENERATED by a tool."""\n'
                                     + "x = 1\n" * 2 * MAX_MODULE_LINES)
    modules = modules_under(tmp_path, ["pkg"])
    assert oversized_modules(modules) == {"pkg.long": MAX_MODULE_LINES + 1}
    assert oversized_modules(modules, limit=5) == {"pkg.fits": MAX_MODULE_LINES,
                                                   "pkg.long": MAX_MODULE_LINES + 1}


def test_a_command_loads_only_its_own_module() -> None:
    # figtank --version and --help import no subcommand's module; a Figg or Tank client
    # command neither the other commands' modules nor the Kafka codecs (the generated
    # records module alone costs 0.3 s of start-up); fetch does load them.
    probe = ("import sys\n"
             "from gateway.cli.main import build_parser\n"
             "build_parser(sys.argv[1:])\n"
             "wanted = ('gateway.cli.clients', 'gateway.cli.groups', 'gateway.cli.users',\n"
             "          'gateway.bench.command', 'protocols.kafka.records')\n"
             "print(' '.join(m for m in wanted if m in sys.modules))\n")

    def loaded(*argv: str) -> set[str]:
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                              text=True, timeout=60, check=True)
        return set(done.stdout.split())

    assert loaded("--version") == set()
    assert loaded("publish", "-t", "x") == {"gateway.cli.clients"}
    assert loaded("consume", "x") == {"gateway.cli.clients"}
    assert loaded("users") == {"gateway.cli.users"}
    assert {"gateway.cli.groups", "protocols.kafka.records"} <= loaded("groups")


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
