"""Shape rules the code keeps (issue 14): the training package reads as small functions."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[1] / "galore_plumage" / "training"
MAX_LINES = 60


def test_no_function_in_training_is_longer_than_sixty_lines():
    long = []
    for path in sorted(TRAINING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these: " + ", ".join(long)


# ----------------------------------------------------------------- the import graph
PACKAGE = TRAINING.parent
# NamedTuple's public API is spelled with a leading underscore
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at `path`, for a package whose parent folder is `root`."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, modules: set[str]) -> set[str]:
    """The `modules` that `path` imports anywhere in it (inside functions too: a lazy import is an edge)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in modules}
    return found - {name}


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(path, package.parent) for path in paths}
    return {module_name(path, package.parent): imports_of(path, package.parent, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first = last), or None."""
    visiting, done = [], set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return visiting[visiting.index(node):] + [node]
        if node in done:
            return None
        visiting.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        visiting.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "galore_plumage.optimizers.sharded" in graph["galore_plumage.optimizers.base"]  # the graph sees edges
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_closed_by_a_lazy_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from .a import other\n")
    (package / "c.py").write_text("from . import a\n")
    assert find_cycle(import_graph(package)) == ["pkg.a", "pkg.b", "pkg.a"]
    (package / "b.py").write_text("def thing():\n    pass\n")
    assert find_cycle(import_graph(package)) is None


def _torch_multi_tensor_op(node: ast.Attribute) -> bool:
    """torch._foreach_*: torch's multi-tensor kernels, which torch.optim calls the same way (the foreach option)."""
    return isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr.startswith("_foreach_")


def test_no_module_reads_another_objects_private_members():
    """`x._name` only on self or cls: what one module needs of another is public (issue 14)."""
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and node.attr not in NAMEDTUPLE_API and not _torch_multi_tensor_op(node)
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert not reads, "private members read from outside: " + ", ".join(reads)
