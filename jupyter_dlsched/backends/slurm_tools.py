"""SLURM's command-line tools: running one, what its failure raises, and the nice of a priority.

Every part of the SLURM backend (``slurm.py``, ``slurm_submit.py``,
``slurm_follow.py``, ``slurm_monitor.py``) calls SLURM through ``run_tool``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

TOOLS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")
# a user may only lower their own jobs' SLURM priority (nice >= 0): the dlsched
# priority maps to a nice value, so that among one user's jobs low < normal < high
NICE_AT_ZERO = 100
MAX_NICE = 10000
TOOL_TIMEOUT = 30.0


class SlurmUnavailable(RuntimeError):
    """The SLURM tools are missing or the controller does not answer."""


class SlurmError(RuntimeError):
    """A SLURM command failed; the message carries what it printed."""


def run_tool(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """Run a SLURM command and return its output (``SlurmError`` with its message if it fails)."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as error:
        raise SlurmUnavailable(f"{argv[0]} is not on PATH: {error}") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {TOOL_TIMEOUT:g}s") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        last = message[-1] if message else f"exit {done.returncode}"
        # the tools name themselves ("sbatch: error: ..."): say the name once
        said = last if last.startswith(f"{argv[0]}: ") else f"{argv[0]}: {last}"
        raise SlurmError(said)
    return done.stdout


def nice_for(priority: int) -> int:
    """The ``--nice`` of a dlsched priority: ``high`` and above 0, ``normal`` 50, ``low`` 100."""
    return max(0, min(MAX_NICE, NICE_AT_ZERO - int(priority)))
