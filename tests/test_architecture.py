"""Shape of the code beyond import-linter's contracts: no import cycles anywhere, small modules, short functions,
and no state in modules (no ``global``, no module-level container that the module mutates).

The import graph is grimp's (what import-linter builds on), over the root packages pyproject.toml
names for import-linter, with imports under ``TYPE_CHECKING`` included: a cycle hidden there is still a
cycle in the design.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS: tuple[str, ...] = tuple(
    tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
)
HAND_WRITTEN = ("morphing", "controller", "worker_agent", "spotmorph")
MAX_LINES = 400
# Modules allowed over the limit, with a ceiling each (they may shrink, not grow); none today.
OVER_LIMIT: dict[str, int] = {}


def cycles(graph: grimp.ImportGraph) -> dict[str, tuple[str, ...]]:
    """Every module that is part of an import cycle, with one cycle through it (module ... module)."""
    found: dict[str, tuple[str, ...]] = {}
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                found[module] = (module, *back)
                break
    return found


def test_the_cycle_finder_finds_cycles_through_any_length() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "e.f")]:
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == {"a": ("a", "b", "c", "a"), "b": ("b", "c", "a", "b"), "c": ("c", "a", "b", "c")}


def test_no_module_is_part_of_an_import_cycle() -> None:
    found = cycles(grimp.build_graph(*ROOTS))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(chain) for chain in found.values())


def _modules() -> dict[str, int]:
    sizes = {}
    for package in HAND_WRITTEN:
        for path in sorted((REPO / package).rglob("*.py")):
            sizes[path.relative_to(REPO).as_posix()] = len(path.read_text().splitlines())
    return sizes


def test_no_hand_written_module_exceeds_400_lines() -> None:
    sizes = _modules()
    too_long = {p: n for p, n in sizes.items() if n > OVER_LIMIT.get(p, MAX_LINES)}
    assert not too_long, f"modules over {MAX_LINES} lines (split them): {too_long}"


@pytest.mark.parametrize("path", sorted(OVER_LIMIT))
def test_exceptions_to_the_line_limit_are_still_needed(path: str) -> None:
    size = _modules().get(path, 0)
    assert size > MAX_LINES, f"{path} has {size} lines now: remove it from OVER_LIMIT"


# The product, generated gRPC stubs aside: what the function and module-state rules hold for.
PRODUCT = ("controller", "worker_agent", "morphing", "spotmorph", "protos", "bench")
MAX_FUNCTION_LINES = 80
MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add", "discard"}
    | {"move_to_end", "appendleft", "extendleft", "popleft", "sort", "reverse"}
)
CONTAINERS = frozenset({"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter", "WeakValueDictionary"})


def _parsed() -> Iterator[tuple[str, ast.Module]]:
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(), str(path))


def long_functions(tree: ast.Module) -> dict[str, int]:
    """Every function (methods and nested ones too) longer than the limit, by name: its lines from ``def`` to its
    last line (decorators not counted)."""
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }


def global_statements(tree: ast.Module) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Global)]


def _bound(statement: ast.stmt) -> tuple[str, ast.expr] | None:
    """The name and value of a module-level ``NAME = value`` (or ``NAME: T = value``)."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, value = statement.targets[0], statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target, value = statement.target, statement.value
    else:
        return None
    return (target.id, value) if isinstance(target, ast.Name) else None


def _is_container(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    called = value.func if isinstance(value, ast.Call) else None
    return (isinstance(called, ast.Name) and called.id in CONTAINERS) or (
        isinstance(called, ast.Attribute) and called.attr in CONTAINERS
    )


def _mutated_names(node: ast.AST) -> set[str]:
    """Names ``node`` changes in place: ``NAME.append(...)`` and the like, ``NAME[k] = v``, ``del NAME[k]``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        return {node.func.value.id} if isinstance(node.func.value, ast.Name) else set()
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    return {t.value.id for t in targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)}


def mutated_module_containers(tree: ast.Module) -> set[str]:
    """Module-level names bound to a mutable container (a display or a constructor call) that the module itself
    mutates: a method that changes it, an item assigned or deleted. Module state, however spelled."""
    containers = {b[0] for b in map(_bound, tree.body) if b is not None and _is_container(b[1])}
    return containers & {name for node in ast.walk(tree) for name in _mutated_names(node)}


def test_the_shape_checks_find_what_they_look_for() -> None:
    tree = ast.parse(
        "CACHE = {}\nSEEN: list[int] = []\nFIXED = {'a': 1}\nQUEUE = deque()\n"
        "def f():\n    global X\n    CACHE['k'] = 1\n    SEEN.append(2)\n"
        "    QUEUE.appendleft(3)\n    return FIXED['a']\n" + "def g():\n" + "    pass\n" * MAX_FUNCTION_LINES
    )
    assert mutated_module_containers(tree) == {"CACHE", "SEEN", "QUEUE"}
    assert global_statements(tree) == [6]
    assert long_functions(tree) == {"g": MAX_FUNCTION_LINES + 1}


def test_no_function_in_the_product_exceeds_80_lines() -> None:
    found = {f"{path}:{name}": n for path, tree in _parsed() for name, n in long_functions(tree).items()}
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {found}"


@pytest.mark.slow
def test_no_module_holds_state_global_statements_or_mutated_module_containers() -> None:
    found = {path: global_statements(tree) for path, tree in _parsed() if global_statements(tree)}
    assert not found, f"`global` statements (give the state an owner: an object, or a context variable): {found}"
    mutated = {path: sorted(names) for path, tree in _parsed() if (names := mutated_module_containers(tree))}
    assert not mutated, f"module-level containers the module mutates (module state; give it an owner): {mutated}"


def test_the_runtimes_modules_live_in_its_layers() -> None:
    """The runtime's import-linter layers cover its subpackages: a module at its root would sit in none."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (runtime,) = [c for c in contracts if c.get("containers") == ["worker_agent.runtime"]]
    layers = {name.strip() for layer in runtime["layers"] for name in layer.split("|")}
    root = REPO / "worker_agent" / "runtime"
    found = {p.stem for p in root.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in root.iterdir() if (p / "__init__.py").is_file()
    }
    assert found == layers, f"runtime modules or packages outside its layers: {sorted(found - layers)}"
