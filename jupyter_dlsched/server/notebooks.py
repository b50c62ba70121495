"""REST for the JupyterLab "Run in the queue…" dialog: the resource options the dialog
shows (``GET options``, from the one options table) and submitting a notebook of the
server's folder as a job (``POST notebooks``), as ``dls.submit_notebook`` does."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import tornado.web

from ..nbjobs.params import parse_parameter
from ..vocab.errors import SpecError
from ..vocab.options import FLAG_OPTIONS
from .handlers import API_PREFIX, ApiError, DlschedHandler, scheduler_errors

#: the body's fields besides the resource options
_FIELDS = {"path", "parameters", "output", "kernel"}


def dialog_options() -> list[dict[str, Any]]:
    """The resource options a dialog can offer (repeatable ``NAME=PATH`` ones left out)."""
    return [
        {
            "name": o.name,
            "flag": o.flag,
            "help": o.help,
            "metavar": o.metavar,
            "switch": o.switch,
        }
        for o in FLAG_OPTIONS
        if not o.pairs
    ]


class OptionsHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.send({"options": dialog_options()})


class NotebookSubmitHandler(DlschedHandler):
    @tornado.web.authenticated
    def post(self) -> None:
        body = self.json_body(example='{"path": "train.ipynb", "parameters": "lr=3e-4", "gpus": 1}')
        allowed = _FIELDS | {o["name"] for o in dialog_options()}
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise ApiError(
                400, f"unknown field {unknown[0][:40]!r}: expected {', '.join(sorted(allowed))}"
            )
        root = Path(self.dlsched.root_dir or os.getcwd()).expanduser().resolve()
        source = self._under_root(root, body.get("path"), "path")
        output = body.get("output")
        target = self._under_root(root, output, "output") if output else None
        resources = _resources(body)
        with scheduler_errors():
            parameters = _parameters(body.get("parameters"))
            handle = self.dlsched.scheduler.submit_notebook(
                source,
                parameters=parameters,
                output=target,
                kernel=body.get("kernel") or None,
                **resources,
            )
        self.send({"job": self.dlsched.job_json(handle.id)}, status=201)

    @staticmethod
    def _under_root(root: Path, value: object, field: str) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise ApiError(400, f"{field} is missing: the notebook's path in the server's folder")
        path = (root / value.strip().lstrip("/")).resolve()
        if path != root and root not in path.parents:
            raise ApiError(400, f"{field}={value[:80]!r} is outside the server's folder")
        return path


def _resources(body: dict[str, Any]) -> dict[str, Any]:
    """The resource options of the body; a text value is read as its flag's text is by
    ``dlsched submit`` (``"3"`` retries is 3, ``"a,b"`` after is two ids)."""
    by_name = {o.name: o for o in FLAG_OPTIONS}
    resources: dict[str, Any] = {}
    for name, value in body.items():
        if name in _FIELDS or value in (None, "", False):
            continue
        option = by_name[name]
        if isinstance(value, str) and option.convert is not None:
            try:
                value = option.convert(value.strip())
            except argparse.ArgumentTypeError as error:
                raise ApiError(400, f"{name}={value[:40]!r}: {error}") from None
        resources[name] = value
    return resources


def _parameters(value: object) -> dict[str, Any]:
    """Parameters as a dict, or as ``NAME=VALUE`` lines read as ``dlsched submit -p`` reads them."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise SpecError("parameters", value, "NAME=VALUE lines, or an object of names to values")
    return dict(parse_parameter(line) for line in value.splitlines() if line.strip())


HANDLERS: list[tuple[str, type[DlschedHandler]]] = [
    (f"{API_PREFIX}/options", OptionsHandler),
    (f"{API_PREFIX}/notebooks", NotebookSubmitHandler),
]
