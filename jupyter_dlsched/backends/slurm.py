"""The SLURM backend: the same ledger, with jobs run as SLURM jobs on a cluster.

Here SLURM decides (order, placement, fair share across the cluster's users);
the ledger mirrors what it reports. Read top to bottom:

1. ``SlurmBackend.__init__`` checks that the SLURM tools are on ``PATH`` and hands
   the scheduler a policy (``SlurmPolicy``) that starts nothing itself: a queued
   job waits in SLURM, with SLURM's reason (``Resources``, ``Priority``, ...);
2. ``inventory`` / ``pool`` describe the partition's nodes and GPUs from ``sinfo``,
   marked as a SLURM cluster;
3. a monitor thread (``slurm_monitor.py``) submits each queued job: functions and
   cells through ``submitit`` (the code that runs on the node is ``slurm_task.py``),
   commands through ``sbatch``; it then follows them with ``squeue --json`` (and
   ``scontrol show job`` once a job has left ``squeue``; ``sacct`` is not needed),
   moves them to ``running`` when SLURM starts them, streams their output into
   ``spool/<id>/log`` and records how they ended, with ``result.pkl`` /
   ``error.json`` so ``JobHandle.result()`` works unchanged;
4. ``cancel`` is ``scancel``; a priority change is ``scontrol update Nice=``;
5. ``close`` stops following. SLURM jobs keep running; the next participant with
   a SLURM backend on the same ledger takes them over (their state is in
   ``spool/<id>/slurm.json``).

>>> s = dls.Scheduler(backend="slurm", partition="gpu", account="lab")  # doctest: +SKIP
>>> s.submit(train, 1e-3, gpus=1, time_limit="2h").result()  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..machine.inventory import GpuInfo, PoolInfo
from ..policy import Decisions, QueuedJob, RunningJob
from ..store import JobInfo
from ..vocab.errors import SpecError
from ..vocab.resources import Capacity
from ..vocab.spec import JobSpec
from ..vocab.units import parse_size
from .base import Backend
from .slurm_monitor import SlurmMonitor
from .slurm_tools import TOOLS, SlurmUnavailable, nice_for, run_tool

if TYPE_CHECKING:
    from .port import Port

PARTITION_ENV = "DLSCHED_SLURM_PARTITION"
ACCOUNT_ENV = "DLSCHED_SLURM_ACCOUNT"
QOS_ENV = "DLSCHED_SLURM_QOS"
EXTRA_ENV = "DLSCHED_SLURM_EXTRA"
GPU_MEM_ENV = "DLSCHED_SLURM_GPU_MEM"
NO_SHARDS = (
    "a whole number of GPUs: this SLURM partition offers no GPU shards "
    "(GresTypes=shard), so a share of a GPU cannot be requested; ask for "
    "gpus=1, or ask the admins for shards"
)
# sinfo does not report GPU memory; shares and gpu_mem requests need a card size
DEFAULT_GPU_MEM = 16 * 2**30


@dataclass
class SlurmPoolInfo(PoolInfo):
    """A pool that is a SLURM partition: ``cluster`` names it and lists its nodes."""

    cluster: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["cluster"] = self.cluster
        return data

    def __repr__(self) -> str:
        nodes = self.cluster.get("nodes", [])
        head = (
            f"SLURM cluster, partition {self.cluster.get('partition') or '(default)'}: "
            + ", ".join(f"{n['name']} ({n['state']}, {n['gpus']} GPU)" for n in nodes)
        )
        return head + "\n" + super().__repr__()


class SlurmPolicy:
    """The policy when SLURM decides: start nothing here, say why each job waits.

    Pure over what the monitor last read from ``squeue`` (``reasons``).
    """

    name = "slurm"

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        waiting = {j.id: self.reasons.get(j.id, "being submitted to SLURM") for j in queued}
        return Decisions(waiting=waiting, order=[])


class SlurmBackend(Backend):
    """Jobs run as SLURM jobs; SLURM orders and places them, the ledger mirrors it.

    ``partition``, ``account``, ``qos``: where the jobs go (default
    ``$DLSCHED_SLURM_PARTITION`` and so on, else SLURM's own defaults). ``extra``:
    further sbatch options for every job (a list, or one string split like a
    shell would; default ``$DLSCHED_SLURM_EXTRA``), e.g. ``["--constraint=a100"]``.
    ``gpu_mem``: the memory of the partition's GPUs, used to size ``gpu_mem=``
    requests (sinfo does not report it; default 16 GiB). ``poll``: the longest
    wait between two ``squeue`` calls, in seconds (shorter just after a change).
    ``python``: the interpreter that runs function and cell jobs on the nodes
    (default: this one, which must be reachable there, e.g. on a shared disk).
    """

    name = "slurm"

    def __init__(
        self,
        port: Port | None = None,
        partition: str | None = None,
        account: str | None = None,
        qos: str | None = None,
        extra: str | Sequence[str] | None = None,
        *,
        gpu_mem: int | str | None = None,
        poll: float = 5.0,
        python: str | None = None,
    ) -> None:
        super().__init__(None)
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise SlurmUnavailable(
                f"the SLURM backend needs {', '.join(missing)} on PATH: run it on a login "
                "node of the cluster (or install slurm-client and point SLURM_CONF at its "
                "slurm.conf)"
            )
        self.partition = partition or os.environ.get(PARTITION_ENV) or None
        self.account = account or os.environ.get(ACCOUNT_ENV) or None
        self.qos = qos or os.environ.get(QOS_ENV) or None
        extra = extra if extra is not None else os.environ.get(EXTRA_ENV, "")
        self.extra = shlex.split(extra) if isinstance(extra, str) else list(extra)
        bad = [o for o in self.extra if not o.startswith("-")]
        if bad:
            raise SpecError("extra", bad[0], 'sbatch options such as "--constraint=a100"')
        size = gpu_mem if gpu_mem is not None else os.environ.get(GPU_MEM_ENV)
        self.gpu_mem = parse_size(size, "gpu_mem") if size is not None else DEFAULT_GPU_MEM
        if not poll > 0:
            raise SpecError("poll", poll, "a positive number of seconds")
        self.poll = float(poll)
        self.python = python
        self.slurm_policy = SlurmPolicy()
        self.monitor = SlurmMonitor(self)
        if port is not None:
            self.bind(port)

    def bind(self, port: Port) -> None:
        super().bind(port)
        self.monitor.start()

    def policy(self) -> SlurmPolicy:
        # SLURM decides which job starts: the scheduler's tick only records why jobs wait
        return self.slurm_policy

    def check(self, spec: JobSpec) -> None:
        super().check(spec)  # no stage_in: the cache is on this machine
        if 0 < spec.request.gpus < 1 and not self._shards_per_gpu():
            raise SpecError("gpus", spec.request.gpus, NO_SHARDS)

    # -- the pool ----------------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, Any]]:
        """The partition's nodes from ``sinfo``: name, state, CPUs, memory, GPUs, shards."""
        argv = ["sinfo", "--noheader", "--Node", "--format=%N|%c|%m|%G|%t|%C|%P"]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        nodes: dict[str, dict[str, Any]] = {}
        for line in run_tool(argv).splitlines():
            parts = line.strip().split("|")
            if len(parts) != 7 or parts[0] in nodes:
                continue  # a node in several partitions is listed once per partition
            name, cpus, mem, gres, state, alloc, _ = parts
            counts = _gres_counts(gres)
            allocated = alloc.split("/")
            nodes[name] = {
                "name": name,
                "cpus": int(cpus.rstrip("+") or 0),
                "cpus_allocated": int(allocated[0]) if allocated[0].isdigit() else 0,
                "mem_total": int(mem.rstrip("+") or 0) * 2**20,
                "gpus": counts.get("gpu", 0),
                "shards": counts.get("shard", 0),
                "state": state.rstrip("*~#!%$@^-"),
            }
        return [nodes[n] for n in sorted(nodes)]

    def inventory(self) -> dict[str, Any]:
        nodes = self._nodes()
        gpus: list[dict[str, Any]] = []
        for group, node in enumerate(nodes):
            for local in range(node["gpus"]):
                gpus.append(
                    {
                        "index": len(gpus),
                        "uuid": f"slurm-{node['name']}-{local}",
                        "name": f"GPU {local} on {node['name']}",
                        "mem_total": self.gpu_mem,
                        "simulated": False,
                        "group": group,
                        "node": node["name"],
                        "local": local,
                    }
                )
        shards = [n["shards"] // n["gpus"] for n in nodes if n["gpus"] and n["shards"]]
        return {
            "cpus": sum(n["cpus"] for n in nodes),
            "mem_total": sum(n["mem_total"] for n in nodes),
            "gpus": gpus,
            "nodes": [{k: n[k] for k in ("name", "cpus", "mem_total", "gpus")} for n in nodes],
            "cluster": "slurm",
            "partition": self.partition,
            "shards_per_gpu": min(shards) if shards else 0,
        }

    def pool(self) -> SlurmPoolInfo:
        """The partition now: nodes and their state, CPUs in use, each GPU with our jobs on it."""
        assert self.port is not None
        nodes = self._nodes()
        inventory = self.port.inventory
        gpus = [
            GpuInfo(g["index"], g["uuid"], g["name"], g["mem_total"], group=g.get("group"))
            for g in inventory.get("gpus", [])
        ]
        for job in self.port.store.jobs(states=["running"]):
            if job.backend != self.name or not job.placement:
                continue
            for index in job.placement.gpus:
                if index < len(gpus):
                    gpus[index].jobs.append(job.id)
                    gpus[index].mem_used = gpus[index].mem_total
        cpus = sum(n["cpus"] for n in nodes)
        busy = sum(n["cpus_allocated"] for n in nodes)
        mem_total = sum(n["mem_total"] for n in nodes)
        return SlurmPoolInfo(
            cpus=cpus,
            cpu_percent=100.0 * busy / cpus if cpus else 0.0,
            mem_total=mem_total,
            mem_used=0,
            mem_available=mem_total,
            gpus=gpus,
            gpu_error=None if gpus else "the SLURM partition has no GPUs (no gpu GRES)",
            cluster={
                "kind": "slurm",
                "partition": self.partition,
                "nodes": [
                    {k: n[k] for k in ("name", "state", "cpus", "cpus_allocated", "gpus")}
                    for n in nodes
                ],
            },
        )

    # -- what a job asks SLURM for ------------------------------------------------------------

    def _shards_per_gpu(self) -> int:
        assert self.port is not None
        return int(self.port.inventory.get("shards_per_gpu") or 0)

    def sbatch_options(self, job: JobInfo) -> list[str]:
        """The sbatch options of ``job``'s request (``SpecError`` for what SLURM cannot give)."""
        assert self.port is not None
        options = [f"--job-name={job.name}", f"--comment=dlsched:{job.id}", "--nodes=1"]
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
        ):
            if value:
                options.append(f"{flag}={value}")
        tasks = 1
        if 0 < job.gpus < 1:
            per_gpu = self._shards_per_gpu()
            if not per_gpu:
                raise SpecError("gpus", job.gpus, NO_SHARDS)
            options.append(f"--gres=shard:{max(1, math.floor(job.gpus * per_gpu))}")
        elif job.gpus >= 1:
            whole = int(job.gpus)
            options.append(f"--gres=gpu:{whole}")
            if job.distributed:
                tasks = whole
        options.append(f"--ntasks-per-node={tasks}")
        options.append(f"--cpus-per-task={max(1, math.ceil(job.cpus / tasks))}")
        if job.mem:
            options.append(f"--mem={max(1, math.ceil(job.mem / 2**20))}M")
        if job.time_limit is not None:
            seconds = max(1, math.ceil(job.time_limit))
            options.append(f"--time={seconds // 60}:{seconds % 60:02d}")
        if job.begin is not None:
            # SLURM decides when its jobs start: it holds this one until then (--begin)
            moment = datetime.fromtimestamp(math.ceil(job.begin))
            options.append(f"--begin={moment.strftime('%Y-%m-%dT%H:%M:%S')}")
        options.append(f"--nice={nice_for(job.priority)}")
        return options + self.extra

    # -- cancel, reap, close ------------------------------------------------------------------

    def launch(self, job: JobInfo) -> None:
        # never called for SLURM jobs: the policy starts nothing, the monitor submits
        return None

    def cancel(self, job: JobInfo) -> None:
        self.monitor.cancel(job)

    def reap(self, job: JobInfo) -> None:
        self.monitor.reap(job)

    def before_reap(self) -> None:
        # take over the jobs of a participant that went away first, so their SLURM jobs
        # are not counted lost when their leases are reaped
        self.monitor.adopt()

    def close(self) -> None:
        self.monitor.close()


def _gres_counts(gres: str) -> dict[str, int]:
    """``"gpu:a100:4(S:0-1),shard:32"`` -> ``{"gpu": 4, "shard": 32}``."""
    counts: dict[str, int] = {}
    if gres in ("", "(null)"):
        return counts
    for item in re.split(r",(?![^(]*\))", gres):
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = item.split(":")
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        counts[parts[0]] = counts.get(parts[0], 0) + int(count)
    return counts


__all__ = ["SlurmBackend", "SlurmPoolInfo", "SlurmPolicy", "SlurmUnavailable", "nice_for"]
