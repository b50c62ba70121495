"""Submitting queued ledger jobs to SLURM: commands through ``sbatch``, functions and
cells through ``submitit`` (what runs on the node is ``slurm_task.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from ..vocab import private
from ..vocab.errors import IllegalTransition, JobNotFound, SpecError
from ..vocab.schema import RunEnd
from .slurm_tools import nice_for, run_tool
from .slurm_track import ACTIVE, MonitorBase, Track, _read_slurm_file

# variables of the submitting process that describe it, not the job
DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "DLSCHED_DEVICES", "DLSCHED_JOB_ID", "DLSCHED_GPU_MEM")
DROPPED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_")


class SlurmSubmitter(MonitorBase):
    """The monitor's part that hands each queued job to SLURM."""

    def _submit(self) -> None:
        with self._lock:
            waiting = [t for t in self._tracks.values() if t.slurm_id is None]
        for track in waiting:
            try:
                job = self.store.get(track.job_id)
            except JobNotFound:
                continue
            if job.state not in ("queued", "preempted"):
                continue
            dependencies = self._dependencies(job)
            if dependencies is None:
                continue  # a dependency is not in SLURM yet, or the tick fails the job
            try:
                options = self.backend.sbatch_options(job)
                if dependencies:
                    options.append(f"--dependency=afterok:{':'.join(dependencies)}")
                if job.kind == "command":
                    self._submit_command(track, job, options)
                else:
                    self._submit_function(track, job, options)
            except (SpecError, RuntimeError, OSError) as error:
                self._fail_unsubmitted(track, f"SLURM did not accept the job: {error}")
                continue
            track.nice = nice_for(job.priority)
            self._save(track)
            self._note(track, f"submitted to SLURM as job {track.slurm_id}")
            self._last_change = time.monotonic()

    def _dependencies(self, job: Any) -> list[str] | None:
        """SLURM ids for ``afterok`` (``None``: not every dependency can be named yet)."""
        ids: list[str] = []
        states = self.store.states(list(job.after))
        for dep in job.after:
            state = states.get(dep)
            if state == "succeeded":
                continue
            if state not in ACTIVE:
                return None
            slurm_id = _read_slurm_file(self.store.spool(dep))
            if slurm_id is None:
                return None
            ids.append(slurm_id)
        return ids

    def _context(self, job: Any) -> tuple[dict[str, Any], dict[str, str]]:
        """The submitter's working folder and import path, and the job's environment."""
        context = json.loads(self.store.read_file(job.id, "context.json") or b"{}")
        env = {
            k: v
            for k, v in {**context.get("env", {}), **job.env}.items()
            if k not in DROPPED_ENV and not k.startswith(DROPPED_ENV_PREFIXES)
        }
        threads = str(max(1, int(job.cpus)))
        env.update(
            DLSCHED_JOB_ID=job.id,
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            OPENBLAS_NUM_THREADS=threads,
        )
        return context, env

    def _submit_function(self, track: Track, job: Any, options: list[str]) -> None:
        payload = self.store.read_file(job.id, "payload.pkl")
        if payload is None:
            raise SpecError("payload", None, "the job's payload, which is missing from the ledger")
        context, env = self._context(job)
        from .slurm_task import run_task

        executor = _executor(self.backend.python or sys.executable, track.folder, options)
        task = {
            "payload": payload,
            "env": env,
            "home": str(self.store.home),
            "cwd": context.get("cwd"),
            "sys_path": context.get("sys_path") or [],
            "distributed": bool(job.distributed and job.gpus >= 1),
        }
        submitted = executor.submit(run_task, task)
        track.slurm_id, track.via = str(submitted.job_id), "submitit"
        track.tasks = int(job.gpus) if task["distributed"] else 1

    def _submit_command(self, track: Track, job: Any, options: list[str]) -> None:
        raw = self.store.read_file(job.id, "command.json") or b"{}"
        argv = json.loads(raw).get("argv")
        if not argv:
            raise SpecError("argv", None, "the job's command, which is missing from the ledger")
        context, env = self._context(job)
        folder = private.private_subfolder(track.folder / "slurm")
        script = folder / "job.sh"
        home = shlex.quote(str(self.store.home))
        lines = [
            "#!/bin/sh",
            'export DLSCHED_DEVICES="${CUDA_VISIBLE_DEVICES:-}"',
            f"[ -f {home}/ledger.sqlite ] && export DLSCHED_HOME={home}",
        ]
        command = " ".join(shlex.quote(a) for a in argv)
        if job.distributed and job.gpus >= 1:
            # one task per GPU, each with the variables torchrun would set
            lines += [
                "export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
                "exec srun --unbuffered sh -c 'export RANK=$SLURM_PROCID "
                "LOCAL_RANK=$SLURM_LOCALID GROUP_RANK=$SLURM_NODEID WORLD_SIZE=$SLURM_NTASKS "
                'LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE; exec "$@"\' dlsched-rank ' + command,
            ]
        else:
            lines.append(f"exec {command}")
        private.write_file(script, ("\n".join(lines) + "\n").encode())
        cwd = context.get("cwd")
        if cwd and os.path.isdir(cwd):
            options = [*options, f"--chdir={cwd}"]
        # the job gets the submitter's environment: sbatch exports its own (--export=ALL)
        sbatch_env = dict(env)
        for key in ("SLURM_CONF", "PATH"):
            if key in os.environ:
                sbatch_env.setdefault(key, os.environ[key])
        if "SLURM_CONF" in os.environ:
            sbatch_env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        out = run_tool(
            ["sbatch", "--parsable", f"--output={folder}/%j.out", *options, str(script)],
            env=sbatch_env,
        )
        track.slurm_id, track.via, track.tasks = out.strip().split(";")[0], "sbatch", 1

    def _fail_unsubmitted(self, track: Track, why: str) -> None:
        with contextlib.suppress(IllegalTransition, JobNotFound):
            track.lease.end_followed(RunEnd("failed", why[:500], retry=False), time.time())
        self._note(track, why)
        with self._lock:
            self._tracks.pop(track.job_id, None)


def _executor(python: str, folder: Path, options: list[str]) -> Any:
    """A submitit executor whose sbatch call carries exactly our options.

    submitit writes a ``--time`` (5 minutes unless told) and a ``--signal`` of its own;
    both go, so a job without a time limit gets the partition's default. Options on
    the sbatch command line take precedence over the script's ``#SBATCH`` lines.
    """
    try:
        import submitit
    except ImportError as error:
        raise ImportError(
            "the SLURM backend runs functions and cells through submitit: "
            "pip install 'jupyter-dlsched[slurm]'"
        ) from error

    class Executor(submitit.SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            text = super()._make_submission_file_text(command, uid)
            dropped = ("#SBATCH --time=", "#SBATCH --signal=")
            return "\n".join(line for line in text.splitlines() if not line.startswith(dropped))

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return ["sbatch", *options, str(submission_file_path)]

    executor = Executor(folder=private.private_subfolder(folder / "slurm"), python=python)
    executor.update_parameters(stderr_to_stdout=True)
    return executor
