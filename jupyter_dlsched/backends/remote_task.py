"""What a job's process does first on a node the scheduler does not run on (Ray, SLURM):
take the submitter's context, and turn how the payload ended into an outcome to send back."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any


def adopt_submit_context(task: dict[str, Any]) -> None:
    """The ledger (where this node shares its disk), the submitter's folder and ``sys.path``."""
    home = task["home"]
    if os.path.exists(os.path.join(home, "ledger.sqlite")):
        os.environ["DLSCHED_HOME"] = home  # progress() reaches the ledger on a shared disk
    else:
        os.environ.pop("DLSCHED_HOME", None)
    cwd = task.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    for entry in reversed(task.get("sys_path") or []):
        if entry not in sys.path and os.path.isdir(entry):
            sys.path.insert(0, entry)


def error_outcome(error: BaseException, code: int) -> tuple[Any, ...]:
    """``("error", details, pickled exception or None, exit code)``; the traceback to stderr."""
    import cloudpickle

    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stderr.write(text)
    details = {"type": type(error).__name__, "message": str(error), "traceback": text}
    try:
        pickled: bytes | None = cloudpickle.dumps(error)
    except Exception:
        pickled = None
    return ("error", details, pickled, code)
