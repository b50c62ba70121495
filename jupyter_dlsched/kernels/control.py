"""The control folder a kernel's provisioner, its lease and the kernel itself share.

One private folder per kernel (``<Jupyter runtime dir>/dlsched-kernels/<kernel id>``),
small JSON files written whole (a temporary file renamed into place), so a reader never
sees half of one. Who writes what:

==================  ===============  ==========================================================
file                written by       says
==================  ===============  ==========================================================
``grant.json``      the lease        the job's id and the environment its grant gives a process
``kernel.json``     the provisioner  the kernel's pid and the Jupyter server's pid
``restarting``      the provisioner  the kernel is being restarted: keep the lease
``released``        the provisioner  the kernel was shut down: end the lease now
``activity.json``   the kernel       whether a cell runs, and when the last one started or ended
``warning.json``    the lease        idle while others wait: reclaimed at ``reclaim_at``
``ended.json``      the lease        why the lease ended (``reclaimed``, ``suspended``, ...)
``lease.json``      the provisioner  the lease's request, queued again by a suspended kernel
``suspended.json``  the lease        the kernel was suspended: its pid, GPUs, memory held
``restored.json``   the lease        the next lease restored the kernel (its job id)
==================  ===============  ==========================================================

Beside the kernels' folders, in the base folder: ``imports.json`` (what GPU kernels
imported, written by ``activity.py``, imported ahead by the spare kernels), ``spares/``
(each waiting spare's ``<pid>.json``, ``spare.py``) and ``imports.dropped``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

#: The environment variable naming the control folder inside a GPU kernel.
LEASE_ENV = "DLSCHED_KERNEL_LEASE"
#: What the lease copies from its own environment into the kernel's: a grant, as jobs get it.
GRANT_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "DLSCHED_DEVICES",
    "DLSCHED_GPU_MEM",
    "OMP_NUM_THREADS",
)


def base_folder() -> Path:
    """The private folder that holds every kernel's control folder, the spare kernels'
    state (``spares/``) and the modules GPU kernels imported (``imports.json``)."""
    from jupyter_core.paths import jupyter_runtime_dir

    base = Path(jupyter_runtime_dir()) / "dlsched-kernels"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def runtime_folder(kernel_id: str) -> Path:
    """A new (or this kernel's existing) private control folder."""
    folder = base_folder() / kernel_id
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def write(folder: Path, name: str, data: dict[str, Any]) -> None:
    """Write ``name`` whole: readers see the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, folder / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read(folder: Path, name: str) -> dict[str, Any] | None:
    """The file's data, or None when it is not there (or not JSON)."""
    try:
        data = json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mark(folder: Path, name: str) -> None:
    (folder / name).touch()


def marked(folder: Path, name: str) -> bool:
    return (folder / name).exists()


def unmark(folder: Path, name: str) -> None:
    try:
        (folder / name).unlink()
    except FileNotFoundError:
        pass
