"""Notebook cells as jobs: which variables a cell reads, and how it runs in the job process.

``%%schedule`` ships only what a cell needs. ``reads(source)`` finds the names
the cell takes from the notebook (a name read before the cell assigns it, or
a free name of a function, class or comprehension defined in it);
``capture(source, namespace)`` picks those variables and checks that they can
travel (functions and classes defined in the notebook go by value through
cloudpickle). ``run_cell(payload)`` runs in the job process: it executes the
cell in a fresh namespace holding the shipped variables and returns a
``CellResult`` with the ``--out`` names and the value of a trailing expression.

>>> sorted(reads("y = model(x)\\nloss = y.mean()"))
['model', 'x']
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import linecache
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .errors import DlschedError

# names IPython puts into every notebook namespace; never worth shipping
_IPYTHON_NAMES = frozenset(
    {"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___", "_ih", "_oh", "_dh", "_i"}
)


class UnpicklableVariable(DlschedError):
    """A variable the cell reads cannot be sent to the job process.

    The message names the variable and says what to do instead.
    """

    def __init__(self, name: str, value: object, error: BaseException) -> None:
        self.name = name
        self.type_name = type(value).__name__
        super().__init__(
            f"variable {name!r} ({self.type_name}) cannot be sent to the job process "
            f"({type(error).__name__}: {error}); recreate it inside the cell, "
            "or run the cell in the kernel with --inline"
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

    >>> undefined("model = fit(x)\nprint(model)", {"x": 1})
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
        and name not in _IPYTHON_NAMES
        and not (name.startswith("__") and name.endswith("__"))
    )


def capture(source: str, namespace: Mapping[str, Any]) -> tuple[list[str], bytes]:
    """The names of the notebook variables the cell reads, and those variables pickled.

    They are pickled together, so objects shared between them (a model and its
    optimizer) stay shared in the job. Raises ``UnpicklableVariable`` naming the
    first variable that cannot travel.
    """
    names = sorted(
        n
        for n in reads(source)
        if n in namespace and n not in _IPYTHON_NAMES and not _is_ipython_history(n)
    )
    variables = {name: namespace[name] for name in names}
    try:
        return names, cloudpickle.dumps(variables)
    except Exception as whole:
        for name, value in variables.items():
            try:
                cloudpickle.dumps(value)
            except Exception as error:
                raise UnpicklableVariable(name, value, error) from error
        raise UnpicklableVariable(", ".join(names), variables, whole) from whole


def _is_ipython_history(name: str) -> bool:
    # _1, _i3, _ii ... are IPython's output and input history
    rest = name.lstrip("_")
    return name.startswith("_") and (rest.isdigit() or (rest[:1] == "i" and rest[1:].isdigit()))


def split_trailing_expression(source: str) -> tuple[ast.Module, ast.Expression | None]:
    """The cell body, and its last statement when it is an expression whose value is wanted.

    A trailing ``;`` silences the value, as in IPython.
    """
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(";"):
        last = tree.body.pop()
        return tree, ast.Expression(body=last.value)  # type: ignore[attr-defined]
    return tree, None


@dataclass
class CellResult:
    """What a scheduled cell sends back: the ``--out`` variables and its trailing value.

    ``missing`` lists ``--out`` names the cell never assigned; ``unsent`` maps
    names whose values could not be pickled back to the reason.
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    has_value: bool = False
    missing: list[str] = field(default_factory=list)
    unsent: dict[str, str] = field(default_factory=dict)
    # the job that produced it (results pickled before it was recorded have "")
    job_id: str = ""

    def returned(self) -> list[str]:
        """Names that came back, for the status line: ``['y', 'model']``."""
        return list(self.outputs)

    def __repr__(self) -> str:
        """Says what came back and how to get it into a notebook::

        CellResult(outputs: model, history — %dlsched wait k3x9m2ab brings them into this kernel)
        """
        parts = []
        if self.outputs:
            parts.append("outputs: " + ", ".join(self.outputs))
        if self.has_value:
            text = repr(self.value)
            parts.append(f"value: {text if len(text) <= 60 else text[:59] + '…'}")
        if self.missing:
            parts.append("not assigned by the cell: " + ", ".join(self.missing))
        if self.unsent:
            parts.append("could not come back: " + ", ".join(self.unsent))
        shown = "; ".join(parts) or "nothing sent back"
        if self.outputs:
            where = f"%dlsched wait {self.job_id}" if self.job_id else "%dlsched wait JOB_ID"
            them = "them" if len(self.outputs) > 1 else "it"
            shown += f" — {where} brings {them} into this kernel"
        return f"CellResult({shown})"


def execute(
    source: str, namespace: dict[str, Any], filename: str, outputs: Iterable[str] = ()
) -> CellResult:
    """Run a cell's Python source in ``namespace``; collect ``outputs`` and the trailing value."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    body, trailing = split_trailing_expression(source)
    exec(compile(body, filename, "exec"), namespace)
    result = CellResult()
    if trailing is not None:
        result.value = eval(compile(trailing, filename, "eval"), namespace)
        result.has_value = result.value is not None
    for name in outputs:
        if name in namespace:
            result.outputs[name] = namespace[name]
        else:
            result.missing.append(name)
    return result


def run_cell(payload: dict[str, Any]) -> CellResult:
    """The runner of a cell job, called in the job process (``local/jobproc.py``)."""
    variables = cloudpickle.loads(payload["variables"])
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = _no_ipython
    namespace.update(variables)
    report_tqdm_progress()
    result = execute(
        payload["source"], namespace, payload.get("filename", "<cell>"), payload.get("out", ())
    )
    result.job_id = os.environ.get("DLSCHED_JOB_ID", "")
    return _sendable(result)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+')


def user_traceback(tb: str) -> str:
    """A job's traceback with only the user's frames, the way a notebook cell shows it.

    Frames of this package (the job process, the runner, the magics) go, and so does
    everything above a scheduled cell's first frame. Headers, chained exceptions and the
    exception lines stay.
    """
    out: list[str] = []
    segment: list[tuple[str | None, list[str]]] = []  # (file of the frame or None, lines)

    def flush() -> None:
        files = [f for f, _ in segment if f is not None]
        first_cell = next((i for i, f in enumerate(files) if f.startswith("<scheduled cell")), 0)
        seen = 0
        for file, lines in segment:
            if file is not None:
                seen += 1
                if seen <= first_cell or file.startswith(_PACKAGE):
                    continue
            out.extend(lines)
        segment.clear()

    for line in tb.splitlines():
        match = _FRAME.match(line)
        if line.startswith("Traceback (most recent call last)"):
            flush()
            segment.append((None, [line]))
        elif match:
            segment.append((match.group("file"), [line]))
        elif line.startswith("    ") and segment and segment[-1][0] is not None:
            segment[-1][1].append(line)  # the frame's source line and its ^^^ markers
        else:
            segment.append((None, [line]))
    flush()
    return "\n".join(out)


def _sendable(result: CellResult) -> CellResult:
    """Drop values that cannot be pickled back, saying why, instead of failing the whole job."""
    for name, value in list(result.outputs.items()):
        try:
            cloudpickle.dumps(value)
        except Exception as error:
            del result.outputs[name]
            result.unsent[name] = f"{type(error).__name__}: {error}"
    if result.has_value:
        try:
            cloudpickle.dumps(result.value)
        except Exception as error:
            result.unsent["value"] = f"{type(error).__name__}: {error}"
            result.value, result.has_value = None, False
    return result


def _no_ipython() -> Any:
    raise RuntimeError(
        "IPython magics and shell commands (%magic, !cmd) do not run in a scheduled job's "
        "process; move them to another cell, or run this cell with %%schedule --inline"
    )


_tqdm_patched = False


def report_tqdm_progress() -> None:
    """Make ``tqdm`` bars in this process report their progress to the scheduler.

    Only the outermost bar (position 0) reports; throttling is ``progress``'s.
    """
    global _tqdm_patched
    if _tqdm_patched:
        return
    if "tqdm" not in sys.modules and importlib.util.find_spec("tqdm") is None:
        return
    import tqdm.std

    from .runtime import progress

    original_update = tqdm.std.tqdm.update
    original_close = tqdm.std.tqdm.close

    def report(bar: Any) -> None:
        if getattr(bar, "pos", 0) == 0 and not getattr(bar, "disable", False):
            metrics: dict[str, float] = {}
            postfix = getattr(bar, "postfix", None)
            if isinstance(postfix, str) and "=" in postfix:
                for item in postfix.split(","):
                    key, _, value = item.partition("=")
                    try:
                        metrics[key.strip()] = float(value)
                    except ValueError:
                        continue
            progress(bar.n, bar.total, **metrics)

    def update(self: Any, n: float | None = 1) -> Any:
        shown = original_update(self, n)
        report(self)
        return shown

    def close(self: Any) -> None:
        if not getattr(self, "disable", False) and getattr(self, "total", None):
            report(self)
        original_close(self)

    tqdm.std.tqdm.update = update
    tqdm.std.tqdm.close = close
    _tqdm_patched = True
