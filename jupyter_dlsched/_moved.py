"""The modules that moved into rooms still import under their old dotted names.

A ledger written before the package had rooms holds pickles (payloads, results) that name
``jupyter_dlsched.runtime`` or ``jupyter_dlsched.spec``; code outside the package may
import them too. Each old name resolves to the very module at its new place (one module
object, so classes stay identical), and nothing is imported until the old name is asked.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old dotted name → the module's place now
MOVED = {
    f"jupyter_dlsched.{old}": f"jupyter_dlsched.{new}"
    for old, new in {
        **{
            m: f"vocab.{m}"
            for m in (
                "errors",
                "units",
                "when",
                "resources",
                "placement",
                "spec",
                "options",
                "schema",
                "migrations",
                "words",
                "private",
                "history",
                "sweep",
            )
        },
        "schedules.every": "vocab.every",
        "schedules.info": "vocab.schedule_info",
        "settings": "store.settings",
        "port": "backends.port",
        "pool": "machine.inventory",
        **{m: f"machine.{m}" for m in ("nvml", "gpu_watch", "pool_view", "sampling", "metrics")},
        **{m: f"inside.{m}" for m in ("runtime", "checkpoint", "job_device")},
        **{
            m: f"client.{m}"
            for m in (
                "scheduler",
                "handle",
                "following",
                "default",
                "context",
                "inline",
            )
        },
        **{
            m: f"notebook.{m}"
            for m in (
                "magics",
                "cells",
                "cell_jobs",
                "cell_names",
                "ipython_errors",
            )
        },
        "start_times": "forecast.start_times",
    }.items()
}


class OldNames:
    """Finds an old name and loads it as the module at its new place: a meta path finder
    and its loader (by their methods: ``importlib.abc`` would import ``importlib.resources``,
    ``tempfile`` and ``shutil`` into every process that imports the package)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        # a loader by its methods (create_module, exec_module), which the stubs do not see
        return importlib.util.spec_from_loader(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # the import system hands back whatever sys.modules holds under the name once
        # this returns: the module at its new place, not the empty one made for the spec
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def install() -> None:
    """Let the old names import (once per process)."""
    if not any(isinstance(finder, OldNames) for finder in sys.meta_path):
        sys.meta_path.append(OldNames())
