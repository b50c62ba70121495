"""What a submission stores with each job, checked at the door: a job of kind ``command``
carries ``command.json`` (``{"argv": [...]}``, a non-empty list of strings), every other
kind a pickled payload (``payload.pkl``) and no command, and ``context.json`` (where it
runs: working folder, environment, import path) is a JSON object. A file the job process
could not read would otherwise be accepted here and fail the job when it starts, after it
had waited its turn; a raw request could give a ``kernel`` lease a command to run.

The payload's pickle is not read here: only the job process, as its owner, unpickles it.
"""

from __future__ import annotations

import json
from typing import Any

from ..vocab.errors import SpecError

ARGV = "a non-empty list of strings, e.g. ['python', 'train.py']"


def check_job_files(kind: str, files: dict[str, bytes], *, inline: bool = False) -> None:
    """Refuse ``files`` a job of ``kind`` cannot run with; ``SpecError`` names the field."""
    command = files.get("command.json")
    if kind == "command":
        if command is None:
            raise SpecError("command.json", None, f"a command: {{'argv': {ARGV}}}")
        argv = _json(command, "command.json", f"JSON: {{'argv': {ARGV}}}").get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and a and "\0" not in a for a in argv)
        ):
            raise SpecError("argv", argv, ARGV)
        if "payload.pkl" in files:
            raise SpecError("payload.pkl", "...", "no payload for a command (its argv runs)")
    else:
        if command is not None:
            raise SpecError("command.json", "...", f"no command for a job of kind {kind!r}")
        if not inline and not files.get("payload.pkl"):
            raise SpecError("payload.pkl", None, f"the pickled function a {kind} job runs")
    context = files.get("context.json")
    if context is not None:
        _check_context(_json(context, "context.json", "a JSON object (cwd, env, sys_path)"))


def _check_context(context: dict[str, Any]) -> None:
    """The fields the job process reads, of the types it reads them as."""
    for field in ("cwd", "executable"):
        value = context.get(field)
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise SpecError(f"context.{field}", value, "a path")
    env = context.get("env")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise SpecError("context.env", env, "a mapping of names to strings")
    path = context.get("sys_path")
    if path is not None and (
        not isinstance(path, list) or not all(isinstance(p, str) for p in path)
    ):
        raise SpecError("context.sys_path", path, "a list of folders")


def _json(data: bytes, field: str, allowed: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise SpecError(field, data[:40].decode("utf-8", "replace"), allowed) from None
    if not isinstance(value, dict):
        raise SpecError(field, value, allowed)
    return value
