"""Suspending a GPU kernel with NVIDIA's ``cuda-checkpoint`` instead of shutting it down.

``cuda-checkpoint --toggle --pid PID`` (driver 550 and newer) moves a process's device
memory to host memory and releases its GPU; the same call brings it back. Only the check
is here: the reclaim does not suspend yet, because this was never run on a GPU machine
(unverified). ``available()`` says whether this machine could.

>>> available()  # doctest: +SKIP
(False, 'no cuda-checkpoint program on PATH')
"""

from __future__ import annotations

import shutil
import subprocess


def available() -> tuple[bool, str]:
    """Whether ``cuda-checkpoint`` is installed and answers, with the reason if not."""
    program = shutil.which("cuda-checkpoint")
    if program is None:
        return False, "no cuda-checkpoint program on PATH"
    try:
        out = subprocess.run(
            [program, "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"cuda-checkpoint does not run: {error}"
    if "--toggle" not in out.stdout + out.stderr:
        return False, "cuda-checkpoint lacks --toggle (needs NVIDIA driver 550 or newer)"
    return True, program
