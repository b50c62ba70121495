"""What a submission takes from the process that submits it: where it comes from, and
the working folder, import path and environment its job process gets."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# variables that describe the submitting kernel, not the job
_ENV_DROP = (
    "DLSCHED_JOB_ID",
    "DLSCHED_DEVICES",
    "DLSCHED_GPU_MEM",
    "CUDA_VISIBLE_DEVICES",
    # a GPU kernel's own lease (docs/kernels.md): a job it submits is not that kernel
    "DLSCHED_KERNEL_LEASE",
    "DLSCHED_KERNEL_JOB",
)


def origin() -> str:
    """Where a submission comes from: the notebook path in a Jupyter kernel, else the program."""
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        return session
    if "ipykernel" in sys.modules:
        return "notebook"
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


def submit_context() -> dict[str, Any]:
    """Working folder, import path and environment a job process will get."""
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    if env.get("MPLBACKEND", "").startswith("module://"):
        env.pop("MPLBACKEND")  # an inline backend means nothing in a background process
    return {
        "cwd": os.getcwd(),
        "sys_path": [p for p in sys.path if p],
        "env": env,
        # a shared pool runs the job in this interpreter (as its owner), not in the service's
        "executable": sys.executable,
    }
