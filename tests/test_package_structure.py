"""The shape of the package: its modules import each other without a cycle, and none imports
another module's underscore name (a private helper that two modules need belongs in a public
place: ``_checks`` for argument checks, or a public name of the module that owns it)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, package: str) -> dict[str, list[tuple[str, str]]]:
    """``{module: [(imported module, imported name or ""), ...]}`` for every module of
    ``package`` under ``root``, from every import statement (at the top or inside functions)
    that names one of the package's modules."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here.rsplit(".", node.level - 1)[0] if node.level else ""
                target = ".".join(p for p in (base, node.module or "") if p)
                if target.split(".")[0] != package:
                    continue
                for alias in node.names:  # `from . import data` imports a module; `from .x import y` a name
                    sub = f"{target}.{alias.name}"
                    is_module = (root / Path(*sub.split("."))).with_suffix(".py").exists() or (root / Path(*sub.split("."))).is_dir()
                    edges.append((sub, "") if is_module else (target, alias.name))
            elif isinstance(node, ast.Import):
                edges += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == package]
        found[name] = edges
    return found


def cycles(graph: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """The import cycles among the modules, each as the list of modules around it."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target, _ in graph.get(node, []):
            if target == node.rpartition(".")[0]:
                continue  # a module's own package is imported before it, not by it
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    return found


def private_imports(graph: dict[str, list[tuple[str, str]]]) -> list[str]:
    return [f"{module} imports {target}.{name}" for module, edges in graph.items()
            for target, name in edges if name.startswith("_") and target != module]


def test_lnbook_has_no_import_cycle_and_no_private_imports():
    graph = imports(SRC, "lnbook")
    assert {"lnbook.norms", "lnbook.models", "lnbook.parallel", "lnbook.kernels.norm"} <= set(graph)
    assert ("lnbook.functional", "layer_norm") in graph["lnbook.norms"]  # the graph sees the imports it should
    assert cycles(graph) == []
    assert private_imports(graph) == []


def test_the_checks_catch_a_cycle_and_a_private_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import helper\n")
    (pkg / "b.py").write_text("def helper():\n    from .sub.c import _private\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import helper\n_private = 1\n")
    graph = imports(tmp_path, "pkg")
    assert graph["pkg"] == [("pkg.a", "")]
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert private_imports(graph) == ["pkg.b imports pkg.sub.c._private"]
