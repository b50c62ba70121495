"""Inside the SLURM job: what runs on a compute node for one function or cell job.

``SlurmBackend`` hands ``run_task`` to ``submitit``, which pickles it, writes an
sbatch script and, on the node, calls it once per task (one task per GPU for a
distributed job). It sets up the job's environment, runs the payload and
*returns* an outcome tuple rather than raising, so the job's own traceback
reaches the ledger intact: ``("result", pickled)`` or
``("error", details, pickled_exception, exit_code)``. Nothing here writes to
the ledger except ``dls.progress``, when the node shares the ledger's disk.
Command jobs do not come here: they are plain sbatch scripts.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..inside.runtime import run_payload
from .remote_task import adopt_submit_context, error_outcome

# a job on one node talks to its ranks over loopback; the port is derived from the
# SLURM job id so two jobs sharing a node do not pick the same one
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 20000


def torchrun_environment(environ: dict[str, str]) -> dict[str, str]:
    """The variables torchrun would set, from SLURM's per-task ones.

    >>> torchrun_environment({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
    ...                       "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"})["RANK"]
    '1'
    """
    ntasks = environ.get("SLURM_NTASKS", "1")
    job = int(environ.get("SLURM_JOB_ID", "0") or 0)
    return {
        "RANK": environ.get("SLURM_PROCID", "0"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "GROUP_RANK": environ.get("SLURM_NODEID", "0"),
        "WORLD_SIZE": ntasks,
        "LOCAL_WORLD_SIZE": environ.get("SLURM_NTASKS_PER_NODE", ntasks),
        "MASTER_ADDR": "127.0.0.1",  # the backend keeps a distributed job on one node
        "MASTER_PORT": str(MASTER_PORT_BASE + job % MASTER_PORT_SPAN),
    }


def run_task(task: dict[str, Any]) -> tuple[Any, ...]:
    """One task of a SLURM job: the payload's outcome, never an exception."""
    os.environ.update(task["env"])
    os.environ["DLSCHED_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if task.get("distributed"):
        os.environ.update(torchrun_environment(dict(os.environ)))
    adopt_submit_context(task)
    import cloudpickle

    try:
        result = run_payload(task["payload"])
    except SystemExit as stop:
        if stop.code not in (0, None):
            return error_outcome(stop, stop.code if isinstance(stop.code, int) else 1)
        result = None
    except BaseException as error:
        return error_outcome(error, 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        return ("result", cloudpickle.dumps(result))
    except Exception as error:
        return error_outcome(TypeError(f"the job's result could not be pickled: {error}"), 1)
