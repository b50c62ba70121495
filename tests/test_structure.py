"""The package's shape: its modules import each other one way, with no circle."""

from __future__ import annotations

import ast
from pathlib import Path

import jupyter_dlsched

PACKAGE = Path(jupyter_dlsched.__file__).parent
ROOT = "jupyter_dlsched"
#: The package's ``__init__`` loads its front ends on first use (``import jupyter_dlsched``
#: imports no ipywidgets and no Jupyter server), and they call its module-level API
#: (``dls.get``, ``default_scheduler``): the one circle closed on purpose.
FRONT_ENDS = ("jupyter_dlsched.magics", "jupyter_dlsched.widgets", "jupyter_dlsched.server")

Graph = dict[str, set[str]]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_statements(
    body: list[ast.stmt], in_functions: bool
) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``body``, never those under ``if TYPE_CHECKING:``; with
    ``in_functions``, also those inside functions and classes (run when called)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            found += import_statements(node.orelse, in_functions)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if in_functions:
                found += import_statements(node.body, in_functions)
        else:  # if, try, with, for, while, match at this level: their bodies run here
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    found += import_statements([child], in_functions)
                elif isinstance(child, ast.excepthandler | ast.match_case):
                    found += import_statements(child.body, in_functions)
    return found


def import_graph(in_functions: bool = False) -> Graph:
    """Module → the package's modules it imports (the module a ``from`` names, or its
    submodule when the imported name is one)."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: Graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in import_statements(tree.body, in_functions):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in paths else source)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import circle as a path that ends where it starts, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in path:
                return path[path.index(target) :] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def shown(cycle: list[str] | None) -> str:
    return " -> ".join(cycle or [])


def test_the_graph_sees_relative_submodule_and_function_imports():
    graph = import_graph()
    assert "jupyter_dlsched.store" in graph["jupyter_dlsched.scheduler"]
    assert "jupyter_dlsched.policy" in graph["jupyter_dlsched.scheduler"]
    assert "jupyter_dlsched.staging.gate" in graph["jupyter_dlsched.staging"]
    assert "jupyter_dlsched.local.launcher" in graph["jupyter_dlsched.backends.local"]
    # only under TYPE_CHECKING: not an import that runs
    assert "jupyter_dlsched.scheduler" not in graph["jupyter_dlsched.handle"]
    assert "jupyter_dlsched.widgets" not in graph[ROOT]
    assert "jupyter_dlsched.widgets" in import_graph(in_functions=True)[ROOT]


def test_a_circle_is_found_and_shown():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_no_module_imports_itself_in_a_circle_when_the_package_is_imported():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import circle: {shown(cycle)}"


def test_imports_inside_functions_close_no_circle_but_the_front_ends_loaded_on_first_use():
    graph = import_graph(in_functions=True)
    graph[ROOT] = {t for t in graph[ROOT] if not t.startswith(FRONT_ENDS)}
    cycle = find_cycle(graph)
    assert cycle is None, (
        f"import circle through an import inside a function: {shown(cycle)}; move the code "
        "both sides need to where it belongs instead of hiding the import in a function"
    )
