"""The package's shape: its modules import each other one way, with no circle, and each
layer imports only what is below it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import jupyter_dlsched

PACKAGE = Path(jupyter_dlsched.__file__).parent
ROOT = "jupyter_dlsched"
#: What people call: they reach the pool through the ``Scheduler`` client only.
FRONT_ENDS = ("cli", "notebook", "widgets", "server")
#: The ledger's internals, the engine (what decides) and the job-process chain.
BELOW_THE_CLIENT = ("store", "engine", "local")
#: The client and what hangs on it.
CLIENT = ("client",)

#: Each room of the package and the other rooms it may import (at the top, inside a
#: function or for types only). ``docs/architecture.md`` draws this table as the map.
#: A new room needs a line here; an import a line does not allow is a change of the map.
MAY_IMPORT: dict[str, set[str]] = {
    "vocab": set(),
    "policy": {"vocab"},
    "store": {"vocab", "policy"},
    "machine": {"vocab", "store"},
    "schedules": {"vocab", "store"},
    "forecast": {"vocab", "policy", "store"},
    "sim": {"vocab", "policy", "forecast"},
    "inside": {"vocab", "machine", "store", "agent"},
    "staging": {"vocab", "policy", "store", "local"},
    "local": {"vocab", "machine", "store", "inside", "staging", "engine", "agent"},
    "backends": {"vocab", "policy", "machine", "store", "inside", "local", "engine"},
    "engine": {
        "vocab",
        "policy",
        "machine",
        "store",
        "schedules",
        "forecast",
        "staging",
        "local",
        "backends",
    },
    "agent": {
        "vocab",
        "policy",
        "machine",
        "store",
        "schedules",
        "staging",
        "local",
        "backends",
        "engine",
    },
    "nbjobs": {"vocab", "inside", "client"},
    "client": {
        "vocab",
        "policy",
        "machine",
        "store",
        "inside",
        "staging",
        "backends",
        "engine",
        "agent",
        "nbjobs",
    },
    "kernels": {"vocab", "inside", "client"},
    "widgets": {"vocab", "machine", "client", "notebook"},
    "notebook": {"vocab", "inside", "client", "widgets"},
    "server": {"vocab", "machine", "client", "nbjobs"},
    "cli": {"vocab", "client", "agent", "kernels", "nbjobs", "sim"},
    "torch": {"inside"},
}
#: The root's own modules besides the package's face: the release and the old names.
ROOT_MODULES = {"__init__", "_version", "_moved", "torch"}

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
    body: list[ast.stmt], in_functions: bool, type_only: bool = False
) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``body``; with ``in_functions``, also those inside functions
    and classes (run when called); with ``type_only``, also those under ``if TYPE_CHECKING:``
    (a dependency all the same: the module is written against the other's shape)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            if type_only:
                found += import_statements(node.body, in_functions, type_only)
            found += import_statements(node.orelse, in_functions, type_only)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if in_functions:
                found += import_statements(node.body, in_functions, type_only)
        else:  # if, try, with, for, while, match at this level: their bodies run here
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    found += import_statements([child], in_functions, type_only)
                elif isinstance(child, ast.excepthandler | ast.match_case):
                    found += import_statements(child.body, in_functions, type_only)
    return found


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for every rule (the package does not change while
    the rules read it)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def import_graph(in_functions: bool = False, type_only: bool = False) -> Graph:
    """Module → the package's modules it imports (the module a ``from`` names, or its
    submodule when the imported name is one). Built once per kind: read, never changed."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: Graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in import_statements(parsed(path).body, in_functions, type_only):
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
    assert "jupyter_dlsched.store" in graph["jupyter_dlsched.client.scheduler"]
    # the engine is imported only inside functions there (a client of an agent never needs
    # it): seen where those count, and only there
    assert "jupyter_dlsched.engine" not in graph["jupyter_dlsched.client.scheduler"]
    inside = import_graph(in_functions=True)
    assert "jupyter_dlsched.engine" in inside["jupyter_dlsched.client.scheduler"]
    assert "jupyter_dlsched.staging.gate" in graph["jupyter_dlsched.staging"]
    assert "jupyter_dlsched.local.launcher" in graph["jupyter_dlsched.backends.local"]
    # only under TYPE_CHECKING: not an import that runs
    assert "jupyter_dlsched.backends.port" not in graph["jupyter_dlsched.client.inline"]
    assert "jupyter_dlsched.widgets" not in graph[ROOT]
    # the package's root imports its client only when a function of it runs
    assert "jupyter_dlsched.client.default" not in graph[ROOT]
    assert "jupyter_dlsched.client.default" in import_graph(in_functions=True)[ROOT]
    assert (
        "jupyter_dlsched.backends.port"
        in import_graph(type_only=True)["jupyter_dlsched.backends.base"]
    )


def test_a_circle_is_found_and_shown():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_no_module_imports_itself_in_a_circle_when_the_package_is_imported():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import circle: {shown(cycle)}"


def test_no_circle_through_imports_inside_functions_or_for_types_only():
    graph = import_graph(in_functions=True, type_only=True)
    cycle = find_cycle(graph)
    assert cycle is None, (
        f"import circle through an import inside a function or under TYPE_CHECKING: "
        f"{shown(cycle)}; move the code both sides need to where it belongs (or write the "
        "lower side against a Protocol of what it uses, as backends do with port.Port)"
    )


def layer(module: str, parts: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of the package's ``parts`` or inside one of them."""
    return any(module == f"{ROOT}.{p}" or module.startswith(f"{ROOT}.{p}.") for p in parts)


def offending(sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    graph = import_graph(in_functions=True, type_only=True)
    return sorted(
        f"{a} imports {b}"
        for a, found in graph.items()
        if layer(a, sources)
        for b in found
        if layer(b, targets) or (ROOT in targets and b == ROOT)
    )


def test_the_rules_see_a_type_only_import_and_a_layer():
    assert (
        "jupyter_dlsched.backends.port"
        in import_graph(type_only=True)["jupyter_dlsched.client.inline"]
    )
    assert layer("jupyter_dlsched.widgets.jobview", FRONT_ENDS)
    assert layer("jupyter_dlsched.notebook.cells", FRONT_ENDS)
    assert not layer("jupyter_dlsched.notebooks_extra", FRONT_ENDS)


def test_front_ends_reach_the_pool_through_the_client_only():
    """The CLI, the magics, the widgets and the server read and steer jobs through a
    ``Scheduler``; the ledger's vocabulary (states, ``JobInfo``) lives in ``schema``."""
    assert offending(FRONT_ENDS, BELOW_THE_CLIENT) == []


def test_policies_decide_from_their_inputs_only():
    """A policy sees queued and running jobs and the capacity; it reads no ledger or pool,
    which is what lets the simulator replay it."""
    below = ("store", "pool", "client", "agent", "local", "backends", "engine")
    assert offending(("policy",), below) == []


def test_the_job_process_chain_and_backends_never_hold_the_client():
    """They hold a ``port.Port``; where they decide (a supervisor after its job, the Ray
    driver) they compose an ``Engine``."""
    assert offending(("local", "backends"), (*CLIENT, ROOT)) == []


def test_the_engine_knows_no_client_agent_or_front_end():
    """Whoever decides composes an engine and plugs in its own parts (the agent its
    limits and forks); the engine imports none of them, nor the client that reaches it."""
    assert offending(("engine",), (*CLIENT, ROOT, "agent", *FRONT_ENDS)) == []


def test_no_one_but_the_client_holds_an_engine_link_or_reads_a_link_s_insides():
    """A ``Scheduler`` has one link (the Ray driver drives its engine through one too);
    front ends ask the ``Scheduler``, never its link."""
    holders = sorted(
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if "EngineLink(" in path.read_text() and not layer(module_name(path), ("engine",))
    )
    assert holders == [f"{ROOT}.backends.ray_driver", f"{ROOT}.client.scheduler"]
    for path in sorted(PACKAGE.rglob("*.py")):
        if layer(module_name(path), FRONT_ENDS):
            assert ".link." not in path.read_text(), f"{path.name} reaches into a link"


#: Modules outside ``store/`` that open a ledger transaction themselves and write in it:
#: only the engine, whose decision is one transaction over many parts of the ledger. Any
#: other writer calls a ``Store`` (or ``Lease``) method that owns its transaction.
OPENS_A_TRANSACTION = ("engine.core",)


def transaction_openers(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that call ``something.transaction(...)``, in order."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "transaction"
    )


def modules_opening_transactions() -> dict[str, list[int]]:
    """Each module outside ``store/`` that calls ``.transaction(``, with the lines."""
    found: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if layer(name, ("store",)):
            continue
        lines = transaction_openers(parsed(path))
        if lines:
            found[name.removeprefix(f"{ROOT}.")] = lines
    return found


def test_the_transaction_rule_sees_a_call_in_a_with_and_nothing_else():
    code = (
        "with store.transaction() as db:\n"
        "    pass\n"
        "with self.store.transaction(cancel=True) as db:\n"
        "    pass\n"
        "store.transactions()\n"
        "transaction = 1\n"
    )
    assert transaction_openers(ast.parse(code)) == [1, 3]
    assert "engine.core" in modules_opening_transactions()
    assert not any(layer(f"{ROOT}.{m}", ("store",)) for m in modules_opening_transactions())


def test_only_the_ledger_opens_its_transactions():
    """What a change writes and which transaction it is in are the ledger's: a module
    outside ``store/`` calls a ``Store`` method named for what it does. The modules that
    still open one themselves are listed, and the list stays true."""
    found = modules_opening_transactions()
    new = {m: lines for m, lines in found.items() if m not in OPENS_A_TRANSACTION}
    assert new == {}, (
        f"a module outside store/ opens a ledger transaction (module: lines): {new}; "
        "give the Store part that owns those rows a method that opens it"
    )
    gone = [m for m in OPENS_A_TRANSACTION if m not in found]
    assert gone == [], f"these open no transaction any more: take them off the list: {gone}"


def room_of(module: str) -> str | None:
    """The room ``module`` lives in (``jobs`` for ``jupyter_dlsched.vocab.spec``), or None
    for the package's face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_root_holds_its_rooms_and_few_modules():
    """A listing of the package is its map: rooms, and beside them only the face, the
    release, the old names' finder and ``jupyter_dlsched.torch`` (imported by jobs)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == ROOT_MODULES, f"modules at the root: {sorted(modules - ROOT_MODULES)}"
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(MAY_IMPORT) - {"torch"}, (
        f"rooms without a line in MAY_IMPORT: {sorted(rooms - set(MAY_IMPORT))}; "
        f"lines for no room: {sorted(set(MAY_IMPORT) - {'torch'} - rooms)}"
    )


def test_each_room_imports_only_the_rooms_its_rule_allows():
    graph = import_graph(in_functions=True, type_only=True)
    found = sorted(
        f"{a} imports {b}"
        for a, targets in graph.items()
        for b in targets
        if room_of(a) not in (None, "_moved", "_version")
        and room_of(b) not in (None, room_of(a), "_version")
        and room_of(b) not in MAY_IMPORT[room_of(a) or ""]
    )
    assert found == [], "imports the map does not allow:\n" + "\n".join(found)


def test_the_room_rule_catches_an_import_it_does_not_allow():
    assert room_of("jupyter_dlsched.vocab.spec") == "vocab"
    assert "store" not in MAY_IMPORT["vocab"] and "client" not in MAY_IMPORT["engine"]


def test_a_dlsched_command_loads_neither_the_policies_nor_the_replay_engine():
    """``dlsched`` builds its whole parser (``sim`` included) on every run: what a queue
    listing or a submission never uses stays unread (each run of the CLI would pay for it)."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from jupyter_dlsched.cli.parser import build_parser\n"
        "build_parser().parse_args(['queue'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'jupyter_dlsched.policy', 'jupyter_dlsched.sim.engine', 'jupyter_dlsched.forecast', "
        "'urllib.request'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]", loaded
