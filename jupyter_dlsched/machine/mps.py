"""Fractions of a GPU enforced by NVIDIA MPS, where the machine has it.

A job granted part of a GPU (``gpus=0.5``, ``gpu_mem=...``) runs as an MPS client with
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` at its memory grant and
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in proportion to its share: the driver holds it to
both, whatever the job's own allocator does. The pool starts one MPS control daemon per GPU
that has fractional jobs (``nvidia-cuda-mps-control -d``, its pipe and log folders in the
state folder, so no process outside the pool's jobs talks to it), as the user the jobs run
as, and stops it (``quit``) when the last of them ends.

One user per MPS GPU: an MPS control daemon serves one user's server at a time, and a
client of another user waits until every client of the first has ended. So in a shared pool
the daemon on a GPU belongs to the user whose fractional job started it; another user's
fractional job placed there while it runs is not an MPS client: it keeps today's cap and
watch (``dlt.device()``'s allocator cap, the supervisor's NVML watch), as every fractional
job does where MPS is not available (no ``nvidia-cuda-mps-control`` on PATH).
``sharing()`` says which applies to each GPU, for ``dlsched status``.

The supervisors of several jobs share a daemon; ``mps/gpuN/`` in the state folder holds
its owner (``daemon.json``), one file per client job (``jobs/``) and the lock they take.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .detach import not_a_subreaper

PROGRAM = "nvidia-cuda-mps-control"
MIB = 2**20
#: what ``sharing`` says of a GPU whose fractions are not held by MPS
CAP_AND_WATCH = "cap + watch"


def program() -> str | None:
    return shutil.which(PROGRAM)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class MpsDaemons:
    """The MPS control daemons of one pool's state folder.

    >>> env = MpsDaemons(home).join(job, uid=os.getuid())  # doctest: +SKIP
    >>> env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]  # doctest: +SKIP
    '0=4096M'
    """

    def __init__(self, home: str | os.PathLike[str]) -> None:
        self.root = Path(home) / "mps"

    def folder(self, gpu: int) -> Path:
        return self.root / f"gpu{gpu}"

    @contextmanager
    def _locked(self, gpu: int) -> Iterator[Path]:
        folder = self.folder(gpu)
        (folder / "jobs").mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield folder

    def _env(self, folder: Path, device: str) -> dict[str, str]:
        return {
            "CUDA_VISIBLE_DEVICES": device,
            "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
        }

    def join(
        self, job: Any, uid: int, device: str | None = None, mem_total: int | None = None
    ) -> dict[str, str]:
        """The environment that makes ``job`` an MPS client of its GPU's daemon, started
        for it when none runs; empty where its fraction stays cap + watch (not a fraction,
        no MPS here, or the GPU's daemon is another user's).

        ``device``: the GPU as the daemon and its clients name it (its UUID: an index
        would be renumbered by the daemon); ``mem_total``: its memory, for the share of a
        ``gpu_mem``-only grant.
        """
        placement = job.placement
        if placement is None or not placement.shared or len(placement.gpus) != 1:
            return {}
        found = program()
        if found is None:
            return {}
        gpu = int(placement.gpus[0])
        device = device or str(gpu)
        with self._locked(gpu) as folder:
            daemon = _read(folder / "daemon.json")
            if daemon is not None and int(daemon["uid"]) != uid:
                return {}  # one user per MPS GPU: this job keeps cap + watch
            env = self._env(folder, device)
            if daemon is None:
                self._start(found, folder, env, uid)
                _write(folder / "daemon.json", {"uid": uid, "user": _user(uid), "device": device})
            (folder / "jobs" / job.id).touch()
        grant = int(placement.gpu_mem[0]) if placement.gpu_mem else 0
        share = float(job.gpus) if 0 < float(job.gpus) < 1 else 0.0
        if not share and grant and mem_total:
            share = grant / mem_total
        if grant:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, grant // MIB)}M"
        if share:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, round(100 * share))))
        return env

    def _start(self, found: str, folder: Path, env: dict[str, str], uid: int) -> None:
        for name in ("pipe", "log"):
            (folder / name).mkdir(exist_ok=True, mode=0o700)
            if os.geteuid() == 0 and uid != 0:
                os.chown(folder / name, uid, -1)
        as_user: dict[str, Any] = {"user": uid} if os.geteuid() == 0 and uid != 0 else {}
        # the daemon is the GPU's, not the job's, and outlives the supervisor starting it:
        # it forks away while orphans go above this supervisor, out of the job's box
        with not_a_subreaper():
            started = subprocess.run(
                [found, "-d"],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
                **as_user,
            )
        if started.returncode != 0:
            said = (started.stderr or started.stdout).strip()
            raise OSError(f"{PROGRAM} -d failed ({started.returncode}): {said}")

    def leave(self, job_id: str, gpu: int, holding: Callable[[str], bool] | None = None) -> bool:
        """``job_id`` ended: stop its GPU's daemon when no client job is left (``holding``
        says whether another recorded job still holds its grant, so a crashed supervisor's
        job does not keep a daemon forever). True when the daemon was stopped."""
        if not self.folder(gpu).is_dir():
            return False
        with self._locked(gpu) as folder:
            (folder / "jobs" / job_id).unlink(missing_ok=True)
            for other in list((folder / "jobs").iterdir()):
                if holding is not None and not holding(other.name):
                    other.unlink(missing_ok=True)
            daemon = _read(folder / "daemon.json")
            if daemon is None or any((folder / "jobs").iterdir()):
                return False
            found = program()
            if found is not None:
                subprocess.run(
                    [found],
                    input="quit\n",
                    env={**os.environ, **self._env(folder, str(daemon.get("device") or gpu))},
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            (folder / "daemon.json").unlink(missing_ok=True)
            return True

    def sharing(self, gpus: list[int]) -> dict[int, str]:
        """How each GPU's fractions are enforced: ``MPS (user)`` while a daemon runs for
        its jobs, ``MPS`` where one would start, else ``cap + watch``."""
        out: dict[int, str] = {}
        available = program() is not None
        for gpu in gpus:
            daemon = _read(self.folder(gpu) / "daemon.json")
            if daemon is not None:
                out[gpu] = f"MPS ({daemon.get('user')})"
            else:
                out[gpu] = "MPS" if available else CAP_AND_WATCH
        return out


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
