"""Notebook cells as jobs: the variables a cell reads captured to travel, and the cell run
in the job process.

``capture(source, namespace)`` picks the variables the cell reads (``reads``, in
``jupyter_dlsched.notebook.cell_names``) and checks that they can travel (functions and classes
defined in the notebook go by value through cloudpickle). ``run_cell(payload)`` runs in
the job process: it executes the cell in a fresh namespace holding the shipped
variables and returns a ``CellResult`` with the ``--out`` names and the value of a
trailing expression (a failure shows as the cell's own: ``vocab.tracebacks``).

>>> names, _ = capture("y = model(x)", {"model": abs, "x": -2, "z": 0})
>>> names
['model', 'x']
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import linecache
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ..client.data import check_picklable
from ..vocab.errors import DlschedError
from .cell_names import IPYTHON_NAMES, reads


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


def capture(source: str, namespace: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The names of the notebook variables the cell reads, and those variables.

    They travel in the job's payload, pickled together, so objects shared between them (a
    model and its optimizer) stay shared in the job, and their big buffers go out of band
    (``store/buffers.py``). Raises ``UnpicklableVariable`` naming the first variable that
    cannot travel (tried without writing or copying a buffer).
    """
    names = sorted(
        n
        for n in reads(source)
        if n in namespace and n not in IPYTHON_NAMES and not _is_ipython_history(n)
    )
    variables = {name: namespace[name] for name in names}
    try:
        check_picklable(variables)
        return names, variables
    except Exception as whole:
        for name, value in variables.items():
            try:
                check_picklable(value)
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
    variables = payload["variables"]
    if isinstance(variables, bytes):  # pickled apart, by a client before the data path
        variables = cloudpickle.loads(variables)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = _no_ipython
    namespace.update(variables)
    report_tqdm_progress()
    result = execute(
        payload["source"], namespace, payload.get("filename", "<cell>"), payload.get("out", ())
    )
    result.job_id = os.environ.get("DLSCHED_JOB_ID", "")
    return _sendable(result)


def _sendable(result: CellResult) -> CellResult:
    """Drop values that cannot be pickled back, saying why, instead of failing the whole job."""
    for name, value in list(result.outputs.items()):
        try:
            check_picklable(value)
        except Exception as error:
            del result.outputs[name]
            result.unsent[name] = f"{type(error).__name__}: {error}"
    if result.has_value:
        try:
            check_picklable(result.value)
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

    from ..inside.runtime import progress

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
