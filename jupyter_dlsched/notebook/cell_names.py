"""Which names a notebook cell reads, found in its source before it runs.

``%%schedule`` ships only what a cell needs. ``reads(source)`` finds the names the
cell takes from the notebook: a name read before the cell assigns it, or a free name
of a function, class or comprehension defined in it. ``undefined(source, namespace)``
finds those that nothing defines, so that ``%%schedule`` refuses the cell
(``UndefinedNames``) when it is submitted rather than in the job. Both read the
source only; what the names hold is ``jupyter_dlsched.notebook.cells``'s (``capture``).

>>> sorted(reads("y = model(x)\\nloss = y.mean()"))
['model', 'x']
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable, Mapping
from typing import Any

from ..vocab.errors import DlschedError

# names IPython puts into every notebook namespace; never worth shipping
IPYTHON_NAMES = frozenset(
    {"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___", "_ih", "_oh", "_dh", "_i"}
)


class _Reads(ast.NodeVisitor):
    """Walks one scope in execution order, noting loads of names not yet bound there."""

    def __init__(self, bound: Iterable[str] = ()) -> None:
        self.bound: set[str] = set(bound)
        self.reads: set[str] = set()
        # free names of nested functions/classes, resolved against the whole cell at the end
        self.deferred: set[str] = set()

    # -- names ------------------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            if node.id not in self.bound:
                self.reads.add(node.id)
        else:
            self.bound.add(node.id)

    def _bind_target(self, target: ast.AST) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.bound.add(node.id)
            elif isinstance(node, ast.Attribute | ast.Subscript):
                self.visit(node.value)
                if isinstance(node, ast.Subscript):
                    self.visit(node.slice)

    # -- statements whose parts run in a particular order -------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._bind_target(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self._bind_target(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name) and node.target.id not in self.bound:
            self.reads.add(node.target.id)
        self.visit(node.value)
        self._bind_target(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.bound.add(node.target.id)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._bind_target(node.target)
        for stmt in [*node.body, *node.orelse]:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._bind_target(item.optional_vars)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bound.add(node.name)
        for stmt in node.body:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.bound.add(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        return None

    visit_Nonlocal = visit_Global

    # -- new scopes -----------------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self._arguments_defaults(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self.bound.add(node.name)
        self.deferred |= _function_free_names(node.args, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._arguments_defaults(node.args)
        self.deferred |= _function_free_names(node.args, [node.body])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        inner = _Reads()
        for stmt in node.body:
            inner.visit(stmt)
        self.deferred |= inner.reads | inner.deferred
        self.bound.add(node.name)

    def _comprehension(self, node: ast.AST, elements: list[ast.AST]) -> None:
        generators: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
        self.visit(generators[0].iter)  # evaluated in the enclosing scope
        inner = _Reads(self.bound)
        for i, gen in enumerate(generators):
            if i:
                inner.visit(gen.iter)
            inner._bind_target(gen.target)
            for condition in gen.ifs:
                inner.visit(condition)
        for element in elements:
            inner.visit(element)
        self.reads |= inner.reads
        self.deferred |= inner.deferred

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_ListComp  # type: ignore[assignment]
    visit_GeneratorExp = visit_ListComp  # type: ignore[assignment]

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])

    def _arguments_defaults(self, args: ast.arguments) -> None:
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None and arg.annotation is not None:
                self.visit(arg.annotation)


def _function_free_names(args: ast.arguments, body: list[ast.stmt] | list[ast.expr]) -> set[str]:
    """Names a function body reads that are not its parameters or locals."""
    params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared_global: set[str] = set()
    assigned: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Global):
                declared_global.update(node.names)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                assigned.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                assigned.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                assigned.update((a.asname or a.name.split(".")[0]) for a in node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                assigned.add(node.name)
    inner = _Reads(params | (assigned - declared_global))
    for stmt in body:
        inner.visit(stmt)
    return inner.reads | inner.deferred


def reads(source: str) -> set[str]:
    """Names a cell reads from the namespace it runs in (builtins included if used).

    >>> sorted(reads("for i in range(n):\\n    total = total + f(i)"))
    ['f', 'n', 'range', 'total']
    """
    tree = ast.parse(source)
    finder = _Reads()
    for stmt in tree.body:
        finder.visit(stmt)
    # a function defined here may read a name the cell assigns later; that one needs no shipping
    return finder.reads | (finder.deferred - finder.bound)


class UndefinedNames(DlschedError):
    """A cell reads names that exist neither in the cell nor in the notebook.

    Raised when the cell is submitted, not hours later in the job: after a kernel
    restart the cells that defined them have not run again.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        listed = ", ".join(names)
        them = "them" if len(names) > 1 else "it"
        super().__init__(
            f"the cell uses {listed}, not defined in this kernel (not assigned or imported in "
            f"the cell either); run the cells that define {them} first (after a kernel "
            "restart they are gone), or define it in this cell. Nothing was queued."
        )


def undefined(source: str, namespace: Mapping[str, Any]) -> list[str]:
    """Names the cell reads that nothing defines: neither the cell (anywhere in it, also
    later or in a branch), nor ``namespace``, nor the builtins.

    Lenient where Python is dynamic: a name the cell binds anywhere counts as defined,
    and a cell with ``from x import *`` or a magic (``%time y = f(x)`` may bind names) is
    not checked.

    >>> undefined("model = fit(x)\\nprint(model)", {"x": 1})
    ['fit']
    """
    tree = ast.parse(source)
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return []  # what a star import brings is known only when it runs
            bound.update((a.asname or a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
    read = reads(source)
    if "get_ipython" in read:
        return []  # a magic or shell line: what it binds is in a string
    return sorted(
        name
        for name in read
        if name not in bound
        and name not in namespace
        and not hasattr(builtins, name)
        and name not in IPYTHON_NAMES
        and not (name.startswith("__") and name.endswith("__"))
    )
