"""Notebook parameters: checked on submit, injected as papermill does.

>>> parse_parameter("n=21")
('n', 21)
>>> parse_parameter("name=resnet")
('name', 'resnet')
>>> injected_source({"n": 21, "lr": 3e-4})
'# Parameters\\nn = 21\\nlr = 0.0003\\n'
"""

from __future__ import annotations

import ast
import keyword
from typing import Any

from ..vocab.errors import SpecError

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
PARAMETERS_HELP = (
    "a dict of Python names to values a notebook cell can spell (numbers, strings, "
    "True/False/None, and lists, tuples and dicts of them), e.g. {'lr': 3e-4, 'epochs': 10}"
)


def parse_parameter(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` from a shell: VALUE as a Python literal if it is one, else the text.

    ``-p n=21`` gives the int 21, ``-p lr=3e-4`` a float, ``-p name=resnet`` (not a
    literal) the string ``"resnet"``; ``-p tag="'7'"`` the string ``"7"``.
    """
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not _is_name(name):
        raise SpecError("parameter", text, "NAME=VALUE with NAME a Python name, e.g. lr=3e-4")
    try:
        return name, ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return name, value


def check_parameters(parameters: object) -> dict[str, Any]:
    """The parameters as they will be injected; every value must survive ``repr``."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise SpecError("parameters", parameters, PARAMETERS_HELP)
    for name, value in parameters.items():
        if not isinstance(name, str) or not _is_name(name):
            raise SpecError("parameters", name, "keys that are Python names, such as lr")
        try:
            same = ast.literal_eval(repr(value)) == value
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            same = False
        if not same:
            raise SpecError(f"parameters[{name!r}]", value, PARAMETERS_HELP)
    return dict(parameters)


def injected_source(parameters: dict[str, Any]) -> str:
    """The source of the injected cell: one assignment a line, as papermill writes it."""
    lines = ["# Parameters"] + [f"{name} = {value!r}" for name, value in parameters.items()]
    return "\n".join(lines) + "\n"


def inject(nb: Any, parameters: dict[str, Any]) -> None:
    """Insert the ``injected-parameters`` cell after the cell tagged ``parameters`` (at the
    top when there is none); a previously injected cell is replaced, as papermill does."""
    from nbformat.v4 import new_code_cell

    if not parameters:
        return
    cells = [c for c in nb.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    cell = new_code_cell(injected_source(parameters), metadata={"tags": [INJECTED_TAG]})
    at = 0
    for i, existing in enumerate(cells):
        if PARAMETERS_TAG in existing.get("metadata", {}).get("tags", []):
            at = i + 1
            break
    cells.insert(at, cell)
    nb.cells = cells


def _is_name(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)
